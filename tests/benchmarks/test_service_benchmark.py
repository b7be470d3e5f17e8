"""benchmarks/service.py reads the server's own /metrics: what it prints must be what the server saw."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import socket
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
    )
    first = bench.ModeResult("dynamic", 4, 1, 1.0, [0.1], {"batch": 2.0})
    bench.write_figures(args, "tiny", "pages", [first])
    written = json.loads(args.json.read_text())
    assert written["modes"]["dynamic"]["errors"] == 1 and written["ratios"] is None
    bench.write_figures(args, "tiny", "pages", [first, bench.ModeResult("single", 2, 0, 1.0, [0.1], {})])
    assert json.loads(args.json.read_text())["ratios"]["docs_per_s"] == 2.0
