"""A failed page is freed by reference counting alone, as soon as its caller lets go of the answer.

A serving process freezes its start-up objects and collects the young generation rarely
(service.engine.collector): garbage in a reference cycle waits for a full collection, which it all but
never runs. A failed page's error, its traceback and a frame that still named the error (or the task or
future keeping it) made such cycles, and each kept the page: a soak posting refused 12 MB pages grew the
server by gigabytes. Here the collector is off while the engine fails pages every way it can; a page
still alive afterwards is held by a cycle.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import types
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from service.core.errors import ErrorCode, HtmllmError
from service.engine.engine import Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.types import Document, DocumentResult, EngineConfig
from tests.engine.conftest import HOLD_S, hold_first_prepare

MAX_LENGTH = 64

# Pages the engine refuses, one per way a page fails on its own; each is built for its test only.
FAILING_PAGES: dict[str, Callable[[], bytes]] = {
    "too large": lambda: b" " * (16 * 1024 * 1024 + 1),  # over the pruner's size cap: 413
    "too many tokens": lambda: b"<p>" + b"word " * (4 * MAX_LENGTH) + b"</p>",  # with truncation off
    "nested too deep": lambda: b"<div>" * 9000,
    "too many attributes": lambda: b"<p " + b" ".join(b"a%d=1" % i for i in range(1100)) + b">x</p>",
    "a word past the tokenizer's bound": lambda: ("<p>x" + "\u0301" * 300_000 + "</p>").encode(),
}


def _held_by(obj: object) -> str:
    """What keeps `obj` alive, a few referrers deep: the chain to read when a test here fails."""
    me = sys._getframe()
    level, lines = [obj], []
    for depth in range(1, 6):
        referrers = [r for o in level for r in gc.get_referrers(o) if r is not me and r is not level]
        names = sorted(
            {
                f"frame {r.f_code.co_name}" if isinstance(r, types.FrameType) else type(r).__name__
                for r in referrers
            }
        )
        lines.append(f"{depth}: {', '.join(names)}")
        level = referrers[:8]
    return "; ".join(lines)


async def _settled_loop(engine: Engine) -> None:
    """Wait for what the failed call left in flight: the preprocessing thread's job (one thread: a job
    queued after it runs once it is done) and the callbacks that job's end schedules on the loop."""
    pool = engine._preprocessing.threads
    if pool is not None:
        await asyncio.get_running_loop().run_in_executor(pool, int)
    for _ in range(10):
        await asyncio.sleep(0)


async def _failure(call: Awaitable[object]) -> str:
    """The code of the error `call` raised or answered with; the error itself is let go."""
    try:
        outcome = await call
    except HtmllmError as exc:
        return str(exc.code)
    except asyncio.CancelledError:
        return "cancelled"
    assert isinstance(outcome, list)
    codes = [str(o.code) for o in outcome if isinstance(o, HtmllmError)]
    assert all(isinstance(o, DocumentResult | HtmllmError) for o in outcome)
    return codes[0] if codes else "no failure"


def _page_and_ref(
    make: Callable[[], bytes], doc_id: str = "failing"
) -> tuple[Document, weakref.ref[Document]]:
    doc = Document(html=make(), id=doc_id)
    return doc, weakref.ref(doc)


def _assert_freed(ref: weakref.ref[Document], what: str) -> None:
    doc = ref()
    if doc is not None:
        chain = _held_by(doc)
        del doc
        pytest.fail(f"{what}: the page outlived its call, held by a reference cycle ({chain})")


@pytest.fixture
def config() -> EngineConfig:
    return EngineConfig(max_length=MAX_LENGTH, preprocess_workers=1, preprocess_pool="thread")


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("settle", [False, True], ids=["embed", "embed_settled"])
@pytest.mark.parametrize("kind", list(FAILING_PAGES))
async def test_a_page_that_fails_is_freed_without_a_collection(
    tiny_checkpoint: Path, config: EngineConfig, kind: str, settle: bool
) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        doc, ref = _page_and_ref(FAILING_PAGES[kind])
        documents = [doc, Document(html=b"<p>a page that embeds</p>")]
        del doc
        call = engine.embed_settled if settle else engine.embed
        code = await _failure(call(documents, truncate=False))
        del documents
        await _settled_loop(engine)
        assert code != "no failure", kind
        _assert_freed(ref, f"{kind} ({code})")


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("settle", [False, True], ids=["embed", "embed_settled"])
async def test_copies_of_a_failing_page_are_freed_without_a_collection(
    tiny_checkpoint: Path, settle: bool
) -> None:
    """With the result cache the copies wait for the first and are told its failure in their own name."""
    config = EngineConfig(max_length=MAX_LENGTH, preprocess_workers=1, result_cache_documents=8)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        page = FAILING_PAGES["nested too deep"]()
        documents = [Document(html=page, id=str(i)) for i in range(3)]
        refs = [weakref.ref(doc) for doc in documents]
        del page
        call = engine.embed_settled if settle else engine.embed
        assert await _failure(call(documents)) == ErrorCode.PREPROCESS_FAILED
        del documents
        await _settled_loop(engine)
        for ref in refs:
            _assert_freed(ref, "a copy")


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("settle", [False, True], ids=["embed", "embed_settled"])
async def test_a_page_past_its_deadline_is_freed_without_a_collection(
    tiny_checkpoint: Path, config: EngineConfig, monkeypatch: pytest.MonkeyPatch, settle: bool
) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        held = hold_first_prepare(engine, monkeypatch)
        doc, ref = _page_and_ref(lambda: b"<p>held on its thread past the deadline</p>")
        call = engine.embed_settled if settle else engine.embed
        documents = [doc]
        del doc
        waiting = asyncio.ensure_future(_failure(call(documents, deadline=time.monotonic() + 0.2)))
        del documents
        assert await waiting == ErrorCode.TIMEOUT
        del waiting
        held.release.set()
        await _settled_loop(engine)
        _assert_freed(ref, "past its deadline")


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("where", ["preprocessing", "in a forward pass"])
async def test_a_cancelled_call_frees_its_page_without_a_collection(
    tiny_checkpoint: Path, config: EngineConfig, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The caller cancelled (a disconnect, a timeout around the call) while the page was on its thread,
    or while its row was awaited from a forward pass."""
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        held = hold_first_prepare(engine, monkeypatch)
        in_pass, end_pass = threading.Event(), threading.Event()
        if where == "in a forward pass":
            held.release.set()
            monkeypatch.setattr(engine._runner, "run", _held_run(engine._runner.run, in_pass, end_pass))
        doc, ref = _page_and_ref(lambda: b"<p>cancelled on its way</p>")
        task = asyncio.ensure_future(engine.embed([doc]))
        del doc
        await asyncio.to_thread((in_pass if where == "in a forward pass" else held.started).wait, HOLD_S)
        task.cancel()
        assert await _failure(task) == "cancelled"
        del task
        held.release.set()
        end_pass.set()
        await _settled_loop(engine)
        _assert_freed(ref, f"cancelled while {where}")


def _held_run(
    run: Callable[[PreparedBatch], RunnerOutput], entered: threading.Event, release: threading.Event
) -> Callable[[PreparedBatch], RunnerOutput]:
    """A forward pass that says it began, then runs once `release` is set."""

    def held(prepared: PreparedBatch) -> RunnerOutput:
        entered.set()
        release.wait(HOLD_S)
        return run(prepared)

    return held


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("settle", [False, True], ids=["embed", "embed_settled"])
async def test_a_page_failed_by_the_backend_is_freed_without_a_collection(
    tiny_checkpoint: Path, config: EngineConfig, monkeypatch: pytest.MonkeyPatch, settle: bool
) -> None:
    """The forward pass fails: the error comes from the batcher's future, which the document's progress
    names while it waits."""

    def broken(prepared: PreparedBatch) -> RunnerOutput:
        raise RuntimeError("the device fell off the bus")

    # pytest keeps every log record, and the pass's record keeps its exception, and through the batch's
    # futures this page: a reference, not a cycle, and one no server's log handler keeps.
    monkeypatch.setattr(logging.getLogger("service.engine.batcher"), "disabled", True)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        monkeypatch.setattr(engine._runner, "run", broken)
        doc, ref = _page_and_ref(lambda: b"<p>a good page on a broken backend</p>")
        documents = [doc]
        del doc
        call = engine.embed_settled if settle else engine.embed
        assert await _failure(call(documents)) == ErrorCode.BACKEND_FAILED
        del documents
        await _settled_loop(engine)
        _assert_freed(ref, "failed by the backend")


@pytest.mark.usefixtures("no_collector")
async def test_a_page_failed_by_a_stop_without_drain_is_freed_without_a_collection(
    tiny_checkpoint: Path, config: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await engine.start()
    held = hold_first_prepare(engine, monkeypatch)
    pool = engine._preprocessing.threads
    assert pool is not None
    doc, ref = _page_and_ref(lambda: b"<p>held while the engine stops</p>")
    waiting = asyncio.ensure_future(_failure(engine.embed([doc])))
    del doc
    await asyncio.to_thread(held.started.wait, HOLD_S)
    await engine.stop(drain=False)
    assert await waiting == ErrorCode.SHUTTING_DOWN
    del waiting
    held.release.set()
    engine.close()
    await asyncio.to_thread(pool.shutdown, wait=True)  # the thread the stop left to end on its own
    for _ in range(10):
        await asyncio.sleep(0)
    _assert_freed(ref, "failed by a stop")


@pytest.mark.usefixtures("no_collector")
async def test_a_page_that_fails_preprocess_is_freed_without_a_collection(
    tiny_checkpoint: Path, config: EngineConfig
) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        doc, ref = _page_and_ref(FAILING_PAGES["nested too deep"])
        assert await _failure(engine.preprocess(doc)) == ErrorCode.PREPROCESS_FAILED
        del doc
        await _settled_loop(engine)
        _assert_freed(ref, "preprocess")
