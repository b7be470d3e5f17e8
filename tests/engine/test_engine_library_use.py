"""The Engine used as a library: what a caller of `embed` is told of a failing page among many, an engine
whose event loop has ended, and `heads` that are not names."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from pathlib import Path

import pytest

from service.core.prune import NestingTooDeepError
from service.engine import (
    Document,
    Engine,
    EngineConfig,
    TooManyTokensError,
    UnknownHeadError,
    WrongEventLoopError,
)
from service.engine.failures import naming

TOO_DEEP = b"<div>" * 9000  # past the pruner's nesting cap (8192)
GOOD = "<p>a page that embeds</p>"
MAX_LENGTH = 64
# A bound on waiting for threads a stop told to end (idle ones end at once): not a timing under test.
THREAD_END_S = 60.0


@pytest.fixture
def config() -> EngineConfig:
    return EngineConfig(max_length=MAX_LENGTH, preprocess_workers=1)


@pytest.mark.parametrize("pool", ["thread", "process"])
async def test_a_failing_page_among_many_is_named_in_its_own_class(tiny_checkpoint: Path, pool: str) -> None:
    """A crawler's 64 pages had failed with "page nests more than 8192 elements deep" and no word of
    which one; the HTTP API named it. Named once: the HTTP layer's `naming` passes it on as it is."""
    config = EngineConfig(max_length=MAX_LENGTH, preprocess_workers=1, preprocess_pool=pool)  # type: ignore[arg-type]
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        documents = [Document(html=GOOD)] * 3 + [Document(html=TOO_DEEP)] + [Document(html=GOOD)]
        with pytest.raises(NestingTooDeepError) as unnamed:
            await engine.embed(documents)
        assert unnamed.value.message.startswith("the document at index 3: page nests more than 8192")
        assert naming(unnamed.value, documents) is unnamed.value

        with_ids = [Document(html=GOOD, id="fine"), Document(html=TOO_DEEP, id="deep")]
        with pytest.raises(NestingTooDeepError, match=r"^document 'deep' \(index 1\): page nests more"):
            await engine.embed(with_ids)


async def test_a_page_over_the_token_limit_is_named_by_its_index(
    tiny_checkpoint: Path, config: EngineConfig
) -> None:
    long_page = "<p>" + "word " * (4 * MAX_LENGTH) + "</p>"
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        documents = [Document(html=GOOD), Document(html=GOOD), Document(html=long_page)]
        with pytest.raises(
            TooManyTokensError, match=r"^the document at index 2 has (more than )?\d+ tokens"
        ) as info:
            await engine.embed(documents, truncate=False)
        assert naming(info.value, documents) is info.value


async def test_a_call_of_one_page_says_no_index(tiny_checkpoint: Path, config: EngineConfig) -> None:
    """`htmllm embed` embeds page by page and writes the message in a row of the page's own index."""
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        with pytest.raises(NestingTooDeepError, match=r"^page nests more than 8192"):
            await engine.embed([Document(html=TOO_DEEP, id="deep")])
        settled = await engine.embed_settled([Document(html=GOOD), Document(html=TOO_DEEP)])
        assert str(settled[1]).startswith("page nests more than")  # its own answer: no name needed


def _children() -> set[int | None]:
    return {child.pid for child in multiprocessing.active_children()}


def _engine_threads() -> set[threading.Thread]:
    """The preprocessing threads and the batcher's (collation, inference) of every engine."""
    return {t for t in threading.enumerate() if t.name.startswith("htmllm-")}


@pytest.mark.parametrize("how", ["stop", "stop without drain", "start"])
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_an_engine_whose_loop_ended_stops_and_starts_again(
    tiny_checkpoint: Path, pool: str, how: str
) -> None:
    """`asyncio.run(engine.start())`, then another `asyncio.run`: embed, stop and start had all raised
    WrongEventLoopError for ever, the preprocessing processes left running. Now embed says to stop or
    start first, and a stop or start on the new loop ends the old pools and starts anew."""
    config = EngineConfig(max_length=MAX_LENGTH, preprocess_workers=1, preprocess_pool=pool)  # type: ignore[arg-type]
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    known, known_threads = _children(), _engine_threads()

    async def started() -> int:
        await engine.start()
        return len(await engine.embed([GOOD, GOOD]))

    assert asyncio.run(started()) == 2
    old_threads, old_children = _engine_threads() - known_threads, _children() - known
    names = {t.name.rsplit("_", 1)[0] for t in old_threads}
    assert "htmllm-infer" in names and any(name.startswith("htmllm-preprocess") for name in names), names
    assert bool(old_children) is (pool == "process")

    with pytest.raises(WrongEventLoopError, match=r"now closed; `await engine\.stop"):
        asyncio.run(engine.embed([GOOD]))

    def assert_old_pools_ended() -> None:
        assert not _children() & old_children, "the old loop's preprocessing processes run on"
        for thread in old_threads:
            thread.join(THREAD_END_S)
        assert not [t.name for t in old_threads if t.is_alive()], "the old loop's engine threads run on"

    async def embedded_anew() -> int:
        if how != "start":
            await engine.stop(drain=how == "stop")
            assert not engine.accepting
            assert_old_pools_ended()  # by the stop itself, not only once a start replaced them
        await engine.start()
        try:
            return len(await engine.embed([GOOD]))
        finally:
            await engine.stop()

    assert asyncio.run(embedded_anew()) == 1
    assert_old_pools_ended()
    assert _children() - known == set(), "preprocessing processes outlived their engine's stop"
    engine.close()


def test_stopped_on_an_ended_loop_it_says_so(tiny_checkpoint: Path, config: EngineConfig) -> None:
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    asyncio.run(engine.start())
    asyncio.run(engine.stop())
    with pytest.raises(Exception, match="has stopped"):
        asyncio.run(engine.embed([GOOD]))
    asyncio.run(engine.stop())  # again: idempotent
    engine.close()


@pytest.mark.parametrize(
    ("heads", "says"),
    [
        ([1], "heads are head names \\(str\\), not int"),
        (["quality", None], "not NoneType"),
        ([["quality"]], "not list"),  # unhashable: had been a bare TypeError from the dict lookup
        (5, "a list of head names, not int"),
        (b"quality", "a list of head names, not bytes"),  # had said "not int" (its bytes)
        ({"quality": 1}, "a list of head names, not dict"),  # had been taken as ["quality"]
    ],
)
def test_heads_that_are_not_names_are_refused_as_unknown_heads(
    tiny_checkpoint: Path, config: EngineConfig, heads: object, says: str
) -> None:
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    with pytest.raises(UnknownHeadError, match=says):
        engine.resolve_heads(heads)  # type: ignore[arg-type]
    engine.close()


async def test_heads_from_a_generator_are_all_reported(tiny_checkpoint: Path, config: EngineConfig) -> None:
    """Read twice, a generator had been empty the second time: no head reported, and no error."""
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        (result,) = await engine.embed([GOOD], heads=(name for name in ["quality"]))  # type: ignore[arg-type]
        assert list(result.scores) == ["quality"]
        with pytest.raises(UnknownHeadError, match="not int"):
            await engine.embed([GOOD], heads=[1])  # type: ignore[list-item]
        assert engine.queue_size == 0
