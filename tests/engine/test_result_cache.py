"""The result cache: a page seen again is answered without the model, exactly as it was the first time."""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from service.core import preparation
from service.core.errors import HtmllmError
from service.core.preparation import Prepared, PreprocessError
from service.engine.engine import Engine
from service.engine.result_cache import CachedRow, ResultCache, cache_key
from service.engine.types import (
    DeadlineExceededError,
    Document,
    EngineConfig,
    EngineObserver,
    TooManyTokensError,
)
from tests.engine.conftest import hold_first_prepare, slow_runner
from tests.factories.pages import make_pages


class Hits(EngineObserver):
    def __init__(self) -> None:
        self.hits = 0
        self.batched = 0

    def cache_hit(self) -> None:
        self.hits += 1

    def batch_done(self, stats: object) -> None:
        self.batched += getattr(stats, "documents", 0)


def _counting_prune(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = preparation.prune_document

    def counted(html: str | bytes, encoding: str | None) -> str:
        calls[0] += 1
        return real(html, encoding)

    monkeypatch.setattr(preparation, "prune_document", counted)
    return calls


async def test_a_repeated_page_skips_the_model_and_gets_the_same_answer(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pages = make_pages(6, seed=21, max_words=80)
    calls = _counting_prune(monkeypatch)
    observer = Hits()
    config = EngineConfig(result_cache_documents=100)
    async with (
        Engine.from_checkpoint(tiny_checkpoint, config) as cached,
        Engine.from_checkpoint(tiny_checkpoint) as plain,
    ):
        cached.observer = observer
        fresh = await plain.embed(pages, normalize=False)
        first = await cached.embed(pages, normalize=False)
        pruned_once = calls[0]
        again = await cached.embed([*reversed(pages), pages[0]], normalize=True, heads=["quality"])
    assert pruned_once == 2 * len(pages)  # each engine pruned each page once
    assert calls[0] == pruned_once and observer.hits == len(pages) + 1
    assert observer.batched == len(pages)  # only the first call reached the model
    for a, b in zip(fresh, first, strict=True):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-5)
        assert a.tokens == b.tokens and a.truncated == b.truncated
    for a, b in zip(reversed(first), again[:-1], strict=True):
        np.testing.assert_allclose(a.embedding / np.linalg.norm(a.embedding), b.embedding, atol=1e-6)
        assert b.scores == {"quality": a.scores["quality"]} and b.tokens == a.tokens
        assert b.timings.inference_s == 0.0 and b.timings.prune_s == 0.0


async def test_answers_do_not_share_memory_with_the_cache(tiny_checkpoint: Path) -> None:
    page = make_pages(1, seed=3)[0]
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(result_cache_documents=4)) as engine:
        (first,) = await engine.embed([page], normalize=False)
        kept = first.embedding.copy()
        first.embedding[:] = 0.0
        (second,) = await engine.embed([page], normalize=False)
        second.embedding[:] *= 2
        (third,) = await engine.embed([page], normalize=False)
    np.testing.assert_array_equal(third.embedding, kept)


async def test_the_key_is_the_exact_input_and_policy(tiny_checkpoint: Path) -> None:
    long_page = make_pages(1, min_words=400, max_words=400, seed=4)[0]
    config = EngineConfig(max_length=64, result_cache_documents=10)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        (cut,) = await engine.embed([long_page])
        assert cut.truncated
        # A truncated answer is not an answer for a caller who refuses truncation.
        with pytest.raises(TooManyTokensError):
            await engine.embed([long_page], truncate=False)
    text = "<p>Žluťoučký kůň</p>"
    assert cache_key(Document(html=text), True) != cache_key(Document(html=text.encode()), True)
    assert cache_key(Document(html=text.encode("cp1250"), encoding="windows-1250"), True) != cache_key(
        Document(html=text.encode("cp1250")), True
    )
    assert cache_key(Document(html=text), True) != cache_key(Document(html=text), False)
    assert cache_key(Document(html=text, id="a"), True) == cache_key(Document(html=text, id="b"), True)


def test_least_recently_used_rows_go_first() -> None:
    cache = ResultCache(2)
    rows = {k: CachedRow.of(np.zeros(2, np.float32), {}, 1, False) for k in (b"a", b"b", b"c")}
    cache.put(b"a", rows[b"a"])
    cache.put(b"b", rows[b"b"])
    assert cache.get(b"a") is rows[b"a"]  # a is now the most recent
    cache.put(b"c", rows[b"c"])
    assert cache.get(b"b") is None and cache.get(b"a") is rows[b"a"] and len(cache) == 2
    with pytest.raises(ValueError):
        ResultCache(0)
    with pytest.raises(ValueError):
        EngineConfig(result_cache_documents=-1)


async def test_copies_in_flight_share_one_forward_pass(tiny_checkpoint: Path) -> None:
    page = make_pages(1, seed=8)[0]
    observer = Hits()
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(result_cache_documents=8)) as engine:
        engine.observer = observer
        results = await asyncio.gather(*(engine.embed([page]) for _ in range(8)))
    assert observer.batched == 1 and observer.hits == 7
    for (result,) in results[1:]:
        np.testing.assert_array_equal(result.embedding, results[0][0].embedding)


async def test_a_failed_first_copy_leaves_the_others_to_embed_it(tiny_checkpoint: Path) -> None:
    """The caller whose copy runs gives up (its deadline passes): the ones waiting on it still get
    their answer, from a forward pass of their own."""
    runner, ckpt = slow_runner(tiny_checkpoint, delay_s=0.3)
    config = EngineConfig(result_cache_documents=8, max_batch_requests=1)
    engine = Engine(runner, ckpt.tokenizer, ckpt.meta, config)  # type: ignore[attr-defined]
    page = make_pages(1, seed=9)[0]
    async with engine:
        impatient = asyncio.ensure_future(engine.embed([page], deadline=time.monotonic() + 0.1))
        await asyncio.sleep(0.05)  # the impatient copy has claimed the page
        patient = asyncio.ensure_future(engine.embed([page]))
        with pytest.raises(DeadlineExceededError):
            await impatient
        (result,) = await patient
        assert engine.queue_size == 0
    assert result.tokens > 0 and result.embedding.shape == (ckpt.meta.embedding_dim,)  # type: ignore[attr-defined]


async def _when_copies_wait(engine: Engine, monkeypatch: pytest.MonkeyPatch, copies: int) -> None:
    """Return once `copies` calls have asked the cache for the page (all but the first then wait)."""
    cache = engine._cache
    assert cache is not None
    asked = [0]
    real = cache.settled

    async def counted(key: bytes) -> CachedRow | HtmllmError | None:
        asked[0] += 1
        return await real(key)

    monkeypatch.setattr(cache, "settled", counted)
    for _ in range(3000):  # a bound, not a timing
        if asked[0] == copies:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{asked[0]} of {copies} copies reached the cache")


async def test_copies_of_a_page_that_fails_get_its_failure_without_trying_again(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each copy waiting for a page whose attempt failed tried it in turn: a page failing at the
    preprocessing time limit (20 s) cost the k-th copy k times the limit, or its deadline."""
    config = EngineConfig(result_cache_documents=8, preprocess_workers=4)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        held = hold_first_prepare(engine, monkeypatch)
        real = engine._preprocessing._prepare

        def failing(doc: Document, truncate: bool) -> Prepared:
            real(doc, truncate)  # held, counted
            raise PreprocessError("pruning this page took more than 20 s")

        monkeypatch.setattr(engine._preprocessing, "_prepare", failing)
        page = make_pages(1, seed=11)[0]
        copies = [asyncio.ensure_future(engine.embed([page])) for _ in range(4)]
        try:
            await _when_copies_wait(engine, monkeypatch, 4)
        finally:
            held.release.set()
        outcomes = await asyncio.gather(*copies, return_exceptions=True)
        assert held.calls == 1, "the copies prepared the page again"
        assert all(isinstance(o, PreprocessError) and "20 s" in str(o) for o in outcomes), outcomes
        assert len({id(o) for o in outcomes}) == 4  # each its own exception, not one raised four times
        assert engine.queue_size == 0 and len(engine._cache or []) == 0  # a failure is never kept
        (result,) = await engine.embed_settled([page])  # a later call tries the page again
        assert isinstance(result, PreprocessError) and held.calls == 2


async def test_copies_of_a_page_over_the_limit_are_each_refused_in_their_own_name(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(result_cache_documents=8, preprocess_workers=4, max_length=64)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        held = hold_first_prepare(engine, monkeypatch)
        long = make_pages(1, min_words=400, max_words=400)[0]
        copies = [
            asyncio.ensure_future(engine.embed([Document(long, id=name)], truncate=False)) for name in "abc"
        ]
        try:
            await _when_copies_wait(engine, monkeypatch, 3)
        finally:
            held.release.set()
        outcomes = await asyncio.gather(*copies, return_exceptions=True)
    assert held.calls == 1
    for name, outcome in zip("abc", outcomes, strict=True):
        assert isinstance(outcome, TooManyTokensError) and f"document {name!r} has" in outcome.message


async def test_only_a_failure_of_the_page_itself_reaches_the_waiters() -> None:
    cache = ResultCache(4)
    for failure in (PreprocessError("the page"), None):
        cache.claim(b"k")
        waiting = asyncio.ensure_future(cache.settled(b"k"))
        await asyncio.sleep(0)
        cache.release(b"k", failure)
        assert await waiting is failure  # None: the waiter embeds the page itself
    assert len(cache) == 0 and await cache.settled(b"k") is None


def test_a_kept_row_owns_its_arrays() -> None:
    """A batch's rows are views of one buffer: the kept copy must not pin (or share) it."""
    batch = np.arange(12, dtype=np.float32).reshape(3, 4)
    probs = np.ones((3, 2), dtype=np.float32)
    kept = CachedRow.of(batch[1], {"kind": probs[1]}, tokens=5, truncated=False)
    assert kept.values.base is None and kept.values.dtype == np.float32
    assert not np.shares_memory(kept.embedding, batch) and not np.shares_memory(kept.scores["kind"], probs)
    np.testing.assert_array_equal(kept.embedding, batch[1])
    assert (kept.tokens, kept.truncated) == (5, False)


def test_a_row_is_one_buffer_read_back_as_it_was_given() -> None:
    """Each head's output comes back with its shape (a (C,) row of probabilities, a () value), whatever
    the order of the heads; the rows of one model share one layout object."""
    scores = {"kind": np.array([0.25, 0.75], np.float32), "quality": np.array(0.5, np.float32)}
    row = CachedRow.of(np.arange(4, dtype=np.float32), scores, tokens=300, truncated=True)
    assert row.values.shape == (4 + 2 + 1,)
    np.testing.assert_array_equal(row.embedding, np.arange(4, dtype=np.float32))
    assert row.score("kind").shape == (2,) and row.score("quality").shape == ()
    assert row.scores.keys() == scores.keys()
    for name, value in scores.items():
        np.testing.assert_array_equal(row.score(name), value)
    with pytest.raises(KeyError):
        row.score("missing")
    other = CachedRow.of(np.zeros(4, np.float32), dict(scores), tokens=3, truncated=False)
    assert other.layout is row.layout


def test_an_entry_costs_its_floats_and_a_few_hundred_bytes() -> None:
    """The module's estimate (4 bytes a float, about 300 more), for the bundled model's shape: 384
    dimensions, heads of 6, 3 and 7 classes. An array per head in a dict had cost 2,459 bytes, 860 past
    the floats, where the docstring said 100."""
    dim, heads, entries = 384, {"language": 6, "page_kind": 3, "schema_type": 7}, 2000
    made = [
        (
            np.random.rand(dim).astype(np.float32),
            {n: np.random.rand(c).astype(np.float32) for n, c in heads.items()},
        )
        for _ in range(4)
    ]
    cache = ResultCache(entries)
    keys = [os.urandom(16) for _ in range(entries)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index, key in enumerate(keys):
            embedding, scores = made[index % len(made)]
            cache.put(key, CachedRow.of(embedding, scores, 300, False))
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / entries
    finally:
        tracemalloc.stop()
    floats = 4 * (dim + sum(heads.values()))
    # (1,860-1,930 bytes measured, as numpy's version and the threads tracemalloc sees vary: bounded
    # well under the 2,459 of an array per head.)
    assert floats < per_entry < floats + 600
