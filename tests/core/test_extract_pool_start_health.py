"""An extractor pool none of whose processes can start says so (`ExtractorPool.start_trouble`), for the
server's readiness to read, and a probe job now and then finds out when one starts again.

Each `/v1/extract` request had failed (503 `not_ready`) while /ready said 200: the pod stayed in
rotation. The processes are real; one that cannot start is made by killing the pool's worker and giving
the next ones a module to import that does not exist (they die while starting).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from service.core.extract import RESILIPARSE, ExtractorLostError, ExtractorPool
from service.core.extract import pool as pool_module
from tests.factories.waiting import until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")

PAGE = "<html><body><article>" + "<p>A page with a few words on it, for an extractor.</p>" * 6
AFTER = 3  # refusals in a row before the pool says it is in trouble (the server's default)


@pytest.fixture
def solo() -> Iterator[ExtractorPool]:
    with ExtractorPool(1) as pool:
        yield pool


def _run(pool: ExtractorPool) -> str:
    return pool.run(RESILIPARSE, PAGE, language=None, timeout_s=60).text


def _no_process_starts(pool: ExtractorPool) -> tuple[Any, ...]:
    """Kill the pool's one worker and make every new one die while it starts; the arguments that start
    one well."""
    (worker,) = pool._idle
    worker.process.kill()
    worker.process.join()
    working = pool._worker_args
    _, limit, initializer, initargs = working
    pool._worker_args = (("htmllm_no_such_module",), limit, initializer, initargs)
    return working


def test_jobs_refused_for_want_of_a_process_are_trouble_until_a_probe_starts_one(
    solo: ExtractorPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=pool_module.__name__)
    served = _run(solo)
    assert solo.start_trouble(AFTER) is None and solo.observe_start_trouble(AFTER) is None
    working = _no_process_starts(solo)
    for refused in range(1, AFTER + 1):
        with pytest.raises(ExtractorLostError, match="died while starting"):
            _run(solo)
        assert solo.start_health.start_failures == refused
        if refused < AFTER:  # below the threshold: traffic decides
            assert solo.start_trouble(AFTER) is None
    since = solo.start_health.failing_since
    assert since is not None
    trouble = solo.start_trouble(AFTER, now=since + 42)
    assert trouble is not None
    assert "no extractor process could start for the last 3 tries over 42 s" in trouble
    assert "died while starting" in trouble

    # The probe's job cannot start one either: counted as a page's refusal would be, still in trouble.
    assert solo.observe_start_trouble(AFTER) is not None
    until(lambda: solo.start_health.start_failures == AFTER + 1, "the failed probe counted")
    assert solo.start_trouble(AFTER) is not None
    said = [
        r for r in caplog.records if "refused until one of the extractor processes starts" in r.getMessage()
    ]
    assert len(said) == 1 and said[0].levelno == logging.WARNING

    monkeypatch.setattr(pool_module, "PROBE_INTERVAL_S", 0.0)  # the next readiness probe sends one at once
    solo._worker_args = working  # the fault passed: the next probe gets a process
    until(lambda: solo.observe_start_trouble(AFTER) is None, "a probe job started a process")
    assert solo.start_health == pool_module.StartHealth()
    # Said by the probe's thread just after it reset the health the wait above reads: waited for too (read
    # at once, it had failed a CI run now and then).
    until(
        lambda: any("extractor processes start again" in r.getMessage() for r in caplog.records),
        "the end of the trouble said",
    )
    assert _run(solo) == served


def test_a_job_a_process_took_ends_the_run_whatever_became_of_its_page(solo: ExtractorPool) -> None:
    _run(solo)
    working = _no_process_starts(solo)
    for _ in range(AFTER):
        with pytest.raises(ExtractorLostError):
            _run(solo)
    assert solo.start_trouble(AFTER) is not None
    solo._worker_args = working
    _run(solo)
    assert solo.start_health.start_failures == 0 and solo.start_trouble(AFTER) is None


def test_a_closed_pool_is_no_trouble_to_report(solo: ExtractorPool) -> None:
    """It refuses on purpose (the server's shutdown): readiness already says that."""
    _run(solo)
    _no_process_starts(solo)
    for _ in range(AFTER):
        with pytest.raises(ExtractorLostError):
            _run(solo)
    solo.close()
    assert solo.start_trouble(AFTER) is None and solo.observe_start_trouble(AFTER) is None


def _refused_run(pool: ExtractorPool) -> None:
    with pytest.raises(ExtractorLostError, match="died while starting"):
        _run(pool)


def _probe_ends(pool: ExtractorPool) -> None:
    """Wait for the probe job `observe_start_trouble` started (there must be one)."""
    probe = pool._probe
    assert probe is not None, "no probe job was started"
    probe.join(60)
    assert not probe.is_alive()


def test_jobs_submitted_together_count_once_however_long_they_wait_for_a_thread(solo: ExtractorPool) -> None:
    """One request's jobs (2 documents x 2 extractors) are submitted at once and run one after another on
    the server's threads: refused in one blip, they are one try. Counted as each began, they had been 4,
    past the threshold on their own."""
    _run(solo)
    _no_process_starts(solo)
    together = [solo.submitted(functools.partial(_refused_run, solo)) for _ in range(4)]
    for job in together:  # one thread: each waits for the one before
        job()
    assert solo.start_health.start_failures == 1 and solo.start_trouble(AFTER) is None
    solo.submitted(functools.partial(_refused_run, solo))()  # a try made after that refusal counts again
    assert solo.start_health.start_failures == 2
    assert "WorkerStartError" not in (solo.start_health.last_error or "")  # the cause, not a class name


def test_a_run_below_the_threshold_is_checked_by_a_probe_that_ends_it(
    solo: ExtractorPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal with no traffic after it had stayed counted until a job got a worker: blips days apart
    added up to "in a row". Once the run has lasted `PROBE_INTERVAL_S` a readiness probe sends a probe
    job, as the backend's check pass; its refusal counts, its success ends the run."""
    _run(solo)
    working = _no_process_starts(solo)
    _refused_run(solo)
    since = solo.start_health.failing_since
    assert since is not None
    assert solo.observe_start_trouble(AFTER, now=since + pool_module.PROBE_INTERVAL_S - 1) is None
    assert solo._probe is None  # too early to check

    monkeypatch.setattr(pool_module, "PROBE_INTERVAL_S", 0.0)
    assert solo.observe_start_trouble(AFTER, now=since) is None  # below the threshold: still ready
    _probe_ends(solo)
    assert solo.start_health.start_failures == 2  # the check was refused too: an idle pod goes unready

    solo._worker_args = working
    assert solo.observe_start_trouble(AFTER, now=since) is None
    _probe_ends(solo)
    assert solo.start_health == pool_module.StartHealth()


def test_a_probe_that_keeps_failing_is_said_once_a_minute(
    solo: ExtractorPool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe job runs every few seconds while no process starts: each failure had been a warning."""
    caplog.set_level(logging.DEBUG, logger=pool_module.__name__)
    monkeypatch.setattr(pool_module, "PROBE_INTERVAL_S", 0.0)
    _run(solo)
    working = _no_process_starts(solo)
    for _ in range(AFTER):
        _refused_run(solo)
    for _ in range(3):
        assert solo.observe_start_trouble(AFTER) is not None
        _probe_ends(solo)
    assert solo.start_health.start_failures == AFTER + 3
    failed = [r for r in caplog.records if "extractor probe failed" in r.getMessage()]
    assert [r.levelno for r in failed] == [logging.WARNING, logging.DEBUG, logging.DEBUG], failed
    assert "died while starting" in failed[0].getMessage() and "Error:" not in failed[0].getMessage()

    solo._worker_args = working
    assert solo.observe_start_trouble(AFTER) is not None
    _probe_ends(solo)
    assert solo.start_trouble(AFTER) is None
    assert any("extractor processes start again" in r.getMessage() for r in caplog.records)
