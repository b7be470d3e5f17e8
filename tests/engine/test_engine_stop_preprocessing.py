"""`stop(drain=False)` fails the pages still being preprocessed at once, not once the forward pass in
flight has ended: it had closed the preprocessing pools only after the batcher, whose close waits for
that pass (a large batch on CPU: seconds, past a server's drain budget), so such a page's caller waited
for the pass, and a server's shutdown answered its request late (uvicorn's bare 500)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from service.core import workers
from service.core.checkpoint import load_checkpoint
from service.core.preparation import Prepared
from service.engine.engine import Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.torch import TorchRunner
from service.engine.types import Document, EngineConfig, ShuttingDownError
from tests.factories.pages import make_pages

SAFETY_S = 30  # bounds on waits that end at once when the engine is right: no timing under test
HELD_MARK = "heldinpreprocessing"  # in the text of the page that a test holds in preprocessing


class _HeldRunner(TorchRunner):
    """The torch runner, whose forward passes wait for `release` (a long pass on CPU, held); `finished`
    once a pass is over. Held at most twice SAFETY_S, so that what waits for the pass waits past every
    bound of the test rather than end with it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.started.set()
        self.release.wait(2 * SAFETY_S)
        try:
            return super().run(prepared)
        finally:
            self.finished.set()


def _page(seed: int, *, held: bool = False) -> str:
    page = make_pages(1, seed=seed)[0]
    return page.replace("<p>", f"<p>{HELD_MARK} ", 1) if held else page


def _hold_on_the_thread(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Hold the page marked HELD_MARK on its preprocessing thread (a parse stuck in C code) until the
    second event; the first says it is held."""
    started, release = threading.Event(), threading.Event()
    real = engine._preprocessing._prepare

    def prepare(doc: Document, truncate: bool) -> Prepared:
        if isinstance(doc.html, str) and HELD_MARK in doc.html:
            started.set()
            release.wait(2 * SAFETY_S)
        return real(doc, truncate)

    monkeypatch.setattr(engine._preprocessing, "_prepare", prepare)
    return started, release


def _stop_the_worker_given_it(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """Stop (SIGSTOP) the preprocessing process that the page marked HELD_MARK is sent to, right as it is
    sent: a page mid-preprocessing in a process, for as long as the test wants. The event says it is held;
    the list holds the stopped process's pid."""
    held, pids = threading.Event(), []
    holder = threading.local()  # the worker this thread is exchanging with (the pool's calls run on many)
    exchange, send = workers.WorkerPool._exchange, workers._send_job

    def exchange_noting(self: workers.WorkerPool, worker: Any, *args: Any) -> tuple[Any, ...]:
        holder.worker = worker
        return exchange(self, worker, *args)

    def send_then_stop(conn: Any, job: bytes | memoryview) -> None:
        if HELD_MARK.encode() not in bytes(job):
            send(conn, job)
            return
        pid = holder.worker.process.pid
        os.kill(pid, signal.SIGSTOP)
        pids.append(pid)
        send(conn, job)
        held.set()

    monkeypatch.setattr(workers.WorkerPool, "_exchange", exchange_noting)
    monkeypatch.setattr(workers, "_send_job", send_then_stop)
    return held, pids


@pytest.mark.parametrize("pool", ["thread", "process"])
async def test_a_stop_without_drain_fails_the_pages_in_preprocessing_while_the_pass_still_runs(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    """Document `a` in a held forward pass; `b` held in preprocessing (on the one thread, or in the one
    process), `c` and `d` waiting for it, in a report-mode call (`a`'s is all-or-nothing, `b` and `c`
    settled) and an all-or-nothing one (`d`). After `stop(drain=False)` every call is answered
    ShuttingDownError while the pass is still held; the stop itself returns once that pass is over."""
    checkpoint = load_checkpoint(tiny_checkpoint)
    runner = _HeldRunner(checkpoint.model, intra_op_threads=1)
    config = EngineConfig(
        preprocess_pool=pool,
        preprocess_workers=1,
        preprocess_timeout_s=None,  # the held process is no page past its limit
        max_batch_requests=1,
        max_wait_ms=0,
    )
    engine = Engine(runner, checkpoint.tokenizer, checkpoint.meta, config)
    await engine.start()
    pids: list[int] = []
    if pool == "thread":
        held, release_page = _hold_on_the_thread(engine, monkeypatch)
    else:
        held, pids = _stop_the_worker_given_it(monkeypatch)
        release_page = threading.Event()
    try:
        in_pass = asyncio.ensure_future(engine.embed([Document(_page(1), id="a")]))
        assert await asyncio.to_thread(runner.started.wait, SAFETY_S)
        settled = asyncio.ensure_future(
            engine.embed_settled([Document(_page(2, held=True), id="b"), Document(_page(3), id="c")])
        )
        assert await asyncio.to_thread(held.wait, SAFETY_S)
        whole = asyncio.ensure_future(engine.embed([Document(_page(4), id="d")]))
        for _ in range(1000):  # `d` admitted: a few loop turns
            if engine.queue_size == 4:
                break
            await asyncio.sleep(0.001)
        assert engine.queue_size == 4
        stopping = asyncio.ensure_future(engine.stop(drain=False))
        calls = [in_pass, settled, whole]
        _, pending = await asyncio.wait(calls, timeout=SAFETY_S)
        assert not pending, "a call waited for the pass in flight"
        assert not runner.finished.is_set() and not stopping.done()  # the pass is still held
        for call in (in_pass, whole):
            with pytest.raises(ShuttingDownError):
                call.result()
        assert [type(outcome) for outcome in settled.result()] == [ShuttingDownError, ShuttingDownError]
        assert engine.queue_size == 0
    finally:
        runner.release.set()
        release_page.set()
        for pid in pids:  # killed by the stop when it is right; let go otherwise
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    await asyncio.wait_for(stopping, 2 * SAFETY_S)
    assert engine._batcher is None and engine._preprocessing.threads is None
    engine.close()


async def test_a_stop_with_drain_still_embeds_the_pages_in_preprocessing(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain is unchanged: a page held in preprocessing behind a held pass is embedded, not failed."""
    checkpoint = load_checkpoint(tiny_checkpoint)
    runner = _HeldRunner(checkpoint.model, intra_op_threads=1)
    config = EngineConfig(preprocess_workers=1, max_batch_requests=1, max_wait_ms=0)
    engine = Engine(runner, checkpoint.tokenizer, checkpoint.meta, config)
    await engine.start()
    held, release_page = _hold_on_the_thread(engine, monkeypatch)
    try:
        in_pass = asyncio.ensure_future(engine.embed([Document(_page(1), id="a")]))
        assert await asyncio.to_thread(runner.started.wait, SAFETY_S)
        preprocessing = asyncio.ensure_future(engine.embed([Document(_page(2, held=True), id="b")]))
        assert await asyncio.to_thread(held.wait, SAFETY_S)
        stopping = asyncio.ensure_future(engine.stop())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not preprocessing.done() and not stopping.done()
    finally:
        runner.release.set()
        release_page.set()
    await asyncio.wait_for(stopping, SAFETY_S)
    assert [result.id for result in in_pass.result() + preprocessing.result()] == ["a", "b"]
    engine.close()
