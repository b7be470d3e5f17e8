"""How a call's documents are counted when it fails: each by what happened to it, the same in an
all-or-nothing call (`embed`) as when each document is answered alone (`embed_settled`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.errors import ErrorCode, HtmllmError
from service.engine.engine import Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.types import (
    DeadlineExceededError,
    Document,
    DocumentResult,
    EngineConfig,
    EngineObserver,
    TooManyTokensError,
)
from tests.engine.conftest import slow_runner
from tests.factories.pages import make_pages


class Counts(EngineObserver):
    """What the metrics would count: documents failed by code, skipped, done, and finished results."""

    def __init__(self) -> None:
        self.failed: Counter[ErrorCode] = Counter()
        self.skipped = 0
        self.done = 0
        self.finished = 0  # documents whose result was built (the last stage reported is "total")

    def documents_failed(self, code: ErrorCode, documents: int) -> None:
        self.failed[code] += documents

    def documents_skipped(self, documents: int) -> None:
        self.skipped += documents

    def documents_done(self, documents: int, tokens: int) -> None:
        self.done += documents

    def stage(self, name: str, seconds: float) -> None:
        self.finished += name == "total"


async def _turns_until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop run (a bounded number of turns, not a time) until `condition()` holds."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)


async def test_one_page_over_the_limit_counts_once_whether_the_call_fails_or_reports(
    tiny_checkpoint: Path,
) -> None:
    """Nine short pages and one over the limit: the all-or-nothing call counted ten `too_many_tokens`,
    the reporting call one. The page at fault counts once either way; the nine others are embedded
    (reported) or dropped before their pass (all or nothing), never failures."""
    short = make_pages(9, max_words=8)
    too_long = make_pages(1, min_words=400, max_words=400)[0]
    docs = [Document(html=too_long, id="long"), *(Document(html=p, id=f"s{i}") for i, p in enumerate(short))]
    # One worker: the long page is tokenized first, while the others wait for the thread.
    config = EngineConfig(max_length=64, preprocess_workers=1, max_batch_requests=9)
    failing, reporting = Counts(), Counts()
    async with Engine.from_checkpoint(tiny_checkpoint, config, observer=failing) as engine:
        with pytest.raises(TooManyTokensError):
            await engine.embed(docs, truncate=False)
        await _turns_until(lambda: failing.skipped >= 9)
        assert failing.failed == {ErrorCode.TOO_MANY_TOKENS: 1}
        assert failing.skipped == 9 and failing.done == 0
        engine.observer = reporting
        outcomes = await engine.embed_settled(docs, truncate=False)
        assert engine.queue_size == 0
    assert isinstance(outcomes[0], TooManyTokensError)
    assert all(isinstance(outcome, DocumentResult) for outcome in outcomes[1:])
    assert reporting.failed == failing.failed and reporting.done == 9 and reporting.skipped == 0


async def test_a_bug_on_one_documents_way_counts_that_document_as_internal(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    observer = Counts()
    docs = [Document(html=p, id=f"d{i}") for i, p in enumerate(make_pages(4, max_words=8))]
    async with Engine.from_checkpoint(tiny_checkpoint, observer=observer) as engine:
        real = engine._result

        def result(doc: Document, *args: object) -> DocumentResult:
            if doc.id == "d2":
                raise ValueError("a bug in building this document's result")
            return real(doc, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(engine, "_result", result)
        with pytest.raises(HtmllmError) as caught:
            await engine.embed(docs)
        assert caught.value.code is ErrorCode.INTERNAL
        assert observer.failed == {ErrorCode.INTERNAL: 1}
        settled = await engine.embed_settled(docs)
    assert [isinstance(outcome, HtmllmError) for outcome in settled] == [False, False, True, False]
    assert observer.failed == {ErrorCode.INTERNAL: 2}


async def test_every_document_of_a_failed_pass_counts_as_a_backend_failure(tiny_checkpoint: Path) -> None:
    """The pass fails each of its rows at once: the all-or-nothing call counts them all, as the
    reporting call does, not only the one whose error it raises."""
    observer = Counts()
    runner, checkpoint = slow_runner(tiny_checkpoint, delay_s=0.0)

    def broken(prepared: PreparedBatch) -> RunnerOutput:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")

    runner.run = broken  # type: ignore[method-assign]
    # Four copies of one page (no result cache): one length, one window, one pass.
    config = EngineConfig(max_batch_requests=4, max_wait_ms=60_000, result_cache_documents=0)
    engine = Engine(runner, checkpoint.tokenizer, checkpoint.meta, config, observer=observer)  # type: ignore[attr-defined]
    page = make_pages(1, max_words=8)[0]
    async with engine:
        with pytest.raises(HtmllmError) as caught:
            await engine.embed([page] * 4)
        assert caught.value.code is ErrorCode.BACKEND_FAILED
        assert observer.failed == {ErrorCode.BACKEND_FAILED: 4}
        settled = await engine.embed_settled([page] * 4)
    assert all(isinstance(outcome, HtmllmError) for outcome in settled)
    assert observer.failed == {ErrorCode.BACKEND_FAILED: 8} and observer.skipped == 0


async def test_at_the_deadline_only_the_documents_not_embedded_count_as_timed_out(
    tiny_checkpoint: Path,
) -> None:
    """The first pass answers its documents; every later one hangs past the call's deadline. Those
    embedded in time are no timeouts (`embed_settled` would answer them with their results)."""
    observer = Counts()
    runner, checkpoint = slow_runner(tiny_checkpoint, delay_s=0.0)
    real, release, passes = runner.run, threading.Event(), [0]

    def first_pass_only(prepared: PreparedBatch) -> RunnerOutput:
        passes[0] += 1
        if passes[0] > 1:
            release.wait(60)
        return real(prepared)

    runner.run = first_pass_only  # type: ignore[method-assign]
    config = EngineConfig(max_batch_requests=2, max_wait_ms=0, preprocess_workers=1)
    engine = Engine(runner, checkpoint.tokenizer, checkpoint.meta, config, observer=observer)  # type: ignore[attr-defined]
    async with engine:
        try:
            with pytest.raises(DeadlineExceededError):
                # Seconds for a first pass of the tiny model, which takes milliseconds.
                await engine.embed(make_pages(4, max_words=8), deadline=time.monotonic() + 2.0)
        finally:
            release.set()
    assert observer.finished >= 1  # the first pass answered its documents before the deadline
    assert observer.failed == {ErrorCode.TIMEOUT: 4 - observer.finished}
