"""benchmarks/service.py reads the server's own /metrics: what it prints must be what the server saw."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import generate_latest

from service.api.metrics import ServiceMetrics
from tests.benchmarks.scripts import ROOT, load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("service")


def _scrape(metrics: ServiceMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_full_collections_over_the_load_with_their_longest_pause(bench: ModuleType) -> None:
    metrics = ServiceMetrics()
    pause = metrics.gc_pause
    pause.labels(generation="2").observe(0.4)  # before the load (the freeze's own collection)
    pause.labels(generation="0").observe(0.001)
    before = _scrape(metrics)
    for generation, seconds in ((0, 0.00002), (2, 0.2), (2, 0.003), (1, 0.002)):
        pause.labels(generation=str(generation)).observe(seconds)

    out = bench.gc_over_load(before, _scrape(metrics))

    assert out["gc_full_collections"] == 2
    assert out["gc_full_max_ms"] == 250.0  # 0.2 s lies in the (0.1, 0.25] bucket
    assert out["gc_ms"] == pytest.approx(1000 * (0.00002 + 0.2 + 0.003 + 0.002))
    assert bench._full_gc(out) == "2, <250"


def test_a_load_without_full_collections_reads_as_none(bench: ModuleType) -> None:
    metrics = ServiceMetrics()
    metrics.gc_pause.labels(generation="2").observe(0.3)
    scrape = _scrape(metrics)

    out = bench.gc_over_load(scrape, scrape)

    assert out == {"gc_full_collections": 0.0, "gc_full_max_ms": 0.0, "gc_ms": 0.0}
    assert bench._full_gc(out) == "0"


class _Answers(BaseHTTPRequestHandler):
    """A server that answers every POST at once: the clients' own timing is what is tested."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


# The benchmark script under an importable name, for the spawned client processes (they get this
# sys.path). Run in one of them, it first stands still for `_SLOW_IMPORT_S`, as a loaded machine's torch
# import may: the old fixed window (opened 1 s after the parent started them) had passed before they posted.
_SLOW_SCRIPT = """
import multiprocessing, time
if multiprocessing.parent_process() is not None:
    time.sleep({slow_s})
__file__ = {script!r}  # (its ROOT is then the repository's)
exec(compile(open(__file__).read(), __file__, "exec"))
"""
_SLOW_IMPORT_S = 4.0


@pytest.mark.slow
def test_client_processes_open_their_window_when_the_last_one_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawned client processes import the script (and torch) first, seconds each: a window opened at a
    fixed moment ahead passed before they posted (a CPU run of the GPU flags counted 0 docs/s in one
    mode); they now wait for each other, and the window is as long for all. Any answer in the window
    shows it opened after the clients were ready; how many come is the machine's (a CI run loaded
    several times over had none within a 1 s window), so one is asked for, over 3 s."""
    script = str(ROOT / "benchmarks" / "service.py")
    module = tmp_path / "htmllm_service_benchmark.py"
    module.write_text(_SLOW_SCRIPT.format(slow_s=_SLOW_IMPORT_S, script=script))
    monkeypatch.syspath_prepend(str(tmp_path))
    bench = importlib.import_module("htmllm_service_benchmark")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = argparse.Namespace(clients=4, client_processes=2, warmup=0.2, duration=3.0)
        docs, errors, latencies = bench.drive(url, [b"<p>a</p>", b"<p>b</p>"], args)
    finally:
        server.shutdown()
        server.server_close()
    assert errors == 0
    assert docs == len(latencies) >= 1  # hundreds a second on an idle machine; none with the fixed start


def test_a_server_that_is_gone_counts_as_errors_not_a_crash(bench: ModuleType) -> None:
    """A server killed during the window (an out-of-memory error, a driver fault) had ended the script
    with httpx's traceback and no figures: each client now counts its failed post and stops."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: connections refused
        docs, errors, latencies = asyncio.run(
            bench.load(url, [b"<p>x</p>"], clients=3, warmup_s=0.0, duration_s=30.0)
        )
    assert (docs, errors, latencies) == (0, 3, [])


def test_a_mode_that_answered_nothing_gives_nan_ratios(bench: ModuleType) -> None:
    """`--duration` shorter than one answer divided by zero (ZeroDivisionError) before --json was written."""
    answered = bench.ModeResult("dynamic", 4, 0, 1.0, [0.1, 0.2], {})
    silent = bench.ModeResult("single", 0, 0, 1.0, [], {})
    ratios = bench.mode_ratios(answered, silent)
    assert all(value != value for value in ratios.values()), ratios  # nan
    assert bench.mode_ratios(answered, answered) == {"docs_per_s": 1.0, "p99": 1.0, "p50": 1.0}


def test_the_figures_are_written_after_each_mode(bench: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(
        json=tmp_path / "out" / "figures.json",
        device="cpu",
        dtype="float32",
        backend="torch",
        clients=2,
        client_processes=1,
        inference_process=False,
        duration=1.0,
        rounds=2,
    )
    first = bench.ModeResult("dynamic", 4, 1, 1.0, [0.1], {"batch": 2.0})
    bench.write_figures(args, "tiny", "pages", [first], final=False)
    written = json.loads(args.json.read_text())
    assert written["modes"]["dynamic"]["errors"] == 1 and written["ratios"] is None
    both = [first, bench.ModeResult("single", 2, 0, 1.0, [0.1], {})]
    bench.write_figures(args, "tiny", "pages", both, final=False)
    assert json.loads(args.json.read_text())["ratios"] is None  # rounds left to run: not balanced yet
    bench.write_figures(args, "tiny", "pages", both)
    assert json.loads(args.json.read_text())["ratios"]["docs_per_s"] == 2.0


class _Metrics(BaseHTTPRequestHandler):
    """A server's /metrics, as the benchmark scrapes it before and after the load."""

    def do_GET(self) -> None:
        body = b'htmllm_requests_total{route="/v1/embed",status="200"} 3.0\n'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("ending", ["killed", "no final scrape"])
def test_a_mode_whose_server_is_gone_after_the_load_is_failed_not_figures(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """A server that died under the load had been reported from an empty scrape: gc ms -388, 8530 CPU ms
    a request, beside a valid-looking ratio."""
    metrics = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def start_server(model: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
        log.write_text("the server's last words\n")
        return proc, f"http://127.0.0.1:{metrics.server_address[1]}"

    def drive(url: str, pages: list[bytes], args: argparse.Namespace) -> tuple[int, int, list[float]]:
        if ending == "killed":
            proc.kill()
            proc.wait()
        else:
            metrics.shutdown()
            metrics.server_close()
        return 3, 17, [0.5, 0.5, 0.5]

    monkeypatch.setattr(bench, "start_server", start_server)
    monkeypatch.setattr(bench, "drive", drive)
    try:
        args = argparse.Namespace(duration=1.0, rounds=2)
        [result] = bench.run_modes([("dynamic", {})], tmp_path, [b"<p>x</p>"], args, tmp_path)
    finally:
        proc.kill()
        proc.wait()
        metrics.server_close()
    expected = "exited with status -9" if ending == "killed" else "/metrics scrape after round 1 failed"
    assert result.failure is not None and expected in result.failure
    assert result.server == {} and (result.docs, result.errors) == (3, 17)  # the clients' figures stand
    assert len(result.rounds) == 1  # a failed mode runs no more rounds


def _mode(bench: ModuleType, name: str, failure: str | None = None) -> object:
    server = {"batch": 4.0, "batch_tokens": 900.0, "padded_tokens": 1000.0, "pass_ms": 50.0}
    server |= {"host_ms": float("nan"), "prune_ms": 1.0, "tokenize_ms": 1.0, "queue_ms": 9.0}
    server |= {"loop_ms_per_request": 2.0, "cpu_ms_per_request": 40.0}
    server |= {"gc_full_collections": 0.0, "gc_full_max_ms": 0.0, "gc_ms": 3.0}
    return bench.ModeResult(name, 10, 0, 1.0, [0.1, 0.2], {} if failure else server, failure)


def test_a_failed_mode_reads_n_a_and_its_ratio_is_not_comparable(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exit status is 1, the figures n/a, and --json strict JSON: null, never NaN (host_ms is nan on
    every CPU run, and strict parsers refused the file)."""
    failed = _mode(bench, "dynamic", "the server exited with status -9 during the load")
    monkeypatch.setattr(bench, "run_modes", lambda *_: [failed, _mode(bench, "single")])
    figures = tmp_path / "figures.json"
    argv = ["--synthetic", "2", "--model", str(tmp_path), "--json", str(figures)]
    monkeypatch.setattr(sys, "argv", ["service.py", *argv])
    assert bench.main() == 1
    out = capsys.readouterr().out
    assert "dynamic / single: ratio not comparable (dynamic: the server exited with status -9" in out
    dynamic_row = next(line for line in out.splitlines() if line.startswith("dynamic    "))
    assert dynamic_row.split()[1:12] == ["n/a"] * 11
    single_row = next(line for line in out.splitlines() if line.startswith("single    "))
    assert single_row.split()[5] == "n/a"  # host ms: not measured off CUDA

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    written = json.loads(figures.read_text(), parse_constant=refuse)
    assert written["ratios"] is None and written["modes"]["dynamic"]["server"] is None
    assert written["modes"]["dynamic"]["failure"].startswith("the server exited with status -9")
    assert written["modes"]["single"]["server"]["host_ms"] is None


def test_comparable_modes_give_their_ratio_and_exit_0(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "run_modes", lambda *_: [_mode(bench, "dynamic"), _mode(bench, "single")])
    monkeypatch.setattr(sys, "argv", ["service.py", "--synthetic", "2", "--model", str(tmp_path)])
    assert bench.main() == 0
    assert "dynamic / single: 1.00x docs/s" in capsys.readouterr().out


@pytest.mark.parametrize(
    "option",
    [
        ["--limit", "0"],
        ["--duration", "0"],
        ["--clients", "0"],
        ["--client-processes", "0"],
        ["--rounds", "0"],
    ],
)
def test_options_that_cannot_work_are_refused_before_a_server_starts(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, option: list[str]
) -> None:
    """`--limit 0` had started a server, then divided by 0 pages (ZeroDivisionError)."""

    def no_server(*_: object) -> None:
        raise AssertionError("a server was started")

    monkeypatch.setattr(bench, "start_server", no_server)
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html").write_bytes(b"<html><body><p>x</p></body></html>")
    argv = ["service.py", "--corpus", str(tmp_path / "pages"), "--model", str(tmp_path), *option]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as refused:
        bench.main()
    assert refused.value.code == 2


@pytest.mark.parametrize("corpus", ["missing", "empty"])
def test_a_corpus_without_pages_is_one_line_and_exit_2(
    bench: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    corpus: str,
) -> None:
    """A wrong --corpus had ended in a traceback. Refused the way every benchmark script refuses its
    inputs (benchmarks.options.run), which the script's `__main__` goes through (test_script_refusals)."""

    def no_server(*_: object) -> None:
        raise AssertionError("a server was started")

    monkeypatch.setattr(bench, "start_server", no_server)
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(
        sys, "argv", ["service.py", "--corpus", str(tmp_path / corpus), "--model", str(tmp_path)]
    )
    assert bench.run(bench.main) == 2
    err = capsys.readouterr().err
    said = "does not exist" if corpus == "missing" else "no pages in"
    assert err.startswith("service.py: error: ") and said in err and err.count("\n") == 1, err


def test_the_modes_alternate_so_that_neither_always_runs_first(bench: ModuleType) -> None:
    """Run one after the other, dynamic always had the machine first: any drift over the run (heat, a
    neighbour's load, caches) favoured one mode in every run. ABBA weighs a linear drift on both alike."""
    assert bench.round_order(["dynamic", "single"], 2) == ["dynamic", "single", "single", "dynamic"]
    assert bench.round_order(["dynamic", "single"], 4) == ["dynamic", "single", "single", "dynamic"] * 2
    assert bench.round_order(["dynamic", "single"], 1) == ["dynamic", "single"]


class _Registry(BaseHTTPRequestHandler):
    """A server's /metrics from the `ServiceMetrics` the test's fake load updates."""

    metrics: ServiceMetrics

    def do_GET(self) -> None:
        body = _scrape(self.metrics)
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_rounds_alternate_between_servers_up_for_the_whole_run_and_add_up_per_mode(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mode's --duration is split over its rounds; its docs/s is over the summed windows, its
    latencies are every round's, and its server figures add up the loads (a full collection in each
    round: two, the longest of them). Each server starts once and is stopped at the end."""
    registries: dict[str, ServiceMetrics] = {}
    servers: list[ThreadingHTTPServer] = []
    procs: list[subprocess.Popen[bytes]] = []
    started: list[str] = []
    calls: list[tuple[str, float]] = []

    def start_server(model: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
        metrics = ServiceMetrics()
        handler = type("Handler", (_Registry,), {"metrics": metrics})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        registries[url] = metrics
        started.append(log.stem)
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return procs[-1], url

    def drive(url: str, pages: list[bytes], args: argparse.Namespace) -> tuple[int, int, list[float]]:
        name = started[list(registries).index(url)]
        calls.append((name, args.duration))
        docs = 6 if name == "dynamic" else 2 + len(calls)  # single: 4 in the 2nd round, 5 in the 3rd
        metrics = registries[url]
        metrics.requests.labels(route="/v1/embed", method="POST", status="200").inc(docs)
        metrics.gc_pause.labels(generation="2").observe(0.2 if len(calls) == 1 else 0.003)
        return docs, 0, [0.1 * len(calls)] * docs

    monkeypatch.setattr(bench, "start_server", start_server)
    monkeypatch.setattr(bench, "drive", drive)
    seen: list[list[str]] = []
    try:
        args = argparse.Namespace(duration=3.0, rounds=2)
        dynamic, single = bench.run_modes(
            [("dynamic", {}), ("single", {})],
            tmp_path,
            [b"<p>x</p>"],
            args,
            tmp_path,
            lambda partial: seen.append([r.name for r in partial]),
        )
        assert all(proc.poll() is not None for proc in procs)  # stopped at the end
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for server in servers:
            server.shutdown()
            server.server_close()
    assert started == ["dynamic", "single"]
    assert calls == [("dynamic", 1.5), ("single", 1.5), ("single", 1.5), ("dynamic", 1.5)]
    assert seen == [["dynamic"], ["dynamic", "single"], ["dynamic", "single"], ["dynamic", "single"]]
    assert (dynamic.docs, dynamic.seconds, dynamic.docs_per_s) == (12, 3.0, 4.0)
    assert (single.docs, single.seconds, single.docs_per_s) == (9, 3.0, 3.0)
    assert sorted(set(dynamic.latencies)) == pytest.approx([0.1, 0.4])
    assert [(r["position"], r["docs_per_s"]) for r in single.rounds] == [(1, 4 / 1.5), (2, 5 / 1.5)]
    assert [r["position"] for r in dynamic.rounds] == [0, 3]
    assert dynamic.server["gc_full_collections"] == 2 and dynamic.server["gc_full_max_ms"] == 250.0
    assert dynamic.server["gc_ms"] == pytest.approx(1000 * (0.2 + 0.003))
    assert single.server["gc_full_collections"] == 2 and single.server["gc_full_max_ms"] == 5.0
    assert dynamic.failure is None and single.failure is None
