"""The Engine end to end: raw HTML in, the same results however documents are batched; load behaviour."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from service.core.errors import ErrorCode, HtmllmError
from service.core.preparation import PreprocessError, count_limit
from service.engine.batcher import BatchRow
from service.engine.engine import Engine
from service.engine.loading import check_device
from service.engine.types import (
    BatchStats,
    DeadlineExceededError,
    Document,
    DocumentResult,
    EngineConfig,
    EngineObserver,
    NotReadyError,
    OverloadedError,
    ShuttingDownError,
    TooManyDocumentsError,
    TooManyTokensError,
    UnknownHeadError,
)
from tests.engine.conftest import SlowTorchRunner, make_pages, slow_runner
from tests.factories.drain import RecordingDrain


class RecordingObserver(EngineObserver):
    def __init__(self) -> None:
        self.batches: list[BatchStats] = []
        self.stages: dict[str, int] = {}
        self.queue_sizes: list[int] = []
        self.done: list[tuple[int, int]] = []
        self.failed: list[tuple[ErrorCode, int]] = []
        self.skipped = 0

    def documents_skipped(self, documents: int) -> None:
        assert documents > 0
        self.skipped += documents

    def batch_done(self, stats: BatchStats) -> None:
        self.batches.append(stats)

    def stage(self, name: str, seconds: float) -> None:
        assert seconds >= 0
        self.stages[name] = self.stages.get(name, 0) + 1

    def queue_size(self, documents: int) -> None:
        self.queue_sizes.append(documents)

    def documents_done(self, documents: int, tokens: int) -> None:
        self.done.append((documents, tokens))

    def documents_failed(self, code: ErrorCode, documents: int) -> None:
        self.failed.append((code, documents))


def slow_engine(checkpoint: Path, delay_s: float = 0.2, **config: object) -> tuple[Engine, SlowTorchRunner]:
    runner, ckpt = slow_runner(checkpoint, delay_s)
    engine = Engine(runner, ckpt.tokenizer, ckpt.meta, EngineConfig(**config))  # type: ignore[attr-defined,arg-type]
    return engine, runner


async def test_batch_of_n_equals_n_concurrent_single_calls(tiny_checkpoint: Path, pages: list[str]) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_batch_requests=8)) as engine:
        batched = await engine.embed(pages)
        singles = await asyncio.gather(*(engine.embed([p]) for p in pages))
        one_by_one = [(await engine.embed([p]))[0] for p in pages[:4]]
    assert len({r.tokens for r in batched}) > 5  # lengths really vary
    for a, (b,) in zip(batched, singles, strict=True):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-5, rtol=0)
        assert a.tokens == b.tokens
        assert a.scores["quality"] == pytest.approx(b.scores["quality"], abs=1e-5)
    for a, c in zip(batched, one_by_one, strict=False):
        np.testing.assert_allclose(a.embedding, c.embedding, atol=1e-5, rtol=0)


async def test_results_come_back_in_input_order_with_ids_and_scores(tiny_checkpoint: Path) -> None:
    long_first = make_pages(6, seed=2, min_words=50, max_words=60)[:3] + make_pages(3, seed=3, max_words=2)
    docs = [Document(html=p, id=f"d{i}") for i, p in enumerate(long_first)]
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        results = await engine.embed(docs)
        alone = [(await engine.embed([d]))[0] for d in docs]
    assert [r.id for r in results] == [f"d{i}" for i in range(6)]
    for r, a in zip(results, alone, strict=True):
        np.testing.assert_allclose(r.embedding, a.embedding, atol=1e-5, rtol=0)
        assert np.linalg.norm(r.embedding) == pytest.approx(1.0, abs=1e-5)
        assert set(r.scores["page_type"]) == {"article", "listing", "other"}
        assert sum(r.scores["page_type"].values()) == pytest.approx(1.0, abs=1e-5)  # type: ignore[union-attr]
        assert isinstance(r.scores["quality"], float)
        assert r.timings.total_s >= r.timings.inference_s > 0


async def test_bytes_in_a_declared_encoding_embed_like_the_text(tiny_checkpoint: Path) -> None:
    html = "<html><body><p>Praha město počasí úterý řeka</p></body></html>"
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        from_text, from_bytes = await engine.embed(
            [html, Document(html=html.encode("windows-1250"), encoding="windows-1250")]
        )
        pruned, tokens, exact = await engine.preprocess(html)
    np.testing.assert_allclose(from_text.embedding, from_bytes.embedding, atol=1e-6)
    assert "<script>" not in pruned and "Praha" in pruned and tokens == from_text.tokens and exact


async def test_preprocess_counts_a_huge_page_only_so_far(tiny_checkpoint: Path) -> None:
    """Past 16 times the model's max length the count stops (a whole count of megabytes of tokens took
    seconds and gigabytes): the page has at least that many, and says so."""
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_length=32)) as engine:
        limit = count_limit(32)
        ten, twenty = [(await engine.preprocess("<p>" + "x " * n + "</p>")).tokens for n in (10, 20)]
        per_word = (twenty - ten) // 10
        just_under = await engine.preprocess("<p>" + "x " * (10 + (limit - ten) // per_word) + "</p>")
        huge = await engine.preprocess("<p>" + "x " * 200_000 + "</p>")
    assert just_under.tokens_exact and just_under.tokens <= limit
    assert not huge.tokens_exact and limit < huge.tokens <= 8 * limit  # a token per character at most
    assert huge.html.count("x") == 200_000  # the pruned page is whole


async def test_head_selection_and_unnormalised_output(tiny_checkpoint: Path, pages: list[str]) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        (only,) = await engine.embed(pages[:1], heads=["quality"], normalize=False)
        (none,) = await engine.embed(pages[:1], heads=[])
        with pytest.raises(UnknownHeadError) as info:
            await engine.embed(pages[:1], heads=["sentiment"])
        with pytest.raises(UnknownHeadError) as huge:  # (a client's megabytes are not echoed back)
            await engine.embed(pages[:1], heads=["x" * 1_000_000] + [f"h{i}" for i in range(2400)])
    assert set(only.scores) == {"quality"} and none.scores == {}
    assert info.value.code is ErrorCode.UNKNOWN_HEAD and "'sentiment'" in str(info.value)
    assert len(str(huge.value)) < 400 and "(2401 in all)" in str(huge.value)
    np.testing.assert_allclose(only.embedding / np.linalg.norm(only.embedding), none.embedding, atol=1e-6)


async def test_truncation_policy(tiny_checkpoint: Path) -> None:
    long_page = make_pages(1, min_words=400, max_words=400)[0]
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_length=64)) as engine:
        (cut,) = await engine.embed([long_page])
        with pytest.raises(TooManyTokensError):
            await engine.embed([long_page], truncate=False)
        assert engine.queue_size == 0
    assert cut.truncated and cut.tokens == 64


async def test_bad_input_is_a_typed_error_not_a_crash(tiny_checkpoint: Path) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        with pytest.raises(HtmllmError) as info:
            await engine.embed([12345])  # type: ignore[list-item]
        assert info.value.code is ErrorCode.VALIDATION
        garbage = await engine.embed([bytes(range(256)) * 20, b"", "<"])
        assert len(garbage) == 3 and all(r.tokens >= 2 for r in garbage)
        assert await engine.embed([]) == []


async def test_lifecycle_errors(tiny_checkpoint: Path) -> None:
    engine = Engine.from_checkpoint(tiny_checkpoint)
    with pytest.raises(NotReadyError):
        await engine.embed(["<p>x</p>"])
    await engine.start()
    await engine.warmup()
    await engine.stop()
    with pytest.raises(ShuttingDownError):
        await engine.embed(["<p>x</p>"])


async def test_full_queue_is_refused_immediately(tiny_checkpoint: Path, pages: list[str]) -> None:
    engine, _ = slow_engine(tiny_checkpoint, delay_s=0.3, max_queue_documents=6, max_batch_requests=2)
    async with engine:
        first = asyncio.create_task(engine.embed(pages[:6]))
        await asyncio.sleep(0.05)
        assert engine.queue_size == 6
        started = time.monotonic()
        with pytest.raises(OverloadedError):
            await engine.embed(pages[6:7])
        # At once, not after the queue moved (0.3 s): 0.25 leaves room for a machine busy with other tests.
        assert time.monotonic() - started < 0.25
        with pytest.raises(TooManyDocumentsError):
            await engine.embed(pages[:7])
        assert len(await first) == 6
        assert len(await engine.embed(pages[6:7])) == 1


async def test_stop_with_drain_answers_every_accepted_document(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    engine, _ = slow_engine(tiny_checkpoint, delay_s=0.1, max_batch_requests=3)
    await engine.start()
    calls = [asyncio.create_task(engine.embed(pages[i : i + 2])) for i in range(0, 12, 2)]
    await asyncio.sleep(0.02)
    stopping = asyncio.create_task(engine.stop(drain=True))
    await asyncio.sleep(0)
    with pytest.raises(ShuttingDownError):
        await engine.embed(pages[:1])
    await stopping
    results = [await c for c in calls]
    assert all(len(r) == 2 for r in results)


async def test_stop_without_drain_fails_the_queue_with_a_typed_error(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    engine, _ = slow_engine(tiny_checkpoint, delay_s=0.2, max_batch_requests=2)
    await engine.start()
    call = asyncio.create_task(engine.embed(pages[:8]))
    await asyncio.sleep(0.05)
    await engine.stop(drain=False)
    with pytest.raises(ShuttingDownError):
        await call


async def test_cancelled_callers_are_skipped(tiny_checkpoint: Path, pages: list[str]) -> None:
    """Events, not sleeps, order it: with a 0.2 s pass and a cancel 0.2 s in, a loaded machine ran the
    blocker's pass to its end first and a cancelled document went into the next one."""
    observer = RecordingObserver()
    engine, runner = slow_engine(tiny_checkpoint, delay_s=0.0, max_batch_requests=2, max_wait_ms=0)
    engine.observer = observer
    release = threading.Event()  # every forward pass waits for it: the blocker's holds the model
    entered = threading.Event()
    real_run = runner.run

    def gated_run(prepared: object) -> object:
        entered.set()
        release.wait(30)
        return real_run(prepared)  # type: ignore[arg-type]

    runner.run = gated_run  # type: ignore[method-assign,assignment]
    async with engine:
        assert engine._batcher is not None
        queued = 0
        real_submit = engine._batcher.submit

        def submit(ids: list[int], *, deadline: float | None) -> asyncio.Future[BatchRow]:
            nonlocal queued
            queued += 1
            return real_submit(ids, deadline=deadline)

        engine._batcher.submit = submit  # type: ignore[method-assign]
        blocker = asyncio.create_task(engine.embed(pages[:2]))  # occupies the model
        waited = time.monotonic() + 30
        while not entered.is_set() and time.monotonic() < waited:  # its pass holds the model
            await asyncio.sleep(0.01)
        doomed = asyncio.create_task(engine.embed(pages[2:14]))
        while queued < 14 and time.monotonic() < waited:  # all tokenized and queued behind the blocker
            await asyncio.sleep(0.01)
        doomed.cancel()
        # Its cancellation handled before any pass goes on (a pass formed behind the blocker's checks
        # for cancelled documents when it is about to run).
        await asyncio.gather(doomed, return_exceptions=True)
        release.set()
        await blocker
        kept = await engine.embed(pages[14:16])
    assert len(kept) == 2
    ran = sum(b.documents for b in observer.batches) - 4  # less the blocker's and the kept call's
    skipped = observer.skipped
    # None of the 12 cancelled documents reached the model: those queued were dropped when their batch
    # was formed or was about to run (any still being tokenized never entered the queue).
    assert ran == 0 and 1 <= skipped <= 12
    assert engine.queue_size == 0


async def test_skipped_documents_are_reported_when_no_batch_follows(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    # Every queued document leaves and nothing arrives after them: no later batch could carry the count.
    observer = RecordingObserver()
    engine, _ = slow_engine(tiny_checkpoint, delay_s=0.3, max_batch_requests=2, max_wait_ms=0)
    engine.observer = observer
    async with engine:
        blocker = asyncio.create_task(engine.embed(pages[:2]))
        await asyncio.sleep(0.05)
        doomed = asyncio.create_task(engine.embed(pages[2:8]))
        await asyncio.sleep(0.1)  # queued behind the running batch
        doomed.cancel()
        await blocker
        for _ in range(100):  # the former drops them as it takes its next window
            if observer.skipped:
                break
            await asyncio.sleep(0.01)
        assert sum(b.documents for b in observer.batches) == 2  # only the blocker's documents ran
        assert 1 <= observer.skipped <= 6
        assert engine.queue_size == 0


async def test_deadlines(tiny_checkpoint: Path, pages: list[str]) -> None:
    engine, _ = slow_engine(tiny_checkpoint, delay_s=0.3, max_batch_requests=2)
    async with engine:
        with pytest.raises(DeadlineExceededError):
            await engine.embed(pages[:1], deadline=time.monotonic() - 1)
        with pytest.raises(DeadlineExceededError) as info:
            await engine.embed(pages[:6], deadline=time.monotonic() + 0.1)
        assert info.value.code is ErrorCode.TIMEOUT
        assert engine.queue_size == 0


async def test_batch_n_plus_one_is_prepared_while_n_runs(tiny_checkpoint: Path, pages: list[str]) -> None:
    engine, runner = slow_engine(tiny_checkpoint, delay_s=0.2, max_batch_requests=4, max_wait_ms=500)
    async with engine:
        await engine.embed(pages[:12])
    runs = [n for what, _, n in runner.events if what == "run_start"]
    ends = [t for what, t, _ in runner.events if what == "run_end"]
    prepares = [t for what, t, _ in runner.events if what == "prepare"]
    # (Cut where padding costs more than a pass: not always into full batches.)
    assert sum(runs) == 12 and max(runs) <= 4 and len(runs) >= 3
    # The second batch was collated before the first forward pass ended.
    assert prepares[1] < ends[0]


async def test_preprocessing_never_runs_on_the_event_loop(tiny_checkpoint: Path, pages: list[str]) -> None:
    seen: set[str] = set()
    engine = Engine.from_checkpoint(tiny_checkpoint)
    original = engine._tokenizer.encode

    def spy(text: str, **kwargs):  # type: ignore[no-untyped-def]
        seen.add(threading.current_thread().name)
        return original(text, **kwargs)

    engine._tokenizer.encode = spy  # type: ignore[method-assign]
    async with engine:
        await engine.embed(pages[:6])
    assert seen and all(name.startswith("htmllm-preprocess") for name in seen)


async def test_observer_sees_batches_stages_queue_and_documents(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    observer = RecordingObserver()
    config = EngineConfig(max_batch_requests=5, max_batch_tokens=100_000)
    async with Engine.from_checkpoint(tiny_checkpoint, config, observer=observer) as engine:
        results = await engine.embed(pages[:10])
        with pytest.raises(UnknownHeadError):
            await engine.embed(pages[:1], heads=["nope"])
        with pytest.raises(TooManyTokensError):
            await engine.embed([make_pages(1, min_words=400, max_words=400)[0]], truncate=False)
    assert sum(b.documents for b in observer.batches) == 10
    assert all(b.documents <= 5 and b.padded_tokens >= b.tokens for b in observer.batches)
    assert sum(b.tokens for b in observer.batches) == sum(r.tokens for r in results)
    assert observer.stages == {name: 10 for name in ("prune", "tokenize", "queue", "inference", "total")}
    assert max(observer.queue_sizes) == 10 and observer.queue_sizes[-1] == 0
    assert observer.done == [(10, sum(r.tokens for r in results))]
    assert observer.failed == [(ErrorCode.TOO_MANY_TOKENS, 1)]


async def test_token_budget_caps_each_forward_pass(tiny_checkpoint: Path, pages: list[str]) -> None:
    observer = RecordingObserver()
    config = EngineConfig(max_batch_tokens=256, max_batch_requests=64)
    async with Engine.from_checkpoint(tiny_checkpoint, config, observer=observer) as engine:
        await engine.embed(pages)
    assert len(observer.batches) > 1
    assert all(b.padded_tokens <= 256 or b.documents == 1 for b in observer.batches)


async def test_settled_answers_each_document_alone(tiny_checkpoint: Path) -> None:
    """One page over the limit with truncation off fails alone; the others keep their results."""
    observer = RecordingObserver()
    short, too_long = make_pages(2, max_words=8), make_pages(1, min_words=400, max_words=400)[0]
    docs = [Document(html=short[0], id="a"), Document(html=too_long, id="b"), Document(html=short[1], id="c")]
    config = EngineConfig(max_length=64)
    async with Engine.from_checkpoint(tiny_checkpoint, config, observer=observer) as engine:
        first, failed, last = await engine.embed_settled(docs, truncate=False)
        alone = await engine.embed([docs[0], docs[2]])
        assert engine.queue_size == 0
    assert isinstance(failed, TooManyTokensError) and "'b'" in failed.message
    assert isinstance(first, DocumentResult) and isinstance(last, DocumentResult)
    assert (first.id, last.id) == ("a", "c")
    for got, want in zip((first, last), alone, strict=True):
        np.testing.assert_allclose(got.embedding, want.embedding, atol=1e-5, rtol=0)
        assert got.tokens == want.tokens
    assert observer.done[0] == (2, first.tokens + last.tokens)
    assert observer.failed == [(ErrorCode.TOO_MANY_TOKENS, 1)]


def _first_pass_only(runner: SlowTorchRunner) -> threading.Event:
    """Every forward pass after the first waits for the returned event (set it to let them go): at a
    deadline the first pass is done and the second is in a forward pass, however slow the machine."""
    release = threading.Event()
    real_run = runner.run

    def run(prepared: object) -> object:
        if any(what == "run_end" for what, _, _ in runner.events):
            release.wait(30)
        return real_run(prepared)

    runner.run = run  # type: ignore[method-assign]
    return release


async def test_settled_keeps_what_was_embedded_when_the_deadline_passes(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    # Passes of at most 2 documents, 1 s each: at 1.5 s the first pass is done, the second running.
    engine, runner = slow_engine(tiny_checkpoint, delay_s=0.0, max_batch_requests=2, max_wait_ms=0)
    release = _first_pass_only(runner)
    async with engine:
        try:
            outcomes = await engine.embed_settled(pages[:6], deadline=time.monotonic() + 1.5)
        finally:
            release.set()
        assert engine.queue_size == 0
        late = [o for o in outcomes if isinstance(o, HtmllmError)]
        done = [o for o in outcomes if isinstance(o, DocumentResult)]
        assert done and late, outcomes
        for error in late:
            assert error.code is ErrorCode.TIMEOUT
            assert re.fullmatch(
                r"the deadline passed while the document was (queued|in a forward pass) \(\d+\.\d s\)",
                error.message,
            ), error.message
        assert any("in a forward pass" in error.message for error in late)
        index = next(i for i, o in enumerate(outcomes) if o is done[0])
        (again,) = await engine.embed([pages[index]])  # the engine goes on serving
    np.testing.assert_allclose(again.embedding, done[0].embedding, atol=1e-5)


async def test_a_passed_deadline_says_where_the_documents_were(
    tiny_checkpoint: Path, pages: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    engine, runner = slow_engine(tiny_checkpoint, delay_s=0.0, max_batch_requests=2, max_wait_ms=0)
    release = _first_pass_only(runner)
    async with engine:
        with (
            caplog.at_level(logging.WARNING, logger="service.engine.engine"),
            pytest.raises(DeadlineExceededError) as info,
        ):
            try:
                await engine.embed(pages[:6], deadline=time.monotonic() + 1.5)
            finally:
                release.set()
    message = info.value.message
    assert re.match(
        r"the deadline passed \d+\.\d s after the call, before the documents were embedded: ", message
    )
    assert re.search(r"\b[1-9] done\b", message), message
    assert re.search(r"in a forward pass \(longest \d+\.\d s\)", message), message
    assert any("deadline passed" in record.message for record in caplog.records)


async def test_settled_turns_an_unexpected_failure_into_an_internal_error(
    tiny_checkpoint: Path, pages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        prepare = engine._preprocessing._prepare

        def broken(doc: Document, truncate: bool) -> object:
            if doc.id == "bad":
                raise RuntimeError("an invariant broke")
            return prepare(doc, truncate)

        monkeypatch.setattr(engine._preprocessing, "_prepare", broken)
        good, bad = await engine.embed_settled([Document(pages[0], id="ok"), Document(pages[1], id="bad")])
        with pytest.raises(UnknownHeadError):  # what is wrong with the call still raises
            await engine.embed_settled(pages[:1], heads=["nope"])
    assert isinstance(good, DocumentResult) and good.id == "ok"
    assert isinstance(bad, HtmllmError) and bad.code is ErrorCode.INTERNAL
    assert "RuntimeError: an invariant broke" in bad.message


async def test_settled_documents_get_shutting_down_when_the_engine_stops_under_them(
    tiny_checkpoint: Path, pages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1))
    await engine.start()
    prepare = engine._preprocessing._prepare

    def slow(doc: Document, truncate: bool) -> object:
        time.sleep(0.3)
        return prepare(doc, truncate)

    monkeypatch.setattr(engine._preprocessing, "_prepare", slow)
    # One document is being preprocessed, the other waits for the pool when the engine stops.
    call = asyncio.create_task(engine.embed_settled(pages[:2]))
    await asyncio.sleep(0.1)
    await engine.stop(drain=False)
    outcomes = await call
    assert [type(o) for o in outcomes] == [ShuttingDownError, ShuttingDownError], outcomes
    assert engine.queue_size == 0


async def test_process_pool_prepares_what_the_threads_prepare(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    """Pruning holds the GIL, so a GPU is fed by processes: same ids, same embeddings, same errors."""
    from service.core.prune import NestingTooDeepError

    too_long = make_pages(1, min_words=400, max_words=400)[0]
    czech = "<p>Příliš žluťoučký kůň úpěl ďábelské ódy</p>".encode("windows-1250")
    docs = [*pages[:6], Document(html=czech, encoding="windows-1250")]
    config = EngineConfig(preprocess_pool="process", preprocess_workers=2, max_length=64)
    async with (
        Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_length=64)) as threads,
        Engine.from_checkpoint(tiny_checkpoint, config) as processes,
    ):
        assert processes._preprocessing._processes is not None
        want = await threads.embed(docs)
        got = await processes.embed(docs)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-6, rtol=0)
            assert (a.tokens, a.truncated) == (b.tokens, b.truncated)
            assert a.timings.prune_s > 0 and a.timings.tokenize_s > 0
        assert await processes.preprocess(czech.decode("windows-1250")) == await threads.preprocess(docs[-1])
        refused, deep, fine = await processes.embed_settled(
            [Document(too_long, id="long"), "<div>" * 10_000 + "x", make_pages(1, max_words=5)[0]],
            truncate=False,
        )
        assert isinstance(refused, TooManyTokensError) and "'long'" in refused.message
        assert isinstance(deep, NestingTooDeepError) and deep.code is ErrorCode.PREPROCESS_FAILED
        assert isinstance(fine, DocumentResult)


async def test_a_preprocessing_process_killed_while_idle_is_replaced_unblamed(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        (before,) = await engine.embed(pages[:1])
        assert engine._preprocessing._processes is not None
        (worker,) = engine._preprocessing._processes._idle
        worker.process.kill()  # the OOM killer picks an idle worker
        worker.process.join()
        (after,) = await engine.embed(pages[:1])  # on a fresh worker, not "crashed"
    np.testing.assert_allclose(after.embedding, before.embedding, atol=1e-6)


def _big_page() -> str:
    """14.5 MB of paragraphs, within the pruner's budgets: about 0.5 s of pruning on the 2-core VM."""
    return "<html><body>" + ("<p>" + "lorem ipsum dolor " * 40 + "</p>\n") * 20_000 + "</body></html>"


async def test_a_page_past_the_time_limit_fails_alone(tiny_checkpoint: Path, pages: list[str]) -> None:
    """A page the pre-checks misjudge must not hold a worker for ever: past the limit its worker is
    killed, the page is `preprocess_failed`, and the engine goes on serving."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=2, preprocess_timeout_s=0.1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        slow, fine = await engine.embed_settled([_big_page(), pages[0]])  # 15 MB: seconds of pruning
        assert isinstance(slow, PreprocessError) and slow.code is ErrorCode.PREPROCESS_FAILED
        assert "took more than 0.1 s" in slow.message
        assert isinstance(fine, DocumentResult)
        (again,) = await engine.embed(pages[:1])
        np.testing.assert_allclose(again.embedding, fine.embedding, atol=1e-6)


async def test_a_preprocessing_process_that_cannot_start_is_a_server_error(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    """Not the page's fault: `not_ready` (503, retryable), not `preprocess_failed` (422); it had been
    `internal_error` (500), which no client retries."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        processes = engine._preprocessing._processes
        assert processes is not None
        (worker,) = processes._idle
        worker.process.kill()
        worker.process.join()
        preload, limit, initializer, _ = processes._worker_args
        processes._worker_args = (preload, limit, initializer, ("{not a tokenizer",))
        with pytest.raises(HtmllmError, match="a preprocessing process could not start") as failed:
            await engine.embed(pages[:1])
        assert failed.value.code is ErrorCode.NOT_READY


async def _stuck_workers(engine: Engine, pages: list[str]) -> list[asyncio.Task[list[DocumentResult]]]:
    """Two pages in work on the engine's two preprocessing processes, both stopped (a parse stuck in C
    code looks like this from outside)."""
    import os
    import signal

    processes = engine._preprocessing._processes
    assert processes is not None
    stuck = [asyncio.create_task(engine.embed([page])) for page in pages]
    while len(processes._busy) < len(pages):
        await asyncio.sleep(0.01)
    for worker in processes._busy:
        assert worker.process.pid is not None
        os.kill(worker.process.pid, signal.SIGSTOP)
    return stuck


async def test_stop_does_not_wait_for_a_stuck_page(tiny_checkpoint: Path) -> None:
    """It killed the threads' pool first, which waited on the stuck processes up to their time limit
    (for ever without one) and answered the pages as their own failure."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=2, preprocess_timeout_s=None)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await engine.start()
    stuck = await _stuck_workers(engine, [_big_page(), _big_page()])
    await asyncio.wait_for(engine.stop(drain=False), 60)
    for task in stuck:
        with pytest.raises(ShuttingDownError):
            await task
    engine.close()


async def test_a_cancelled_stop_leaves_no_process_behind(tiny_checkpoint: Path) -> None:
    """A server bounds its wait for `stop`; the next `stop` must still end the workers."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=2, preprocess_timeout_s=None)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await engine.start()
    processes = engine._preprocessing._processes
    assert processes is not None
    stuck = await _stuck_workers(engine, [_big_page(), _big_page()])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.stop(drain=True), 0.5)  # waits for the stuck pages: cancelled
    await asyncio.wait_for(engine.stop(drain=False), 60)
    assert processes.live_workers == 0 and engine._preprocessing._processes is None
    await asyncio.gather(*stuck, return_exceptions=True)
    engine.close()


async def test_a_cached_page_is_answered_while_pages_are_stuck(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    """Hashing a page for the result cache ran on the threads that wait on the processes."""
    config = EngineConfig(
        preprocess_pool="process", preprocess_workers=2, preprocess_timeout_s=None, result_cache_documents=8
    )
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        (first,) = await engine.embed(pages[:1])
        two = [f"<title>{n}</title>" + _big_page() for n in range(2)]  # copies would share one worker
        stuck = await _stuck_workers(engine, two)
        (again,) = await asyncio.wait_for(engine.embed(pages[:1]), 30)
        np.testing.assert_allclose(again.embedding, first.embedding, atol=0)
        await engine.stop(drain=False)
        await asyncio.gather(*stuck, return_exceptions=True)


async def test_a_page_that_crashes_its_process_fails_alone(tiny_checkpoint: Path, pages: list[str]) -> None:
    import os
    import signal

    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        processes = engine._preprocessing._processes
        assert processes is not None
        crashed = asyncio.create_task(engine.embed([_big_page()]))
        while not processes._busy:
            await asyncio.sleep(0.01)
        (worker,) = processes._busy
        assert worker.process.pid is not None
        os.kill(worker.process.pid, signal.SIGSEGV)  # a segfault in the parser (SIGKILL: `not_ready`)
        with pytest.raises(PreprocessError, match=r"crashed its preprocessing process \(exit code -11\)"):
            await crashed
        (result,) = await engine.embed(pages[:1])
        assert result.tokens > 2


async def test_preprocess_calls_are_bounded_by_the_queue(
    tiny_checkpoint: Path, pages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The debugging route must not let a flood pile pages up in the workers' queue."""
    from service.engine import preprocessing as preprocessing_module

    real = preprocessing_module.preprocess

    def slow(*args: object) -> tuple[str, int]:
        time.sleep(0.3)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(preprocessing_module, "preprocess", slow)
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_queue_documents=2)) as engine:
        first = asyncio.gather(engine.preprocess(pages[0]), engine.preprocess(pages[1]))
        await asyncio.sleep(0.05)
        assert engine.queue_size == 2
        with pytest.raises(OverloadedError):
            await engine.preprocess(pages[2])
        with pytest.raises(OverloadedError):
            await engine.embed(pages[2:3])
        assert [out.tokens for out in await first] == [r.tokens for r in await engine.embed(pages[:2])]
        assert engine.queue_size == 0


async def test_a_page_passed_bare_is_refused_not_split_into_characters(tiny_checkpoint: Path) -> None:
    """`embed("<p>...</p>")`: a str is a sequence of one-character strings, each had become a document."""
    page = "<html><body><p>hello world</p></body></html>"
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        for bare in (page, page.encode(), Document(html=page)):
            for call in (engine.embed, engine.embed_settled):
                with pytest.raises(HtmllmError, match="list") as info:
                    await call(bare)  # type: ignore[arg-type]
                assert info.value.code is ErrorCode.VALIDATION
        with pytest.raises(UnknownHeadError, match=r"\['quality'\]"):
            await engine.embed([page], heads="quality")
        assert engine.queue_size == 0
        assert len(await engine.embed([page], heads=["quality"])) == 1


def test_a_call_from_another_event_loop_is_refused_not_left_waiting(tiny_checkpoint: Path) -> None:
    """The batcher's tasks live on the loop that started the engine; a call from another loop (a second
    `asyncio.run`) had queued its documents where nothing would ever run them, and waited forever."""
    from service.engine import WrongEventLoopError

    engine = Engine.from_checkpoint(tiny_checkpoint)
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(engine.start())

        async def from_elsewhere() -> None:
            with pytest.raises(WrongEventLoopError, match="another event loop"):
                await asyncio.wait_for(engine.embed(["<p>x</p>"]), 10)
            with pytest.raises(WrongEventLoopError):
                await engine.stop()

        asyncio.run(from_elsewhere())
        assert first.run_until_complete(engine.embed(["<p>x</p>"]))  # its own loop still serves it
        first.run_until_complete(engine.stop())
    finally:
        first.close()

    async def restarted() -> int:  # stopped, it may start again on a new loop
        async with engine:
            return len(await engine.embed(["<p>x</p>"]))

    assert asyncio.run(restarted()) == 1


async def test_a_closed_engine_takes_no_documents(tiny_checkpoint: Path) -> None:
    """Its backend is released: documents had still gone to it (an onnx session gone: every batch an
    AttributeError reported as backend_failed), and `start` had started it again."""
    engine = Engine.from_checkpoint(tiny_checkpoint)
    await engine.start()
    engine.close()  # before stop: no new documents either
    for call in (engine.embed(["<p>x</p>"]), engine.preprocess("<p>x</p>")):
        with pytest.raises(ShuttingDownError, match="closed"):
            await call
    await engine.stop()
    engine.close()  # idempotent
    with pytest.raises(ShuttingDownError, match="closed"):
        await engine.start()


async def test_mean_pooling_gives_each_document_what_it_gets_alone(tmp_path: Path, pages: list[str]) -> None:
    from tests.factories.checkpoint import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint(tmp_path / "mean", pooling="mean")
    docs = [*pages[:6], *make_pages(2, seed=7, min_words=150, max_words=200)]  # past the local window
    async with Engine.from_checkpoint(checkpoint, EngineConfig(max_batch_requests=8)) as engine:
        assert engine.info.pooling == "mean"
        batched = await engine.embed(docs, normalize=False)
        alone = [(await engine.embed([d], normalize=False))[0] for d in docs]
    for a, b in zip(batched, alone, strict=True):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-5, rtol=0)
        assert a.scores["quality"] == pytest.approx(b.scores["quality"], abs=1e-5)
        for label, p in a.scores["page_type"].items():  # type: ignore[union-attr]
            assert p == pytest.approx(b.scores["page_type"][label], abs=1e-5)  # type: ignore[index]


async def test_a_draining_stop_overtaken_by_a_stop_without_drain_returns_quietly(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() waiting for the queue to drain while another stop(drain=False) finishes the shutdown had
    woken to a batcher already gone: AttributeError on None instead of returning. The call in flight is
    answered at once by the stop without drain (its thread runs on: it cannot be stopped)."""
    from service.engine import preprocessing as preprocessing_module

    real = preprocessing_module.preprocess

    def slow(*args: object) -> tuple[str, int]:
        time.sleep(0.3)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(preprocessing_module, "preprocess", slow)
    engine = Engine.from_checkpoint(tiny_checkpoint)
    await engine.start()
    in_flight = asyncio.create_task(engine.preprocess("<p>x</p>"))
    await asyncio.sleep(0.05)
    draining = asyncio.create_task(engine.stop(drain=True))  # waits for the preprocess call
    await asyncio.sleep(0.05)
    await engine.stop(drain=False)
    await asyncio.wait_for(draining, 10)
    with pytest.raises(ShuttingDownError):
        await in_flight
    assert engine.queue_size == 0


@pytest.mark.parametrize("config", [EngineConfig(backend="onnx"), EngineConfig(inference_process=True)])
def test_a_checkpoint_without_a_usable_tokenizer_is_a_checkpoint_error_on_every_backend(
    tiny_checkpoint: Path, tmp_path: Path, config: EngineConfig
) -> None:
    """These read only the metadata and the tokenizer here; a missing tokenizer.json had been a
    validation_error (what a bad request gets), not checkpoint_invalid as with the torch backend."""
    import shutil

    from service.core.checkpoint import CheckpointError

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    (root / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json") as info:
        Engine.from_checkpoint(root, config)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID


@pytest.mark.parametrize("pool", ["thread", "process"])
async def test_start_builds_the_word_table_before_any_page(
    tiny_checkpoint: Path, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first page of giant words must not build the 0.8 s word-character table mid-request: the
    engine warms its tokenizer as it starts, and each preprocessing process takes the engine's tables
    as it comes up (building them took a second of every worker's start)."""
    from service.core.tokenizer import HtmlTokenizer

    warmed: list[int] = []
    real_warm = HtmlTokenizer.warm
    monkeypatch.setattr(HtmlTokenizer, "warm", lambda self: (warmed.append(1), real_warm(self))[1])
    config = EngineConfig(preprocess_pool=pool, preprocess_workers=1)  # type: ignore[arg-type]
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        assert warmed == [1]
        if pool == "process":
            assert engine._preprocessing._processes is not None
            assert engine._preprocessing._processes.call(_word_tables_adopted, (), timeout_s=60)
        results = await engine.embed(["<p>" + "x" * 50_000 + " end</p>"])
        assert results[0].tokens > 2


def _word_tables_adopted() -> bool:
    from service.core import words

    return words._adopted is not None and words._built_tables.cache_info().currsize == 0


async def test_a_page_of_a_giant_pile_of_marks_fails_alone(tiny_checkpoint: Path) -> None:
    """Its bounded tokenization refuses it (service.core.words.MAX_UNCUT): the page gets its own typed
    error and the other page of the call its result."""
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig()) as engine:
        outcomes = await engine.embed_settled(["<p>x" + "\u0301" * 300_000 + "</p>", "<p>fine</p>"])
    assert isinstance(outcomes[0], HtmllmError) and outcomes[0].code is ErrorCode.PREPROCESS_FAILED
    assert not isinstance(outcomes[1], HtmllmError) and outcomes[1].tokens > 2


async def test_a_request_the_queue_cannot_serve_before_its_deadline_is_refused_at_once(
    tiny_checkpoint: Path, pages: list[str]
) -> None:
    """A full queue drained at the measured rate past a request's deadline: 429 now, not a 504 later
    (on two CPU cores a full default queue was 30-66 s of work against a 30 s timeout)."""
    engine, _ = slow_engine(tiny_checkpoint, delay_s=0.2, max_batch_requests=2)
    async with engine:
        await engine.embed(pages[:2])  # alone: never refused, and it measures the rate
        assert engine._drain.rate is not None
        ahead = asyncio.create_task(engine.embed(pages[:10]))  # about a second of batches
        await asyncio.sleep(0.05)
        started = time.monotonic()
        # The documents it names are those its wait was computed for: the queue's and the request's.
        queued = engine.queue_size + 2
        with pytest.raises(
            OverloadedError, match=rf"\({queued} documents at .* past this request's deadline"
        ):
            await engine.embed(pages[10:12], deadline=time.monotonic() + 0.3)
        assert time.monotonic() - started < 0.25  # refused at once, not at its deadline (0.3 s)
        # With time enough for the queue ahead, the same request is taken and answered.
        later = await engine.embed(pages[10:12], deadline=time.monotonic() + 30)
        assert len(later) == 2 and len(await ahead) == 10


def test_check_device_refuses_before_anything_loads_what_the_runner_would_refuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`htmllm serve` asks it first: the runner's own refusal came only after the checkpoint had loaded."""
    import onnxruntime

    check_device(EngineConfig())
    check_device(EngineConfig(attn_implementation="eager"))
    check_device(EngineConfig(backend="onnx"))
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(ValueError, match="no CUDAExecutionProvider"):
        check_device(EngineConfig(backend="onnx", device="cuda"))
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: providers)
    check_device(EngineConfig(backend="onnx", device="cuda"))
    with pytest.raises(ValueError, match="flash_attention_2 needs CUDA"):
        check_device(EngineConfig(attn_implementation="flash_attention_2", dtype="bfloat16"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no usable CUDA device"):
            check_device(EngineConfig(device="cuda", dtype="bfloat16"))


def test_one_call_larger_than_the_queue_is_too_many_documents(tiny_checkpoint: Path) -> None:
    """Never a fit however long the caller waits: a 422 to split the call, for embed and for a caller
    that admits documents one by one (/v1/preprocess)."""
    engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_queue_documents=2))
    engine.check_call_size(2)
    with pytest.raises(TooManyDocumentsError, match="3 documents in one call exceed the queue's 2"):
        engine.check_call_size(3)


async def test_only_model_work_counts_as_drain_time(tiny_checkpoint: Path, pages: list[str]) -> None:
    """Cache hits, /v1/preprocess calls and pages failing in preprocessing keep documents admitted but
    give the model nothing to do: counted as drain time, 10 s of cache-hit traffic took the measured
    rate from 10 to 1.2 documents a second, and a 64-page call that alone took 4.5 s was refused at
    once against its 10 s deadline."""
    engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(result_cache_documents=8))
    drain = engine._drain = RecordingDrain()
    async with engine:
        await engine.embed(pages[:1])  # one page, one pass (two may go as two passes of one)
        assert drain.calls == ["busy", "finished 1", "idle"]
        await engine.embed(pages[:1])  # from the cache
        await engine.preprocess(pages[3])
        (over,) = await engine.embed_settled([pages[4] * 40], truncate=False)  # over the limit
        assert isinstance(over, TooManyTokensError)
        assert drain.calls == ["busy", "finished 1", "idle"]


async def test_a_bug_on_a_documents_way_is_a_typed_internal_error(
    tiny_checkpoint: Path, pages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`embed_settled` answered it as INTERNAL; `embed` let the bare exception out (a ValueError from
    rows zipped against labels of another count reached the server as an untyped 500)."""
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:

        def broken(*args: object) -> DocumentResult:
            raise ValueError("zip() argument 2 is longer than argument 1")

        monkeypatch.setattr(engine, "_result", broken)
        with pytest.raises(HtmllmError, match="embedding failed: ValueError: zip") as caught:
            await engine.embed(pages[:2])
        assert caught.value.code is ErrorCode.INTERNAL and isinstance(caught.value.__cause__, ValueError)
        (settled,) = await engine.embed_settled(pages[2:3])
        assert isinstance(settled, HtmllmError) and settled.code is ErrorCode.INTERNAL
        assert engine.queue_size == 0


async def test_an_encoder_only_engine_runs_without_the_heads_and_only_in_process_on_torch(
    tmp_path: Path,
) -> None:
    """What the evaluation embeds pages with: a head that does not load must not stop it."""
    import shutil

    from service.engine import Engine, EngineConfig
    from tests.factories.checkpoint import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    heads = sorted(p.name for p in (ckpt / "heads").glob("*.safetensors"))
    assert len(heads) >= 2
    shutil.copyfile(ckpt / "heads" / heads[0], ckpt / "heads" / heads[1])  # a broken head
    async with Engine.from_checkpoint(ckpt, EngineConfig(), encoder_only=True) as engine:
        assert engine.info.heads == []
        (result,) = await engine.embed(["<p>a page</p>"], heads=[])
        assert result.embedding.shape == (engine.info.embedding_dim,)
    for config in (EngineConfig(backend="onnx"), EngineConfig(inference_process=True)):
        with pytest.raises(ValueError, match="encoder_only loads the torch backend in this process"):
            Engine.from_checkpoint(ckpt, config, encoder_only=True)
