"""The load test's figures: latency of answered requests only, failures counted apart by kind, locust's own
CPU beside the server's, and a verdict that looks at how the server ended. No locust and no server here."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loadtests.client import (
    FAILURE_COLUMNS,
    FINAL_COLUMNS,
    LatencyCounts,
    RunStats,
    connection_error,
    error_code,
    request_failure,
    write_csv,
)
from loadtests.report import markdown, passed, read_stats, summarize
from loadtests.sampler import ServerSample, ServerSampler, generator_cpu_summary


class _Clock:
    """A clock the test moves: one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _overloaded(n: int) -> bytes:
    # The message carries numbers that change from one answer to the next; the code does not.
    return json.dumps({"error": {"code": "overloaded", "message": f"{n} documents queued"}}).encode()


def test_percentiles_are_over_answered_requests_and_failures_are_counted_by_kind(tmp_path: Path) -> None:
    """429s answered in 6 ms had pulled a p50 of 262 ms down to 15 ms: locust records a failure's time
    as it does an answer's."""
    stats = RunStats(clock=_Clock())
    for i in range(10):
        stats.request("/v1/embed json x1", 260.0 + i, None)
    for i in range(30):
        failure = request_failure(429, _overloaded(i), None, ["p"])
        stats.request("/v1/embed json x1", 5.7, failure)
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    stats.request("/v1/embed raw text/html", 1.0, request_failure(0, None, refused, ["p"]))
    stats.stages({"x-total-time": "250.5", "x-queue-time": "n/a"})

    rows = {(r["type"], r["name"]): r for r in stats.rows()}
    json_row = rows[("POST", "/v1/embed json x1")]
    assert (json_row["requests"], json_row["failures"]) == ("40", "30")
    assert (json_row["p50_ms"], json_row["p99_ms"], json_row["max_ms"]) == ("264", "269", "269")
    raw = rows[("POST", "/v1/embed raw text/html")]
    assert (raw["requests"], raw["failures"], raw["p50_ms"], raw["max_ms"]) == ("1", "1", "", "")
    assert rows[("stage", "x-total-time")]["p50_ms"] == "250" and ("stage", "x-queue-time") not in rows
    # One row per kind, not one per distinct message.
    assert stats.failure_rows() == [
        {"type": "POST", "name": "/v1/embed json x1", "failure": "HTTP 429 overloaded", "count": "30"},
        {
            "type": "POST",
            "name": "/v1/embed raw text/html",
            "failure": "HTTP 0 ConnectionRefusedError: Connection refused",
            "count": "1",
        },
    ]

    write_csv(tmp_path / "summary.csv", FINAL_COLUMNS, stats.rows())
    write_csv(tmp_path / "failures.csv", FAILURE_COLUMNS, stats.failure_rows())
    summary = summarize(read_stats(tmp_path / "summary.csv"), 1, 10.0, read_stats(tmp_path / "failures.csv"))
    assert summary["endpoints"]["/v1/embed json x1"]["p50_ms"] == 264
    assert summary["endpoints"]["/v1/embed raw text/html"]["p50_ms"] is None  # none answered
    assert summary["failures_by_kind"] == {
        "HTTP 429 overloaded": 30,
        "HTTP 0 ConnectionRefusedError: Connection refused": 1,
    }
    assert summary["failures_by_status"] == {"0": 1, "429": 30}
    assert summary["endpoints"]["/v1/embed json x1"]["failures_by_kind"] == {"HTTP 429 overloaded": 30}
    table = markdown(_reported(summary))
    assert "| failed: HTTP 429 overloaded | | 30 | | | |" in table
    assert "| POST /v1/embed raw text/html | 1 | 1 | n/a | n/a | n/a |" in table
    assert "| POST /v1/embed json x1 | 40 | 30 | 264 |" in table


def test_failure_names_do_not_carry_changing_text() -> None:
    assert request_failure(429, _overloaded(7), None, ["p"]) == request_failure(429, _overloaded(8), None, [])
    assert request_failure(503, b"<html>Service Unavailable</html>", None, ["p"]) == "HTTP 503"
    assert request_failure(500, b'{"error": {"code": "a long message with spaces"}}', None, []) == "HTTP 500"
    good = json.dumps({"data": [{"id": "p", "embedding": [0.1]}]}).encode()
    assert request_failure(200, good, None, ["p"]) is None
    assert request_failure(200, good, None, ["q"]) == "HTTP 200 ids not those sent, in order"
    assert request_failure(200, b"", None, ["p"]) == "HTTP 200 response is not an embed result"
    # No answer at all: the error says what happened (it had read `HTTP 0: `).
    assert request_failure(0, None, TimeoutError(), ["p"]) == "HTTP 0 TimeoutError"
    assert request_failure(0, None, None, ["p"]) == "HTTP 0 no response"
    reset = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    assert connection_error(reset) == "ConnectionResetError: Connection reset by peer"
    assert error_code(b"not json") is None and error_code(b'{"error": "x"}') is None


def test_nearest_rank_percentiles() -> None:
    counts = LatencyCounts()
    assert counts.percentile(0.5) is None
    for milliseconds in (1, 2, 3, 4, 100):
        counts.add(milliseconds)
    assert [counts.percentile(q) for q in (0.2, 0.5, 0.8, 0.99)] == [1, 3, 4, 100]


def _reported(summary: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A summary as `loadtests.run` completes it, with `changes`."""
    return {
        **summary,
        "model": "tiny",
        "backend": "torch on cpu",
        "model_max_length": 8,
        "users": 2,
        "run_seconds": 10,
        "pages": "synthetic",
        "machine": "x86_64",
        "server_exit_status": 0,
        "server_exited_during_run": None,
        **changes,
    }


def _clean_summary() -> dict[str, Any]:
    row = {"p50_ms": "5", "p95_ms": "9", "p99_ms": "12", "max_ms": "20"}
    rows = [{**row, "type": "POST", "name": "/v1/embed json x1", "requests": "10", "failures": "0"}]
    return summarize(rows, 1, 10.0, [])


@pytest.mark.parametrize("status", [0, -signal.SIGTERM])
def test_a_server_that_drained_passes(status: int) -> None:
    summary = _reported(_clean_summary(), server_exit_status=status)
    assert passed(summary, 0)
    assert f"server drained and exited with status {status} after SIGTERM" in markdown(summary)


@pytest.mark.parametrize("status", [143, 1, -signal.SIGKILL, None])
def test_a_server_that_did_not_drain_fails_the_run(status: int | None) -> None:
    """143 is the server's own status for a SIGTERM before it served: another server on its port had
    answered the whole run, which passed (0 requests failed)."""
    summary = _reported(_clean_summary(), server_exit_status=status)
    assert not passed(summary, 0)
    assert "the run FAILED" in markdown(summary)


def test_a_server_that_died_during_the_run_fails_it_and_says_when() -> None:
    died = {"status": -signal.SIGKILL, "seconds": 15.2}
    summary = _reported(_clean_summary(), server_exit_status=-signal.SIGKILL, server_exited_during_run=died)
    assert not passed(summary, 0)
    assert "server exited with status -9 at 15 s into the run" in markdown(summary)


def test_the_load_generator_near_one_core_is_flagged() -> None:
    idle = [ServerSample(float(i), 500.0, 1.0, 0.5, 0.0, 0.3) for i in range(10)]
    summary = generator_cpu_summary([ServerSample(0.0, 500.0, None, None, None), *idle])
    assert summary is not None and summary["intervals"] == 10 and not summary["near_one_core"]
    assert summary["cores_mean"] == pytest.approx(0.3)
    busy = idle[:8] + [ServerSample(9.0, 500.0, 1.0, 0.9, 0.0, 0.97)] * 2
    flagged = generator_cpu_summary(busy)
    assert flagged is not None and flagged["near_one_core"] and flagged["cores_max"] == 0.97
    assert "NEAR ONE CORE" in markdown(_reported(_clean_summary(), generator_cpu=flagged))
    assert "NEAR ONE CORE" not in markdown(_reported(_clean_summary(), generator_cpu=summary))
    assert generator_cpu_summary(idle[:1]) is None


def test_the_sampler_reads_the_generators_cpu_beside_the_servers() -> None:
    """Locust's CPU had not been read: a run where it used a whole core measured locust. Waits for the
    burner's CPU seconds, not for a time."""
    burn = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 60: sum(range(1000))"
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    generator = subprocess.Popen([sys.executable, "-c", burn])
    try:
        sampler = ServerSampler(server.pid, interval=0.1, generator_pid=generator.pid)
        for _ in range(200):  # bounded: 200 samples, each after the previous one
            sampler.sample()
            readings = [s.generator_cpu for s in sampler.samples if s.generator_cpu]
            if sum(readings) > 0.2:
                break
            time.sleep(0.05)
        assert sampler.samples[0].generator_cpu is None  # the first reading has no interval yet
        assert sum(s.generator_cpu or 0 for s in sampler.samples) > 0.2
        alone = ServerSampler(server.pid, 1.0)
        alone.sample()
        alone.sample()
        assert alone.samples[-1].generator_cpu is None and alone.samples[-1].server_cpu is not None
    finally:
        for process in (server, generator):
            process.kill()
            process.wait()
