"""The load test: the page generator's size distribution, the users' payloads and checks, the driver's
bounds, and one short real run (a uvicorn server on 127.0.0.1 with a tiny checkpoint, locust headless).

Nothing here imports locust in the test process: locust monkey-patches the standard library with gevent
on import, so the real run goes through `python -m loadtests.run` in a subprocess, as `make loadtest`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from selectolax.lexbor import LexborHTMLParser

from loadtests import pagegen
from loadtests import run as loadtest_run
from loadtests.client import (
    STAGE_HEADERS,
    LoadPage,
    check_embed_response,
    embed_body,
    load_pool,
    stage_times,
)
from loadtests.launch import HOST, locust_environment, server_environment
from loadtests.procfs import (
    _children_by_scan,
    _started_by,
    host_cpu_seconds,
    process_cpu_seconds,
    process_tree,
    server_memory_mb,
)
from loadtests.report import summarize
from loadtests.run import bounded_duration, bounded_users, build_parser, parse_duration
from loadtests.sampler import ServerSample, ServerSampler, cpu_summary, memory_trend
from service.core.pages import PageSourceError
from service.core.precheck.nesting import DEFAULT_MAX_DEPTH, estimate_depth
from service.core.prune import prune_html

ROOT = Path(__file__).resolve().parents[2]


def test_sizes_follow_the_fitted_log_normal() -> None:
    rng = random.Random(7)
    sizes = [pagegen.draw_size(rng) for _ in range(4000)]
    assert min(sizes) >= pagegen.SIZE_MIN_BYTES and max(sizes) <= pagegen.SIZE_MAX_BYTES
    median = statistics.median(sizes)
    assert abs(median / pagegen.SIZE_MEDIAN_BYTES - 1) < 0.1
    logs = [math.log(s) for s in sizes]
    assert abs(statistics.pstdev(logs) - pagegen.SIZE_LOG_SIGMA) < 0.08
    # A long tail: a tenth of the pages are three times the median or more, as in crawled HTML.
    assert 0.05 < sum(s > 3 * median for s in sizes) / len(sizes) < 0.15


@pytest.mark.parametrize("size", [2_000, 60_000, 400_000])
def test_pages_reach_their_size_and_look_like_pages(size: int) -> None:
    page = pagegen.generate_page(random.Random(size), size)
    # At least the target, overshooting by at most about one block of each kind.
    assert size <= len(page) <= size + 40_000
    text = page.decode("utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    tree = LexborHTMLParser(text)
    assert tree.css_first("article h1") is not None and tree.css("article p")
    scripts = " ".join(node.text(deep=True) or "" for node in tree.css("script"))
    if size >= 60_000:
        # The corpus's byte shares: inline scripts and styles about a fifth of the page, not most of it.
        styles = sum(len(node.text(deep=True) or "") for node in tree.css("style"))
        assert 0.1 < (len(scripts) + styles) / len(page) < 0.4
        # `<` before a letter inside scripts is about as rare as in crawled pages (p90: 1.3 per KB).
        assert len(re.findall(r"<[a-zA-Z]", scripts)) / (len(scripts) / 1000) < 1.3
    # Nothing here trips the pruner's nesting cap; the page prunes to something smaller.
    assert estimate_depth(text) < DEFAULT_MAX_DEPTH // 8
    pruned = prune_html(page)
    assert 0 < len(pruned) < len(page)


def test_generation_is_deterministic() -> None:
    first = [p.html for _, p in zip(range(3), pagegen.synthetic_pages(3), strict=False)]
    again = [p.html for _, p in zip(range(3), pagegen.synthetic_pages(3), strict=False)]
    other = [p.html for _, p in zip(range(3), pagegen.synthetic_pages(4), strict=False)]
    assert first == again and first != other


def test_pool_from_a_corpus_directory(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_bytes("<html><body><p>Grüße aus Köln</p></body></html>".encode("cp1252"))
    (tmp_path / "b.html").write_bytes(b"<html><body><p>plain</p></body></html>")
    pool = load_pool(tmp_path, 10, seed=0)
    assert len(pool) == 2
    assert pool[0].html.startswith(b"<html>") and "Grüße" in pool[0].text  # decoded, bytes kept raw
    assert len(load_pool("", 3, seed=1)) == 3
    with pytest.raises(PageSourceError, match="no pages"):
        load_pool(tmp_path, 0, seed=0)


def test_embed_body_and_response_check() -> None:
    pages = [LoadPage(id="p", html=b"<p>x</p>", text="<p>x</p>")] * 2
    body = json.loads(embed_body(pages, ["p#0", "p#1"]))
    assert body == {"documents": [{"id": "p#0", "html": "<p>x</p>"}, {"id": "p#1", "html": "<p>x</p>"}]}
    good = json.dumps({"data": [{"id": "p#0", "embedding": [0.1]}, {"id": "p#1", "embedding": "AAAA"}]})
    assert check_embed_response(good.encode(), ["p#0", "p#1"]) is None
    # Words that are the same for every response wrong that way: they name the failure in the reports.
    assert check_embed_response(good.encode(), ["p#1", "p#0"]) == "ids not those sent, in order"
    empty = json.dumps({"data": [{"id": "p#0", "embedding": []}]})
    assert check_embed_response(empty.encode(), ["p#0"]) == "empty embedding"
    assert check_embed_response(b"<html>", ["p#0"]) == "response is not an embed result"
    assert check_embed_response(b'{"data": 3}', ["p#0"]) == "response is not an embed result"


def test_stage_headers_are_read_as_milliseconds() -> None:
    headers = {"x-prune-time": "1.250", "x-queue-time": "n/a", "x-total-time": "9", "server": "uvicorn"}
    assert stage_times(headers) == {"x-prune-time": 1.25, "x-total-time": 9.0}
    assert set(STAGE_HEADERS) >= {"x-prune-time", "x-queue-time", "x-inference-time", "x-total-time"}


def test_runs_are_bounded_and_local() -> None:
    assert parse_duration("90") == 90 and parse_duration("1h30m") == 5400 and parse_duration("10m") == 600
    with pytest.raises(argparse.ArgumentTypeError):
        bounded_duration("3h")
    with pytest.raises(argparse.ArgumentTypeError):
        bounded_duration("soon")
    with pytest.raises(argparse.ArgumentTypeError):
        bounded_users("1000")
    args = build_parser().parse_args(["--server-env", "HTMLLM_MAX_WAIT_MS=5"])
    env = server_environment(args, 12345)
    assert (env["HTMLLM_HOST"], env["HTMLLM_PORT"], env["HTMLLM_MAX_WAIT_MS"]) == (HOST, "12345", "5")
    assert HOST == "127.0.0.1"
    for bad in ("HTMLLM_HOST=0.0.0.0", "HTMLLM_PORT=1", "PATH=/tmp", "FOO=1", "HTMLLM_X", "HTMLLM_=1"):
        with pytest.raises(SystemExit) as refused:
            build_parser().parse_args(["--server-env", bad])
        assert refused.value.code == 2, bad  # a usage error, as documented (it had been exit 1)


@pytest.mark.parametrize("setting", ["FOO=1", "HTMLLM_PORT=1"])
def test_a_server_setting_the_driver_refuses_is_a_usage_error_before_the_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], setting: str
) -> None:
    """`--server-env FOO=1` had exited 1 (a SystemExit with a message), where 2 is documented for bad
    options."""

    def no_server(*_: object) -> None:
        raise AssertionError("the server was started")

    monkeypatch.setattr(loadtest_run, "start_server", no_server)
    with pytest.raises(SystemExit) as refused:
        loadtest_run.main(["--server-env", setting, "--out", str(tmp_path / "out")])
    assert refused.value.code == 2
    assert "--server-env" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    [
        ["--page-pool", "0"],
        ["--docs-per-request", "0"],  # the users sent 1 a request; the summary counted 0 documents
        ["--docs-per-request", "x"],
        ["--raw-share", "2"],
        ["--raw-share", "-0.1"],
        ["--raw-share", "x"],
    ],
)
def test_options_that_cannot_work_are_usage_errors(option: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(option)
    assert refused.value.code == 2
    args = build_parser().parse_args(["--page-pool", "1", "--docs-per-request", "4", "--raw-share", "1"])
    assert (args.page_pool, args.docs_per_request, args.raw_share) == (1, 4, 1.0)


def test_a_corpus_without_pages_is_refused_before_the_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the users' on_start, it cost the server's start (~10 s) and ended in a traceback per user
    and a summary of 0 requests that never named the corpus."""

    def no_server(*_: object) -> None:
        raise AssertionError("the server was started")

    monkeypatch.setattr(loadtest_run, "start_server", no_server)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    for corpus, said in ((tmp_path / "missing", "does not exist"), (tmp_path / "empty", "no pages in")):
        assert loadtest_run.main(["--corpus", str(corpus), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("loadtest: error: --corpus: ") and said in err and err.count("\n") == 1
    assert not out.exists()
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html").write_bytes(b"<html><body><p>x</p></body></html>")
    assert loadtest_run.pool_problem(str(tmp_path / "pages"), 5) is None
    assert loadtest_run.pool_problem("", 5) is None  # synthetic pages never run dry


def test_locust_sends_the_key_the_server_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key passed as --server-env reaches the users too, or every request of the run gets 401."""
    monkeypatch.delenv("HTMLLM_API_KEY", raising=False)
    args = build_parser().parse_args(["--server-env", "HTMLLM_API_KEY=run-key"])
    assert locust_environment(server_environment(args, 1))["HTMLLM_API_KEY"] == "run-key"
    assert "HTMLLM_API_KEY" not in locust_environment(server_environment(build_parser().parse_args([]), 1))
    monkeypatch.setenv("HTMLLM_API_KEY", "shell-key")  # the server inherits it, and so do the users
    assert locust_environment(server_environment(build_parser().parse_args([]), 1))["HTMLLM_API_KEY"] == (
        "shell-key"
    )
    assert locust_environment(server_environment(args, 1))["HTMLLM_API_KEY"] == "run-key"
    assert str(ROOT) in locust_environment({})["PYTHONPATH"].split(os.pathsep)


def test_documents_per_second_counts_answered_requests_only() -> None:
    row = {"p50_ms": "5", "p95_ms": "9", "p99_ms": "12", "max_ms": "20"}
    rows = [
        {**row, "type": "POST", "name": "/v1/embed json x4", "requests": "100", "failures": "40"},
        {**row, "type": "POST", "name": "/v1/embed raw text/html", "requests": "10", "failures": "0"},
        {**row, "type": "stage", "name": "x-total-time", "requests": "70", "failures": "0"},
    ]
    summary = summarize(rows, docs_per_request=4, run_seconds=10.0)
    assert (summary["requests"], summary["failures"]) == (110, 40)
    assert summary["requests_per_s"] == 11.0
    # 60 answered JSON requests of 4 documents and 10 raw pages; the 40 refused ones embedded nothing.
    assert summary["documents_per_s"] == (60 * 4 + 10) / 10
    assert set(summary["stages"]) == {"x-total-time"}


@pytest.mark.slow
def test_memory_trend_sees_growth_in_the_second_half_only() -> None:
    # Warm-up growth in the first half, flat after it: no slope.
    warm = [(float(t), 500.0 + min(t, 50) * 4) for t in range(0, 200, 10)]
    trend = memory_trend(warm)
    assert trend is not None and trend["second_half_mb_per_min"] == 0 and trend["samples"] == 20
    assert trend["first_half_median_mb"] == 680 and trend["second_half_median_mb"] == 700
    # A leak of 1 MB every 10 s is 6 MB/min.
    leak = [(float(t), 500.0 + t / 10) for t in range(0, 200, 10)]
    trend = memory_trend(leak)
    assert trend is not None and math.isclose(float(trend["second_half_mb_per_min"] or 0), 6.0)
    assert trend["max_mb"] == 519
    assert memory_trend([]) is None and memory_trend([(0.0, 1.0), (10.0, 1.0), (20.0, 1.0)]) is None


def test_the_sampler_reads_a_live_process_and_sees_it_burn_cpu() -> None:
    # Another process keeps one core busy, as the server would: sampling a busy thread of this process
    # would make the sampler wait for the GIL instead.
    burn = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 3: sum(range(1000))"
    busy = subprocess.Popen([sys.executable, "-c", burn])
    time.sleep(0.2)  # past the interpreter's start
    sampler = ServerSampler(busy.pid, interval=0.1)
    burnt_before, window_start = process_cpu_seconds(busy.pid), time.monotonic()
    sampler.start()
    time.sleep(0.6)
    samples = sampler.stop()
    burnt_after, window = process_cpu_seconds(busy.pid), time.monotonic() - window_start
    busy.kill()
    busy.wait()
    assert len(samples) >= 4 and all(s.rss_mb > 0 for s in samples)
    assert [s.seconds for s in samples] == sorted(s.seconds for s in samples)
    assert samples[0].server_cpu is None and samples[0].host_busy is None
    cpu = [s.server_cpu for s in samples[1:-1] if s.server_cpu is not None]
    # Busy-looping for the whole interval is about one core; clock ticks make a short interval coarse.
    assert burnt_before is not None and burnt_after is not None
    share = (burnt_after - burnt_before) / window  # the cores it got here: 1 idle, less on a loaded machine
    assert cpu and 0.5 * share < statistics.fmean(cpu) < 1.5 * share + 0.1, (cpu, share)
    assert max(cpu) < (os.cpu_count() or 1) + 0.5
    assert all(0 <= (s.host_busy or 0) <= 1 and 0 <= (s.host_steal or 0) <= 1 for s in samples)
    assert not sampler.is_alive()


def test_cpu_readings_are_monotonic_and_gone_with_the_process() -> None:
    first, host_first = process_cpu_seconds(os.getpid()), host_cpu_seconds()
    sum(i * i for i in range(200_000))
    second, host_second = process_cpu_seconds(os.getpid()), host_cpu_seconds()
    assert first is not None and second is not None and second >= first
    assert host_first is not None and host_second is not None
    assert host_second.total >= host_first.total and 0 <= host_second.busy <= host_second.total
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_cpu_seconds(child.pid) is None  # reaped: no /proc entry left


def test_the_server_includes_its_child_processes() -> None:
    """The model (HTMLLM_INFERENCE_PROCESS) and the preprocessing may run in children: their memory and
    CPU are the server's."""
    burn = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 60: sum(range(1000))"
    holder = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', sys.argv[1]])"
    parent = subprocess.Popen([sys.executable, "-c", holder, burn])  # idle; its child burns a core
    try:
        deadline = time.monotonic() + 10
        while len(process_tree(parent.pid)) < 2:
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        by_scan = _children_by_scan()
        assert sorted(by_scan(parent.pid)) == sorted(_started_by(parent.pid)) != []
        alone = server_memory_mb(parent.pid)
        first = process_cpu_seconds(parent.pid)
        assert first is not None
        # Until the child has burnt 0.4 CPU seconds: on a machine shared with other work that can take
        # longer than 0.4 s of wall time, so wait for the CPU rather than for a fixed time.
        burnt, deadline = 0.0, time.monotonic() + 30
        while burnt <= 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
            second = process_cpu_seconds(parent.pid)
            assert second is not None
            burnt = second - first
        assert burnt > 0.4  # the child's work: the parent itself is idle
        own = Path(f"/proc/{parent.pid}/status").read_text()
        own_rss_kb = int(next(line for line in own.splitlines() if line.startswith("VmRSS")).split()[1])
        assert alone is not None and alone["rss_mb"] > own_rss_kb / 1024  # the child's memory too
    finally:
        for child in _started_by(parent.pid):  # the burner, which this test started through its parent
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        parent.wait(timeout=30)
    assert process_tree(os.getpid())[0] == os.getpid()


def test_cpu_summary_reports_the_cores_the_server_got() -> None:
    samples = [ServerSample(0.0, 500.0, None, None, None)]
    samples += [
        ServerSample(10.0 * i, 500.0, cores, 0.9, 0.05) for i, cores in enumerate([1.0] * 9 + [0.2], 1)
    ]
    summary = cpu_summary(samples)
    assert summary is not None and summary["intervals"] == 10
    assert math.isclose(float(summary["server_cores_mean"]), 0.92)
    assert summary["server_cores_p10"] < 1.0 and summary["server_cores_p90"] == 1.0
    assert summary["host_busy_mean"] == 0.9 and summary["host_steal_mean"] == 0.05
    assert cpu_summary(samples[:2]) is None  # one interval says nothing about a trend


def test_a_short_real_run_has_no_failures(tmp_path: Path) -> None:
    """`make loadtest` in miniature: server on 127.0.0.1, locust headless, reports written, 0 failures."""
    from tests.factories.checkpoint import build_tiny_checkpoint  # imports torch: only this test needs it

    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "loadtests.run", "--users", "2", "--spawn-rate", "2", "--run-time", "4s"]
    command += ["--model", str(checkpoint), "--out", str(out), "--page-pool", "8", "--raw-share", "0.5"]
    # The server wants a key, given to it alone: the users must send it (a 401 is a failure).
    command += ["--sample-interval", "1", "--server-env", "HTMLLM_API_KEY=loadtest-key"]
    env = {name: value for name, value in os.environ.items() if name != "HTMLLM_API_KEY"}
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, (
        result.stdout[-3000:] + result.stderr[-3000:] + (out / "server.log").read_text()
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 0 and summary["failures"] == 0 and summary["error_rate"] == 0
    assert summary["model"] == "tiny-test"
    assert summary["server_memory"]["end"]["rss_mb"] > 0
    with (out / "server.csv").open() as handle:
        series = list(csv.DictReader(handle))
    assert len(series) >= 2 and all(float(row["rss_mb"]) > 0 for row in series)
    assert series[0]["server_cpu"] == "" and all(float(row["server_cpu"]) >= 0 for row in series[1:])
    assert summary["server_cpu"]["intervals"] >= 2 and summary["server_cpu"]["server_cores_mean"] > 0
    assert summary["stages"]["x-total-time"]["p50_ms"] > 0
    with (out / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["name"] for r in rows if r["type"] == "stage"} == set(STAGE_HEADERS)
    # Locust's own statistics count the POSTs only: the stage headers, fired as locust requests, had
    # made its Aggregated row six times the real request count and rate.
    with (out / "locust_stats.csv").open() as handle:
        locust_rows = list(csv.DictReader(handle))
    assert {r["Type"] for r in locust_rows} == {"POST", ""}  # "": the Aggregated row
    aggregated = next(r for r in locust_rows if r["Name"] == "Aggregated")
    # (locust_stats.csv is written every few seconds: it may lag the final count, never pass it)
    posts = sum(int(r["requests"]) for r in rows if r["type"] == "POST")
    assert 0 < int(aggregated["Request Count"]) <= posts
    assert (out / "failures.csv").read_text().splitlines() == ["type,name,failure,count"]
    assert summary["failures_by_kind"] == {} and summary["failures_by_status"] == {}
    # Locust's CPU beside the server's, read from its own process.
    assert all("generator_cpu" in row for row in series)
    assert summary["generator_cpu"]["intervals"] >= 2 and summary["generator_cpu"]["cores_mean"] > 0
    assert summary["server_exited_during_run"] is None
    assert "server drained and exited with status" in result.stdout
    assert "<html" in (out / "report.html").read_text()[:2000].lower()
    # SIGTERM drained the server and it exited by itself (uvicorn re-raises the signal once it is done).
    assert summary["server_exit_status"] in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in (out / "server.log").read_text()
