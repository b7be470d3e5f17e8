"""Each preprocessing job is in one of three phases (`RunningJobs`, `Phase`): on its thread, waiting for a
process, or its page's try on a process. With processes, what still runs on a preprocessing thread (a
/tokenize listing, the result cache's key hash) had been counted with the tries on processes, and readiness
held it to a process's time limit, which nothing on a thread has. The threads here are real; each job is
held on an event."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from service.engine.preprocessing import Phase, RunningJobs
from tests.factories.waiting import until

HOLD_S = 60.0  # far past what the test needs: only keeps a broken test from hanging


def _phases(jobs: RunningJobs) -> set[Phase]:
    return {phase for phase in Phase if jobs.since(phase) is not None}


def _held(before: Callable[[], None] = lambda: None) -> tuple[Callable[[], str], threading.Event]:
    """A job that calls `before` on its thread, then waits for the event to be set."""
    release = threading.Event()

    def job() -> str:
        before()
        assert release.wait(HOLD_S)
        return "done"

    return job, release


def test_a_job_on_its_thread_is_its_own_phase_and_never_moves_to_a_process() -> None:
    jobs = RunningJobs()
    moved = threading.Event()

    def taken_then_retried() -> None:  # what a pool's callbacks would do: not this job's to follow
        jobs.taken()
        jobs.retried()
        moved.set()

    job, release = _held(taken_then_retried)
    with ThreadPoolExecutor(1) as threads:
        done: Future[str] = threads.submit(jobs.run, job)
        until(moved.is_set, "the job ran its callbacks")
        assert _phases(jobs) == {Phase.THREAD}
        assert jobs.oldest() == jobs.since(Phase.THREAD)  # the Engine's "running since" still sees it
        assert jobs.oldest_waiting() is None
        release.set()
        assert done.result(HOLD_S) == "done"
    assert _phases(jobs) == set()


def test_a_call_to_the_processes_waits_then_runs_on_its_process_apart_from_a_thread_job() -> None:
    jobs = RunningJobs()
    on_thread, thread_release = _held()
    go, took = threading.Event(), threading.Event()

    def taken() -> None:  # a process takes the page once `go` is set
        assert go.wait(HOLD_S)
        jobs.taken()
        took.set()

    call, call_release = _held(taken)
    with ThreadPoolExecutor(2) as threads:
        listing: Future[str] = threads.submit(jobs.run, on_thread)
        until(lambda: jobs.since(Phase.THREAD), "the thread job runs")
        thread_since = jobs.since(Phase.THREAD)
        page: Future[str] = threads.submit(jobs.waiting, call)
        until(jobs.oldest_waiting, "the page waits for a process")
        assert _phases(jobs) == {Phase.THREAD, Phase.WAITING}
        go.set()
        until(took.is_set, "a process took the page")
        assert _phases(jobs) == {Phase.THREAD, Phase.ON_PROCESS}
        assert jobs.since(Phase.THREAD) == thread_since  # not merged with the try on its process
        assert jobs.oldest() == thread_since  # the older of the two

        thread_release.set()
        assert listing.result(HOLD_S) == "done"
        assert _phases(jobs) == {Phase.ON_PROCESS}
        call_release.set()
        assert page.result(HOLD_S) == "done"
    assert _phases(jobs) == set()
