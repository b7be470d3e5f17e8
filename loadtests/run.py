"""`make loadtest`: a bounded, headless locust run against a server this script starts on 127.0.0.1.

The server (`python -m service.api`) is bound to 127.0.0.1 on a free port and serves `--model` (default:
HTMLLM_MODEL_PATH, else the bundled default model); there is no option to target another host. Locust
runs headless for `--run-time` with `--users` users and writes, under `--out` (default `out/loadtest/`,
git-ignored): locust's `locust_stats.csv` (and its other CSVs), `report.html`, `summary.csv` (the exact
final totals, and latency percentiles of the answered requests) and `failures.csv` (failures by kind).
The server then gets SIGTERM and drains. `summary.json` and a Markdown table of the figures follow; the
exit status is 1 when any request failed, the server exited during the run (locust is stopped then) or
did not drain after SIGTERM, 2 for options, a `--corpus` or a `--port` that cannot work (said in one line
before the server starts). The server counts as ready only once the port's listening socket is its own:
another server on the port would answer /ready too. Every `--sample-interval` seconds `server.csv` gets
the server's resident memory, the CPU cores it used since the last sample, the host's busy and steal
shares and the cores locust used. The summary gives the RSS trend over the second half of the run (MB per
minute), where a slow leak shows and warm-up growth does not, the CPU the server got (latency that moves
with the server's CPU share, a busy or stolen host, is not the server slowing down) and locust's (near
one core, locust is the limit).

    python -m loadtests.run --users 8 --run-time 60s
    python -m loadtests.run --users 8 --run-time 10m --corpus ../shared/corpus   # the soak test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from loadtests.client import load_pool
from loadtests.launch import (
    HOST,
    ROOT,
    free_port,
    get_json,
    locust_environment,
    port_in_use,
    server_environment,
    server_setting,
    start_locust,
    start_server,
    stop_locust,
    stop_server,
    wait_ready,
    watch_run,
)
from loadtests.procfs import server_memory_mb
from loadtests.report import markdown, passed, read_stats, summarize
from loadtests.sampler import (
    ServerSampler,
    cpu_summary,
    generator_cpu_summary,
    memory_trend,
    write_server_csv,
)
from service.commands.options import at_least
from service.core.pages import PageSourceError

MAX_USERS = 256
MAX_RUN_SECONDS = 2 * 3600


def parse_duration(text: str) -> int:
    """Seconds in a locust-style duration ("90", "60s", "10m", "1h30m")."""
    if text.isdigit():
        return int(text)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not parts or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 60s, 10m, 1h30m)")
    hours, minutes, seconds = (int(g or 0) for g in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


def bounded_duration(text: str) -> int:
    """`--run-time`: a duration, bounded so that a typo cannot load a machine for a day."""
    seconds = parse_duration(text)
    if not 1 <= seconds <= MAX_RUN_SECONDS:
        raise argparse.ArgumentTypeError(f"run time must be between 1 s and {MAX_RUN_SECONDS} s")
    return seconds


def bounded_users(text: str) -> int:
    """`--users`: a count, bounded so that one machine can still generate the load."""
    users = int(text)
    if not 1 <= users <= MAX_USERS:
        raise argparse.ArgumentTypeError(f"users must be between 1 and {MAX_USERS}")
    return users


def share(text: str) -> float:
    """`--raw-share`: a share of the requests, 0 to 1 (2 was taken, and every request went raw)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def port_number(text: str) -> int:
    """`--port`: 0 (a free one) or a TCP port."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535, not {port}")
    return port


def pool_problem(corpus: str, page_pool: int) -> str | None:
    """Why the users could not fill their page pool, or None. Checked before the server starts: found in
    the users' `on_start`, it came after the model had loaded, as a traceback per user and a summary of 0
    requests that never named the corpus. The synthetic generator never runs dry, so only a corpus is
    read (the same `load_pool` the users run, so a bad page among the first `page_pool` is found too)."""
    if not corpus:
        return None
    try:
        load_pool(corpus, page_pool, seed=0)
    except PageSourceError as exc:
        return f"--corpus: {exc}"
    return None


def build_parser() -> argparse.ArgumentParser:
    """The driver's options; the locustfile has its own (`locust --help`), which `locust_command` fills."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.run", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--users", type=bounded_users, default=8, help=f"concurrent users (1..{MAX_USERS})")
    parser.add_argument("--spawn-rate", type=float, default=4.0, help="users started per second")
    parser.add_argument(
        "--run-time", type=bounded_duration, default=60, help="how long to load the server (60s, 10m; ≤ 2h)"
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="checkpoint to serve (default: the server's)"
    )
    parser.add_argument("--corpus", default="", help="pages to post (default: synthetic, loadtests.pagegen)")
    parser.add_argument(
        "--page-pool", type=at_least(1), default=200, help="pages held in memory by the users (at least 1)"
    )
    # At least 1: the users would send 1 anyway, and the summary would count the documents times 0.
    parser.add_argument(
        "--docs-per-request", type=at_least(1), default=1, help="documents per JSON request (at least 1)"
    )
    parser.add_argument("--raw-share", type=share, default=0.1, help="share of raw text/html requests (0..1)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "loadtest", help="reports folder")
    parser.add_argument(
        "--port",
        type=port_number,
        default=0,
        help="server port on 127.0.0.1 (0: a free one); one something listens on is refused",
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /ready")
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=10.0,
        help="seconds between samples of the server's RSS and CPU and the host's CPU (server.csv)",
    )
    parser.add_argument(
        "--server-env",
        type=server_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra HTMLLM_* setting for the server (repeatable), e.g. HTMLLM_MAX_BATCH_TOKENS=8192",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """One run: server up, locust for the run time, server drained, reports written; 1 when it failed."""
    args = build_parser().parse_args(argv)
    problem = pool_problem(args.corpus, args.page_pool)
    if not problem and args.port:
        taken = port_in_use(args.port)
        problem = f"--port {args.port}: {taken}" if taken else None
    if problem:
        print(f"loadtest: error: {problem}", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    base = f"http://{HOST}:{port}"
    env = server_environment(args, port)
    drain = float(env.get("HTMLLM_DRAIN_TIMEOUT_S", "30"))
    for stale in ("summary.csv", "failures.csv"):  # an earlier run's, which a failed one would report
        (out / stale).unlink(missing_ok=True)
    with (out / "server.log").open("wb") as log:
        server = start_server(env, log)
        try:
            print(f"loadtest: server on {base} (log: {out / 'server.log'}); waiting for /ready", flush=True)
            wait_ready(base, port, server, args.ready_timeout)
            info = get_json(f"{base}/info")
            locust_env = locust_environment(env)
            print(f"loadtest: {args.users} users for {args.run_time} s", flush=True)
            memory_ready = server_memory_mb(server.pid)
            started = time.monotonic()
            locust = start_locust(args, base, out, locust_env)
            sampler = ServerSampler(server.pid, args.sample_interval, generator_pid=locust.pid)
            sampler.start()
            try:
                died = watch_run(locust, server, started)
            finally:
                samples = sampler.stop()
                stop_locust(locust, grace=60)  # still running only if the driver was interrupted
            elapsed = time.monotonic() - started
            memory_end = server_memory_mb(server.pid)
        finally:
            status = stop_server(server, grace=drain + 15)
    write_server_csv(out / "server.csv", samples)
    if died:
        print(
            f"loadtest: the server exited with status {died.status} at {died.seconds:.0f} s",
            file=sys.stderr,
        )
    stats = out / "summary.csv"
    if not stats.is_file():
        print(f"loadtest: locust wrote no statistics (exit status {locust.returncode})", file=sys.stderr)
        return 1
    failures = out / "failures.csv"
    summary = summarize(
        read_stats(stats),
        args.docs_per_request,
        # A run the server's exit cut short: its rates over the time it ran, not the time it was given.
        min(float(args.run_time), died.seconds) if died and died.seconds > 0 else float(args.run_time),
        read_stats(failures) if failures.is_file() else None,
    )
    summary.update(
        model=str(info.get("model")),
        model_max_length=info.get("max_length"),
        backend=f"{info.get('backend')} on {info.get('device')}",
        users=args.users,
        run_seconds=args.run_time,
        wall_seconds=round(elapsed, 1),
        pages=args.corpus or "synthetic (loadtests.pagegen)",
        docs_per_request=args.docs_per_request,
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        server_memory={"ready": memory_ready, "end": memory_end},
        memory_trend=memory_trend([(sample.seconds, sample.rss_mb) for sample in samples]),
        server_cpu=cpu_summary(samples),
        generator_cpu=generator_cpu_summary(samples),
        server_exit_status=status,
        server_exited_during_run=died._asdict() if died else None,
        locust_exit_status=locust.returncode,
        reports={
            "summary_csv": str(stats),
            "failures_csv": str(failures),
            "locust_csv": str(out / "locust_stats.csv"),
            "html": str(out / "report.html"),
            "server_csv": str(out / "server.csv"),
        },
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(markdown(summary))
    print(f"loadtest: reports in {out}")
    return 0 if passed(summary, locust.returncode) else 1


if __name__ == "__main__":
    sys.exit(main())
