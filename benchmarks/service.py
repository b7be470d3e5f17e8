"""Benchmark the HTTP service: dynamic batching vs one document per forward pass, in one run.

    .venv/bin/python benchmarks/service.py --corpus ../shared/corpus

The same server (`python -m service.api`, a real uvicorn process on 127.0.0.1) is started twice on the
same checkpoint: once with dynamic batching (`--batch-requests`, default 32) and once with
`HTMLLM_MAX_BATCH_REQUESTS=1`. Both stay up for the whole run and are loaded in turn, in `--rounds`
rounds per mode (default 2) whose order alternates: dynamic, single, single, dynamic. Run one after the
other, the first mode had always had the machine as it was first (cooler, caches colder, a neighbour's
load not yet come or gone), a drift that favoured one mode in every run; in this order a drift linear
over the run weighs on both alike. In each round `--clients` concurrent clients (default 32) post
shared-corpus pages (raw bytes, `application/octet-stream`, one page per request, cycling through the
pages) for `--duration / --rounds` seconds after a `--warmup`; answers received inside the window count.
Reported per mode, over its rounds: docs/s (answers over the summed windows), p50/p99 latency (of every
answer), errors, mean batch size (from the server's own /metrics); each round's docs/s in run order;
then the docs/s ratio and the p99 ratio.

`--synthetic N` posts N generated pages instead (`loadtests.pagegen`: sizes and markup shares fitted to
the corpus), for a machine without the corpus (the GPU machine: benchmarks/gpu_device_run.sh);
`--device cuda --dtype bfloat16` runs both servers on the GPU, and `--json` writes the figures.

The model is the bundled default (`service/assets/default-model`) when it exists, else `--model`, else
the `mini` preset with random weights built here (speed does not depend on the weights) and a tokenizer
trained on the corpus, exactly as `benchmarks/engine.py` builds it. The clients run in this process, so
on a small machine they compete with the server for the same cores (as they would with a co-located
crawler); that cost is the same in both modes. One process of clients posts at most about 300 corpus-sized
pages a second (against a server that does nothing, on the 2-core VM: 327 docs/s, p99 510 ms; two
processes: 549 docs/s, p99 360 ms), so where the server is faster than that (a GPU) the figures would
be the client's: `--client-processes N` spreads the clients over N processes that share one window.

A mode whose server exits under the load, or whose /metrics scrape after a round fails, is a failed mode
(it runs no more rounds): its server-side figures read n/a (from an empty scrape they had read as a batch
of nan, -388 ms of garbage collection and 8530 CPU ms a request), the ratio is "not comparable", and the
exit status is 1. `--json` writes null where a figure is not known (never NaN, which strict JSON parsers
refuse); it is written after every round, its ratios once every round has run. Options that
cannot work (`--limit 0`, a `--corpus` with no pages) are refused in one line, exit 2, before a server
starts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.options import positive_float, run  # noqa: E402
from loadtests.procfs import own_cpu_seconds  # noqa: E402
from service.api.settings import default_model_path  # noqa: E402
from service.commands.options import at_least  # noqa: E402
from service.core.pages import PageSourceError, iter_pages  # noqa: E402
from service.core.quantization import NO_QUANTIZATION, QUANTIZATION_CHOICES  # noqa: E402
from service.engine.collector import prepare_for_serving  # noqa: E402


@dataclass
class ModeResult:
    name: str
    docs: int
    errors: int
    seconds: float
    latencies: list[float]
    server: dict[str, float]
    # Why the mode's figures are not the server's (it exited under the load, or its /metrics scrape
    # after a round failed), or None. A failed mode's server figures are empty and its ratio is not
    # comparable.
    failure: str | None = None
    # Each round's own figures (`round_figures`), in the order they ran: what a drift did shows here.
    rounds: list[dict[str, float]] = field(default_factory=list)

    @property
    def docs_per_s(self) -> float:
        """Answers over the summed windows (nan before any window: a server gone before its first round)."""
        return self.docs / self.seconds if self.seconds else float("nan")

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q)


def percentile(latencies: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of `latencies`; nan for none."""
    if not latencies:
        return float("nan")
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _engine_benchmark() -> ModuleType:
    """benchmarks/engine.py, for its random-weight checkpoint builder (one implementation of it)."""
    spec = importlib.util.spec_from_file_location(
        "htmllm_engine_benchmark", ROOT / "benchmarks" / "engine.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_checkpoint(
    path: Path, pages: list[bytes], *, preset: str, max_length: int, vocab_size: int
) -> Path:
    engine_benchmark = _engine_benchmark()
    tokenizer = engine_benchmark.corpus_tokenizer(pages, vocab_size=vocab_size)
    built: Path = engine_benchmark.build_checkpoint(path, tokenizer, preset=preset, max_length=max_length)
    return built


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(
    model: Path, env_overrides: dict[str, str], log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env.update(
        {
            "HTMLLM_MODEL_PATH": str(model),
            "HTMLLM_HOST": "127.0.0.1",
            "HTMLLM_PORT": str(port),
            "HTMLLM_LOG_LEVEL": "warning",
            "HTMLLM_MAX_QUEUE_DOCUMENTS": "4096",  # measure throughput, not backpressure
            "HTMLLM_REQUEST_TIMEOUT_S": "300",
            # Keep what PYTHONPATH already holds: on the GPU machine the service's wheels live there.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    env.update(env_overrides)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.api"], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready in 600 s")


def server_breakdown(metrics: str) -> dict[str, float]:
    """Means from the server's own /metrics: batch size and tokens, and per-document stage times."""

    def value(name: str, labels: str = "") -> float:
        match = re.search(rf"^{re.escape(name + labels)} (\S+)$", metrics, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def mean(name: str, labels: str = "") -> float:
        count = value(f"{name}_count", labels)
        return value(f"{name}_sum", labels) / count if count else float("nan")

    out = {
        "batch": mean("htmllm_batch_size"),
        "batch_tokens": mean("htmllm_batch_tokens"),
        "padded_tokens": mean("htmllm_batch_padded_tokens"),
        "pass_ms": mean("htmllm_batch_inference_seconds") * 1000,
        "host_ms": mean("htmllm_batch_host_seconds") * 1000,  # CUDA only (nan elsewhere)
    }
    for stage in ("prune", "tokenize", "queue"):
        out[f"{stage}_ms"] = mean("htmllm_stage_duration_seconds", f'{{stage="{stage}"}}') * 1000
    return out


def _gc_series(metrics: str) -> tuple[dict[str, float], float]:
    """Full collections' histogram buckets (upper bound -> cumulative count) and all collections' seconds."""
    buckets = {
        bound: float(count)
        for bound, count in re.findall(
            r'^htmllm_gc_pause_seconds_bucket\{generation="2",le="([^"]+)"\} (\S+)$', metrics, re.MULTILINE
        )
    }
    seconds = re.findall(r'^htmllm_gc_pause_seconds_sum\{generation="\d"\} (\S+)$', metrics, re.MULTILINE)
    return buckets, sum(float(value) for value in seconds)


def gc_over_load(before: str, after: str) -> dict[str, float]:
    """From two /metrics scrapes: the full collections between them (each stalls every thread of the
    server: service.engine.collector), the longest to its histogram bucket's bound, and the time spent
    in all collections."""
    (buckets_before, seconds_before), (buckets_after, seconds_after) = _gc_series(before), _gc_series(after)
    deltas = {bound: count - buckets_before.get(bound, 0.0) for bound, count in buckets_after.items()}
    full = deltas.get("+Inf", 0.0)
    longest = next((float(bound) for bound, count in deltas.items() if full and count >= full), 0.0)
    return {
        "gc_full_collections": full,
        "gc_full_max_ms": 1000 * longest,
        "gc_ms": 1000 * (seconds_after - seconds_before),
    }


def _full_gc(m: dict[str, float]) -> str:
    count = int(m["gc_full_collections"])
    return f"{count}, <{m['gc_full_max_ms']:.4g}" if count else "0"


async def load(
    url: str,
    pages: list[bytes],
    *,
    clients: int,
    warmup_s: float,
    duration_s: float,
    start: float | None = None,
    first_page: int = 0,
) -> tuple[int, int, list[float]]:
    """Closed-loop clients: each posts one page, waits for the answer, posts the next.

    `start` (a `time.time()`) lets client processes share one measured window. The clients' own
    process gets the server's garbage-collector setting first: a full collection here (a quarter of a
    second where this process built a model with torch) would stall every client at once and show up in
    both modes' tails as if the server had been slow.
    """
    prepare_for_serving()
    next_page = first_page
    docs = errors = 0
    latencies: list[float] = []
    begun = time.perf_counter()
    measure_from = begun + warmup_s - (time.time() - start if start is not None else 0.0)
    stop_at = measure_from + duration_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"content-type": "application/octet-stream"}
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one_client() -> None:
            nonlocal next_page, docs, errors
            while True:
                sent = time.perf_counter()
                if sent >= stop_at:
                    return
                html = pages[next_page % len(pages)]
                next_page += 1
                try:
                    response = await client.post("/v1/embed", content=html, headers=headers)
                except httpx.TransportError as exc:
                    # A failed post is an error, not the end of the figures (a server killed by an
                    # out-of-memory error or a driver fault); a server that is gone ends this client.
                    errors += 1
                    if isinstance(exc, httpx.ConnectError):
                        return
                    continue
                done = time.perf_counter()
                if not measure_from <= done <= stop_at:
                    continue  # only answers inside the measured window count
                if response.status_code == 200:
                    docs += 1
                    latencies.append(done - sent)
                else:
                    errors += 1

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return docs, errors, latencies


ClientJob = tuple[str, list[bytes], int, float, float, int]

# The barrier every client process waits at before its window opens (set by `_join_window` in each).
_window_barrier: Barrier | None = None


def _join_window(barrier: Barrier) -> None:
    global _window_barrier
    _window_barrier = barrier


def _client_process(job: ClientJob) -> tuple[int, int, list[float]]:
    """One process's share of the clients. The window opens once every process has started: a spawned
    process first imports this script (torch with it, through service.engine: seconds each, more with
    four at once), and a window opened at a fixed time ahead would pass before the late ones post."""
    url, pages, clients, warmup_s, duration_s, first_page = job
    if _window_barrier is not None:
        _window_barrier.wait(timeout=600)
    return asyncio.run(
        load(
            url,
            pages,
            clients=clients,
            warmup_s=warmup_s,
            duration_s=duration_s,
            start=time.time(),
            first_page=first_page,
        )
    )


def drive(url: str, pages: list[bytes], args: argparse.Namespace) -> tuple[int, int, list[float]]:
    """The load, from one client process or from `--client-processes` sharing one window.

    One Python process of asyncio clients tops out near 300 posts a second of corpus-sized pages (h11
    parses in Python; measured against a server that does nothing), which a GPU server passes: then the
    figures would be the client's. Each process runs its share of the clients; all of them start their
    warm-up together, when the last one is ready (a barrier), so they share one measured window.
    """
    processes = max(1, min(args.client_processes, args.clients))
    if processes == 1:
        return asyncio.run(
            load(url, pages, clients=args.clients, warmup_s=args.warmup, duration_s=args.duration)
        )
    shares = [args.clients // processes + (i < args.clients % processes) for i in range(processes)]
    jobs = [
        (url, pages, share, args.warmup, args.duration, i * len(pages) // processes)
        for i, share in enumerate(shares)
    ]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    # One job per process: each blocks at the barrier, so no process can take a second job.
    with context.Pool(processes, initializer=_join_window, initargs=(barrier,)) as pool:
        parts = pool.map(_client_process, jobs, chunksize=1)
    return (
        sum(p[0] for p in parts),
        sum(p[1] for p in parts),
        [latency for p in parts for latency in p[2]],
    )


def cpu_seconds(stat_path: str) -> float:
    """CPU time (user + system) of the process or thread whose /proc stat file this is; nan elsewhere."""
    seconds = own_cpu_seconds(stat_path)
    return float("nan") if seconds is None else seconds


def embed_requests(metrics: str) -> float:
    """POST /v1/embed requests answered so far, any status, from the server's /metrics."""
    found = re.findall(r"^htmllm_requests_total\{([^}]*)\} (\S+)$", metrics, re.MULTILINE)
    return sum(float(n) for labels, n in found if 'route="/v1/embed"' in labels)


def scrape(url: str) -> str | None:
    """The server's /metrics, or None when it does not answer (the server died under the load)."""
    try:
        response = httpx.get(f"{url}/metrics", timeout=30)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


def round_order(names: Sequence[str], rounds: int) -> list[str]:
    """The modes in the order they run: `rounds` rounds each, the order reversed every other round
    (ABBA for two modes and two rounds), so that no mode always runs first."""
    return [name for i in range(rounds) for name in (names if i % 2 == 0 else names[::-1])]


def round_figures(
    position: int, docs: int, errors: int, window_s: float, latencies: list[float]
) -> dict[str, float]:
    """One round's figures; `position` is its place in the run (0 first)."""
    return {
        "position": position,
        "docs_per_s": docs / window_s,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "errors": errors,
    }


@dataclass
class LiveMode:
    """A mode's server, up for the whole run, and what its rounds have measured so far.

    The server-side figures add up the rounds' loads only (between a scrape before a round and one after
    it): while the other mode runs, this server idles, and its idle collections and CPU are no part of
    its figures. `loop_s` is the CPU time of the server's main thread (the event loop: HTTP parsing,
    validation, JSON, middleware, hand-offs) and `cpu_s` that of the whole server process (the loop, the
    batcher's and runner's threads; not its child processes), over the loads.
    """

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    docs: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    rounds: list[dict[str, float]] = field(default_factory=list)
    requests: float = 0.0  # embed requests the server answered over the loads, any status
    loop_s: float = 0.0
    cpu_s: float = 0.0
    gc: dict[str, float] = field(
        default_factory=lambda: {"gc_full_collections": 0.0, "gc_full_max_ms": 0.0, "gc_ms": 0.0}
    )
    metrics: str | None = None  # the latest scrape after a round
    failure: str | None = None

    def result(self) -> ModeResult:
        """The figures so far. The /metrics means are the server's whole life (its own warm-up and every
        round's, as before rounds); per request, the loop's and the process's CPU ms over the loads
        (the loop's share bounds a fast device: at 3 ms a request, no model serves more than about 330
        requests a second through one loop)."""
        server: dict[str, float] = {}
        if self.failure is None and self.metrics is not None:
            server = server_breakdown(self.metrics)
            requests = max(self.requests, 1.0)
            server["loop_ms_per_request"] = self.loop_s * 1000 / requests
            server["cpu_ms_per_request"] = self.cpu_s * 1000 / requests
            server.update(self.gc)
        return ModeResult(
            self.name,
            self.docs,
            self.errors,
            self.seconds,
            list(self.latencies),
            server,
            self.failure,
            list(self.rounds),
        )


def measure_round(
    mode: LiveMode, pages: list[bytes], args: argparse.Namespace, window_s: float, position: int
) -> dict[str, float] | None:
    """One round of `mode`: a warm-up and a window of `window_s`, added to its figures; the round's own
    (`round_figures`), or None where the server was gone before it.

    A server that exited, or whose /metrics scrape after the round failed, fails the mode (`failure`):
    from an empty scrape, every count read as 0, the differences went negative, and the CPU of a dead
    process was divided by one request. The clients' figures of the round stand.
    """
    proc = mode.proc
    before = scrape(mode.url) if proc.poll() is None else None
    figures = None
    if proc.poll() is not None:
        mode.failure = f"the server exited with status {proc.returncode} before round {position + 1}"
    elif before is None:
        mode.failure = f"the server's /metrics scrape before round {position + 1} failed"
    else:
        loop_stat, process_stat = f"/proc/{proc.pid}/task/{proc.pid}/stat", f"/proc/{proc.pid}/stat"
        loop_before, cpu_before = cpu_seconds(loop_stat), cpu_seconds(process_stat)
        docs, errors, latencies = drive(
            mode.url, pages, argparse.Namespace(**{**vars(args), "duration": window_s})
        )
        loop_after, cpu_after = cpu_seconds(loop_stat), cpu_seconds(process_stat)
        after = scrape(mode.url) if proc.poll() is None else None
        mode.docs, mode.errors, mode.seconds = mode.docs + docs, mode.errors + errors, mode.seconds + window_s
        mode.latencies.extend(latencies)
        figures = round_figures(position, docs, errors, window_s, latencies)
        mode.rounds.append(figures)
        if proc.poll() is not None:
            mode.failure = f"the server exited with status {proc.returncode} during the load"
        elif after is None:
            mode.failure = f"the server's /metrics scrape after round {position + 1} failed"
        else:
            mode.requests += embed_requests(after) - embed_requests(before)
            mode.loop_s += loop_after - loop_before
            mode.cpu_s += cpu_after - cpu_before
            gc = gc_over_load(before, after)
            mode.gc = {
                "gc_full_collections": mode.gc["gc_full_collections"] + gc["gc_full_collections"],
                "gc_full_max_ms": max(mode.gc["gc_full_max_ms"], gc["gc_full_max_ms"]),
                "gc_ms": mode.gc["gc_ms"] + gc["gc_ms"],
            }
            mode.metrics = after
    if mode.failure:
        # The log is in a temporary folder that goes with the run: its end is all that says why.
        tail = mode.log.read_text(errors="replace").splitlines()[-20:]
        print(f"{mode.name}: FAILED: {mode.failure}; the end of its log:", *tail, sep="\n", file=sys.stderr)
    return figures


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_modes(
    modes: list[tuple[str, dict[str, str]]],
    model: Path,
    pages: list[bytes],
    args: argparse.Namespace,
    logs: Path,
    on_round: Callable[[list[ModeResult]], None] | None = None,
) -> list[ModeResult]:
    """Every mode's figures over `args.rounds` rounds of `args.duration / args.rounds` seconds each, in
    `round_order`; `on_round` gets the figures so far after each round.

    Every server starts first and stays up to the end, so that a round costs a warm-up, not a server's
    start (a model load: on the GPU machine, device time), and so that each mode runs beside the other's
    idle server, the same for both. A failed mode runs no more rounds; the others go on.
    """
    live: list[LiveMode] = []
    try:
        for name, env in modes:
            proc, url = start_server(model, env, logs / f"{name}.log")
            live.append(LiveMode(name, proc, url, logs / f"{name}.log"))
        by_name = {mode.name: mode for mode in live}
        order = round_order([mode.name for mode in live], args.rounds)
        window_s = args.duration / args.rounds
        for position, name in enumerate(order):
            mode = by_name[name]
            if mode.failure is not None:
                continue
            figures = measure_round(mode, pages, args, window_s, position)
            if figures is not None:
                print(
                    f"round {position + 1}/{len(order)}: {name:<8} {figures['docs_per_s']:7.2f} docs/s, "
                    f"p99 {figures['p99_ms']:.0f} ms, {int(figures['errors'])} errors"
                )
            if on_round is not None:
                on_round([mode.result() for mode in live if mode.rounds or mode.failure])
    finally:
        for mode in live:
            stop_server(mode.proc)
    return [mode.result() for mode in live]


def positive_seconds(text: str) -> float:
    """`--duration`: seconds over 0 (a window of 0 s divided the docs by it), and finite."""
    value = positive_float(text)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The options (apart from `main`, so that a test can check the command lines gpu_device_run.sh
    would give it on the device)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus", help="page corpus")
    parser.add_argument("--limit", type=at_least(1), default=512, help="pages to cycle through (at least 1)")
    parser.add_argument(
        "--model", type=Path, default=None, help="checkpoint (default: bundled, else random mini)"
    )
    parser.add_argument("--preset", default="mini", help="preset of the random-weight model")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per document of the random model")
    parser.add_argument("--vocab-size", type=int, default=16384, help="vocabulary of the trained tokenizer")
    parser.add_argument("--clients", type=at_least(1), default=32, help="concurrent clients")
    parser.add_argument(
        "--client-processes",
        type=at_least(1),
        default=1,
        help="spread the clients over this many processes (one tops out near 300 posts/s)",
    )
    parser.add_argument(
        "--duration", type=positive_seconds, default=30.0, help="measured seconds per mode, over its rounds"
    )
    parser.add_argument(
        "--rounds",
        type=at_least(1),
        default=2,
        help="rounds per mode, the order reversed every other round (an even count cancels a linear drift)",
    )
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before each window")
    parser.add_argument("--batch-requests", type=int, default=32, help="documents per batch when batching")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="token budget per batch")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="batcher wait for company")
    parser.add_argument("--backend", choices=("torch", "onnx"), default="torch", help="both modes' backend")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="both modes' precision"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="both modes' device")
    parser.add_argument(
        "--preprocess-workers", type=int, default=None, help="prune/tokenize workers (default: the server's)"
    )
    parser.add_argument(
        "--preprocess-pool", choices=("thread", "process"), default=None, help="(default: the server's)"
    )
    parser.add_argument(
        "--synthetic", type=int, default=0, help="post N generated pages instead of the corpus"
    )
    parser.add_argument(
        "--bundled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the bundled default model when there is one (--no-bundled: the random --preset model)",
    )
    parser.add_argument(
        "--inference-process",
        action="store_true",
        help="both servers run the model in a child process (HTMLLM_INFERENCE_PROCESS)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--onnx-quantize", choices=QUANTIZATION_CHOICES, default=NO_QUANTIZATION, help="onnx on CPU"
    )
    return parser


def load_pages(args: argparse.Namespace) -> tuple[list[bytes], str]:
    """The pages to post and where they came from; `PageSourceError` for a corpus with none."""
    if args.synthetic > 0:
        from loadtests.pagegen import synthetic_pages

        pages = [page.html for page in itertools.islice(synthetic_pages(seed=0), args.synthetic)]
        return pages, "loadtests.pagegen (synthetic, corpus-shaped)"
    pages = [
        p.html if isinstance(p.html, bytes) else p.html.encode()
        for p in iter_pages(args.corpus, limit=args.limit)
    ]
    if not pages:
        raise PageSourceError(f"no pages in {args.corpus}")
    return pages, str(args.corpus)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A missing or empty corpus raises PageSourceError here, before a server starts: `run` refuses it.
    pages, source = load_pages(args)
    order = round_order(["dynamic", "single"], args.rounds)
    print(
        f"{len(pages)} pages from {source}; {args.clients} clients; {args.duration:g} s per mode, "
        f"in {args.rounds} round{'s' if args.rounds > 1 else ''} each: {', '.join(order)}"
    )
    machine = f"{platform.machine()} {platform.processor() or ''}".strip()
    print(f"machine: {machine}, {os.cpu_count()} cores, python {platform.python_version()}")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None and args.bundled and (default_model_path() / "htmllm.json").is_file():
            model = default_model_path()
        if model is None:
            started = time.perf_counter()
            model = random_checkpoint(
                Path(tmp) / "ckpt",
                pages,
                preset=args.preset,
                max_length=args.max_length,
                vocab_size=args.vocab_size,
            )
            built_s = time.perf_counter() - started
            model_label = f"{args.preset} preset, random weights, {args.max_length} tokens"
            print(f"model: {model_label} (speed does not depend on the weights), built in {built_s:.0f}s")
        else:
            model_label = str(model)
            print(f"model: {model}")
        common = {
            "HTMLLM_MAX_BATCH_TOKENS": str(args.batch_tokens),
            "HTMLLM_MAX_WAIT_MS": str(args.max_wait_ms),
            "HTMLLM_BACKEND": args.backend,
            "HTMLLM_DTYPE": args.dtype,
            "HTMLLM_ONNX_QUANTIZE": args.onnx_quantize,
            "HTMLLM_DEVICE": args.device,
            "HTMLLM_INFERENCE_PROCESS": "true" if args.inference_process else "false",
        }
        if args.preprocess_workers is not None:
            common["HTMLLM_PREPROCESS_WORKERS"] = str(args.preprocess_workers)
        if args.preprocess_pool is not None:
            common["HTMLLM_PREPROCESS_POOL"] = args.preprocess_pool
        print(
            f"backend {args.backend} on {args.device}, dtype {args.dtype}, "
            f"onnx quantisation {args.onnx_quantize}"
            + (", model in a child process" if args.inference_process else "")
        )
        modes = [
            ("dynamic", {**common, "HTMLLM_MAX_BATCH_REQUESTS": str(args.batch_requests)}),
            ("single", {**common, "HTMLLM_MAX_BATCH_REQUESTS": "1"}),
        ]

        def save(partial: list[ModeResult]) -> None:
            """After each round: a run stopped or failed later keeps what it measured (no ratios yet)."""
            if args.json is not None:
                write_figures(args, model_label, source, partial, final=False)

        results = run_modes(modes, model, pages, args, Path(tmp), save)
    if args.json is not None:
        write_figures(args, model_label, source, results)
    print(report(results, args.batch_requests))
    return 0 if all(r.errors == 0 and r.failure is None for r in results) else 1


def _cell(server: dict[str, float], key: str, spec: str) -> str:
    value = server.get(key)
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def report(results: list[ModeResult], batch_requests: int) -> str:
    """The printed figures: per mode the clients' docs/s and latency, the server's side, the ratios."""
    lines = [f"\n{'mode':<30} {'docs/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}"]
    for r in results:
        label = f"{r.name} (max_batch_requests={batch_requests if r.name == 'dynamic' else 1})"
        p50, p99 = r.percentile(0.5) * 1000, r.percentile(0.99) * 1000
        lines.append(f"{label:<30} {r.docs_per_s:>7.2f} {p50:>7.0f} {p99:>7.0f} {r.errors:>6}")
    ran = sorted(
        (figures["position"], r.name, figures["docs_per_s"]) for r in results for figures in r.rounds
    )
    if ran:
        lines.append(
            "docs/s per round, in run order: " + ", ".join(f"{name} {rate:.2f}" for _, name, rate in ran)
        )
    lines.append(
        "\nserver side (means, whole run incl. warm-ups, from /metrics; per request: over the loads):"
    )
    header: tuple[str, ...] = (
        "mode",
        "batch",
        "tokens",
        "padded",
        "pass ms",
        "host ms",
        "prune ms",
        "queue ms",
    )
    header += ("loop/req", "cpu/req", "full gc", "gc ms")
    lines.append(" ".join(f"{h:<10}" if i == 0 else f"{h:>9}" for i, h in enumerate(header)))
    for r in results:
        m = r.server
        if r.failure is not None:
            lines.append(f"{r.name:<10} " + " ".join(f"{'n/a':>9}" for _ in header[1:]) + f"  ({r.failure})")
            continue
        cells = [
            _cell(m, "batch", ".1f"),
            _cell(m, "batch_tokens", ".0f"),
            _cell(m, "padded_tokens", ".0f"),
            _cell(m, "pass_ms", ".0f"),
            _cell(m, "host_ms", ".1f"),
            _cell(m, "prune_ms", ".1f"),
            _cell(m, "queue_ms", ".0f"),
            _cell(m, "loop_ms_per_request", ".2f"),
            _cell(m, "cpu_ms_per_request", ".2f"),
            _full_gc(m),
            _cell(m, "gc_ms", ".0f"),
        ]
        lines.append(f"{r.name:<10} " + " ".join(f"{cell:>9}" for cell in cells))
    lines.append(
        "(loop/req, cpu/req: CPU ms per request of the server's event-loop thread and of its process;"
    )
    lines.append(
        " full gc, gc ms: over the loads, full collections and the longest, to its histogram bucket's"
    )
    lines.append(" bound; milliseconds in all collections; n/a: not measured, e.g. host ms off CUDA)")
    failed = [r for r in results if r.failure is not None]
    if failed or len(results) != 2:
        why = "; ".join(f"{r.name}: {r.failure}" for r in failed) or "a mode did not run"
        lines.append(f"\ndynamic / single: ratio not comparable ({why})")
    else:
        ratios = mode_ratios(*results)
        lines.append(
            f"\ndynamic / single: {ratios['docs_per_s']:.2f}x docs/s, "
            f"p99 {ratios['p99']:.2f}x (below 1 is better), p50 {ratios['p50']:.2f}x"
        )
    return "\n".join(lines)


def _ratio(ours: float, theirs: float) -> float:
    """`ours / theirs`, nan where `theirs` is 0 or nan (a mode that answered nothing in its window)."""
    return ours / theirs if theirs and not math.isnan(theirs) else float("nan")


def mode_ratios(dynamic: ModeResult, single: ModeResult) -> dict[str, float]:
    return {
        "docs_per_s": _ratio(dynamic.docs_per_s, single.docs_per_s),
        "p99": _ratio(dynamic.percentile(0.99), single.percentile(0.99)),
        "p50": _ratio(dynamic.percentile(0.5), single.percentile(0.5)),
    }


def json_safe(value: Any) -> Any:
    """`value` with every nan or infinite float as None: JSON has no NaN (json.dumps wrote it anyway,
    and strict parsers refused the file: host_ms is nan on every CPU run)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def write_figures(
    args: argparse.Namespace, model_label: str, source: str, results: list[ModeResult], *, final: bool = True
) -> None:
    """`--json`: the modes measured so far, each with its rounds' own figures, and their ratios once
    every round has run (`final`: before, they would compare rounds that are not balanced in time) and
    neither mode failed; null for a figure that is not known."""
    comparable = final and len(results) == 2 and all(r.failure is None for r in results)
    figures = {
        "model": model_label,
        "device": args.device,
        "dtype": args.dtype,
        "backend": args.backend,
        "pages": source,
        "clients": args.clients,
        "client_processes": args.client_processes,
        "inference_process": args.inference_process,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "modes": {
            r.name: {
                "docs_per_s": r.docs_per_s,
                "p50_ms": r.percentile(0.5) * 1000,
                "p99_ms": r.percentile(0.99) * 1000,
                "errors": r.errors,
                "failure": r.failure,
                "server": r.server or None,
                "rounds": r.rounds,
            }
            for r in results
        },
        "ratios": mode_ratios(*results) if comparable else None,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(json_safe(figures), indent=2, allow_nan=False))


if __name__ == "__main__":
    sys.exit(run(main))
