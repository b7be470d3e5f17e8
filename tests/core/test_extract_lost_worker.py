"""An extractor process killed from outside while it holds a page (the kernel's OOM killer, `kill -9`):
retried in a fresh process, then the whole page's `ExtractorLostError` (`not_ready`), never one
extractor's `extraction_failed` that the union passes over. The kills are real (`worker_kills`)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from service.core.errors import ErrorCode
from service.core.extract import (
    JUSTEXT,
    RESILIPARSE,
    UNION,
    ExtractionError,
    ExtractorLostError,
    ExtractorPool,
    extract,
    extract_all,
)
from service.core.extract.pool import LOST_WORKER_RETRIES
from tests.factories.worker_kills import kill_workers_holding

MARKER = "the kernel picks the process extracting this page"
PAGE = (
    "<html><body><article>"
    + "".join(f"<p>Sentence {i} says that {MARKER}, though nothing in it is wrong.</p>" for i in range(12))
    + "</article></body></html>"
)


@pytest.fixture
def solo() -> Iterator[ExtractorPool]:
    with ExtractorPool(1) as pool:
        yield pool


def test_a_worker_killed_from_outside_is_replaced_and_the_page_extracted_as_before(
    solo: ExtractorPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One kill made resiliparse's attempt `extraction_failed` and the union took another extractor's
    text: the page's text depended on the OOM killer."""
    expected = extract(PAGE, runner=solo)
    assert expected.extractor == RESILIPARSE and expected.passed
    killed = kill_workers_holding(monkeypatch, MARKER.encode(), kills=LOST_WORKER_RETRIES)
    result = extract(PAGE, runner=solo)
    assert len(set(killed)) == LOST_WORKER_RETRIES  # each try in a fresh worker
    assert [(a.extractor, a.error, a.passed) for a in result.attempts] == [(RESILIPARSE, None, True)]
    assert (result.extractor, result.text) == (expected.extractor, expected.text)


@pytest.mark.parametrize("extractor", [UNION, JUSTEXT, "all"])
def test_a_page_whose_worker_is_killed_in_every_try_fails_whole_as_not_ready(
    solo: ExtractorPool, monkeypatch: pytest.MonkeyPatch, extractor: str
) -> None:
    """Not that extractor's `extraction_failed`: the union does not fall through to the next extractor
    (whose job would have run once the kills stopped), `extract_all` does not record it."""
    tries = LOST_WORKER_RETRIES + 1
    with monkeypatch.context() as patch:
        killed = kill_workers_holding(patch, MARKER.encode(), kills=tries)
        with pytest.raises(ExtractorLostError) as lost:
            if extractor == "all":
                extract_all(PAGE, runner=solo)
            else:
                extract(PAGE, extractor, runner=solo)
    assert len(set(killed)) == tries
    assert lost.value.code is ErrorCode.NOT_READY and not isinstance(lost.value, ExtractionError)
    first = RESILIPARSE if extractor in (UNION, "all") else extractor
    assert lost.value.message.startswith(f"{first} did not run on this page: ")
    message = lost.value.message
    assert f"killed from outside while it held the job (exit code -{signal.SIGKILL.value}" in message
    assert f"in each of {tries} tries" in message
    assert extract(PAGE, runner=solo).extractor == RESILIPARSE and solo.live_workers == 1  # serves on


def _own_pid() -> int:
    return os.getpid()


def test_an_extractor_process_stalled_past_its_limit_is_not_ready_not_the_pages_failure(
    solo: ExtractorPool,
) -> None:
    """A worker stopped (SIGSTOP: a debugger, a frozen cgroup) or starved under a good page was killed at
    the limit and the page written as `extraction_failed`, for good: it hardly ran the page."""
    os.kill(solo.call(_own_pid, (), timeout_s=60), signal.SIGSTOP)
    with pytest.raises(ExtractorLostError) as lost:
        solo.run(RESILIPARSE, PAGE, language=None, timeout_s=0.5)
    assert lost.value.code is ErrorCode.NOT_READY and not isinstance(lost.value, ExtractionError)
    assert lost.value.message.startswith(f"{RESILIPARSE} did not run on this page: ")
    assert "stalled" in lost.value.message
    assert extract(PAGE, runner=solo).extractor == RESILIPARSE  # a fresh worker serves on


def test_an_extractor_process_that_cannot_start_is_not_ready(solo: ExtractorPool) -> None:
    """Not the page's `extraction_failed`: the server's trouble (its forkserver gone with a /tmp
    clean-up, or no file descriptors left), retryable."""
    os.kill(solo.call(_own_pid, (), timeout_s=60), signal.SIGKILL)
    preload, *rest = solo._worker_args
    solo._worker_args = (("service.no_such_module",), *rest)
    with pytest.raises(ExtractorLostError) as lost:
        solo.run(RESILIPARSE, PAGE, language=None, timeout_s=30)
    assert lost.value.code is ErrorCode.NOT_READY
    solo._worker_args = (preload, *rest)
