"""`make loadtest`: a bounded, headless locust run against a server this script starts on 127.0.0.1.

The server (`python -m service.api`) is bound to 127.0.0.1 on a free port and serves `--model` (default:
HTMLLM_MODEL_PATH, else the bundled default model); there is no option to target another host. Locust
runs headless for `--run-time` with `--users` users and writes, under `--out` (default `out/loadtest/`,
git-ignored): locust's `locust_stats.csv` (and its other CSVs), `report.html`, and `summary.csv` (the
exact final totals and percentiles). The server then gets SIGTERM and drains. `summary.json` and a
Markdown table of the figures follow; the exit status is 1 when any request failed. Every
`--sample-interval` seconds `server.csv` gets the server's resident memory, the CPU cores it used since the
last sample, and the host's busy and steal shares. The summary gives the RSS trend over the second half of
the run (MB per minute), where a slow leak shows and warm-up growth does not, and the CPU the server got:
latency that moves with the server's CPU share (a busy or stolen host) is not the server slowing down.

    python -m loadtests.run --users 8 --run-time 60s
    python -m loadtests.run --users 8 --run-time 10m --corpus ../shared/corpus   # the soak test
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # the only host this script serves on or sends load to
MAX_USERS = 256
MAX_RUN_SECONDS = 2 * 3600
STAGES = ("x-prune-time", "x-tokenize-time", "x-queue-time", "x-inference-time", "x-total-time")


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
    seconds = parse_duration(text)
    if not 1 <= seconds <= MAX_RUN_SECONDS:
        raise argparse.ArgumentTypeError(f"run time must be between 1 s and {MAX_RUN_SECONDS} s")
    return seconds


def bounded_users(text: str) -> int:
    users = int(text)
    if not 1 <= users <= MAX_USERS:
        raise argparse.ArgumentTypeError(f"users must be between 1 and {MAX_USERS}")
    return users


def build_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--page-pool", type=int, default=200, help="pages held in memory by the users")
    parser.add_argument("--docs-per-request", type=int, default=1, help="documents per JSON request")
    parser.add_argument("--raw-share", type=float, default=0.1, help="share of raw text/html requests")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "loadtest", help="reports folder")
    parser.add_argument("--port", type=int, default=0, help="server port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /ready")
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=10.0,
        help="seconds between samples of the server's RSS and CPU and the host's CPU (server.csv)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra HTMLLM_* setting for the server (repeatable), e.g. HTMLLM_MAX_BATCH_TOKENS=8192",
    )
    return parser


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def server_environment(args: argparse.Namespace, port: int) -> dict[str, str]:
    env = dict(os.environ)
    for item in args.server_env:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("HTMLLM_"):
            raise SystemExit(f"--server-env takes HTMLLM_NAME=VALUE, not {item!r}")
        if name in ("HTMLLM_HOST", "HTMLLM_PORT"):
            raise SystemExit(f"{name} is chosen by this script (127.0.0.1 only)")
        env[name] = value
    env["HTMLLM_HOST"] = HOST
    env["HTMLLM_PORT"] = str(port)
    if args.model is not None:
        env["HTMLLM_MODEL_PATH"] = str(args.model.resolve())
    return env


def locust_environment(server_env: dict[str, str]) -> dict[str, str]:
    """Locust's environment: this process's, the repository on PYTHONPATH, and the server's API key.

    The locustfile sends `HTMLLM_API_KEY` as its bearer token. A key given as `--server-env
    HTMLLM_API_KEY=...` is in the server's environment only; unless it is passed on, every request of
    the run gets 401.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if "HTMLLM_API_KEY" in server_env:
        env["HTMLLM_API_KEY"] = server_env["HTMLLM_API_KEY"]
    return env


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_ready(base: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    """Until /ready answers 200; fail as soon as the server process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)  # the server is loading and warming its model; nothing to wait on but the port
    raise SystemExit(f"the server was not ready after {timeout:.0f} s")


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it (Linux /proc), `pid` first.

    The server's work is not all in its own process: with `HTMLLM_INFERENCE_PROCESS` the model runs in a
    child, with `HTMLLM_PREPROCESS_POOL=process` pages are pruned in a forkserver's children, and text
    extraction has its own processes. Reading only the server's pid would miss them. Each thread's
    `children` file names the processes it started (a few reads); without it, every /proc/*/stat.
    """
    children_of = _started_by if Path(f"/proc/{pid}/task/{pid}/children").exists() else _children_by_scan()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children_of(current))
    return tree


def _started_by(pid: int) -> list[int]:
    """The processes `pid`'s threads started, from their `children` files."""
    children: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children.extend(int(child) for child in listing.read_text(encoding="ascii").split())
        except (OSError, ValueError):
            continue  # the thread or process ended meanwhile
    return children


def _children_by_scan() -> Callable[[int], list[int]]:
    """Every process's children, from every /proc/*/stat's parent field (kernels without `children`)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
            parent = int(stat.rsplit(")", 1)[-1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or unreadable
        children.setdefault(parent, []).append(int(entry.name))
    return lambda pid: children.get(pid, [])


def _read_tree(pid: int, tree: list[int] | None, name: str) -> list[tuple[int, str]] | None:
    """`/proc/<member>/<name>` of `pid` and its descendants; None once `pid` itself is gone (a descendant
    that ended meanwhile is left out)."""
    texts: list[tuple[int, str]] = []
    for member in tree if tree is not None else process_tree(pid):
        try:
            texts.append((member, Path(f"/proc/{member}/{name}").read_text(encoding="ascii")))
        except OSError:
            if member == pid:
                return None
    return texts


def server_memory_mb(pid: int, tree: list[int] | None = None) -> dict[str, float] | None:
    """Resident and peak resident memory of the server and its processes, summed (Linux /proc), to see
    growth over a soak run; None once the server is gone. Pages the processes share are counted in each
    (the forkserver's children share its imports): an upper bound, as a container's limit would not be."""
    statuses = _read_tree(pid, tree, "status")
    if statuses is None:
        return None
    rss = peak = 0
    for member, status in statuses:
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            rss += int(fields["VmRSS"].split()[0])
            peak += int(fields["VmHWM"].split()[0])
        except (KeyError, ValueError, IndexError):
            if member == pid:
                return None
    return {"rss_mb": round(rss / 1024, 1), "peak_rss_mb": round(peak / 1024, 1)}


def process_cpu_seconds(pid: int, tree: list[int] | None = None) -> float | None:
    """User plus system CPU seconds so far of `pid`'s threads, its live descendants' and the children it
    has reaped (Linux /proc); None once it is gone. The server's model and preprocessing may run in
    processes of their own (`process_tree`); their work is the server's."""
    stats = _read_tree(pid, tree, "stat")
    if stats is None:
        return None
    total = 0.0
    for member, stat in stats:
        try:
            own, reaped = _cpu_ticks(stat)
        except (IndexError, ValueError):
            if member == pid:
                return None
            continue
        ticks = own + reaped if member == pid else own  # the children it reaped count once, with it
        total += ticks / os.sysconf("SC_CLK_TCK")
    return total


def own_cpu_seconds(stat_path: str | Path) -> float | None:
    """User plus system CPU seconds of the one process or thread whose /proc stat file this is
    (`/proc/<pid>/stat`, `/proc/<pid>/task/<tid>/stat`), not its children's; None once it is gone."""
    try:
        own, _ = _cpu_ticks(Path(stat_path).read_text(encoding="ascii"))
    except (OSError, IndexError, ValueError):
        return None
    return own / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(stat: str) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) in clock ticks, from a /proc stat file's text."""
    # Field 2 (the command) is in parentheses and may hold spaces: split after its closing one.
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


class HostCpu(NamedTuple):
    total: float  # seconds of all CPUs
    busy: float  # running anything (this server, locust, the rest of the machine)
    steal: float  # the hypervisor ran someone else while this guest wanted the CPU


def host_cpu_seconds() -> HostCpu | None:
    """The whole machine's CPU time so far, summed over its CPUs (Linux /proc/stat's first line)."""
    try:
        first = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    except (OSError, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = user + nice + system + idle + iowait + irq + softirq + steal  # guest time is inside user
    return HostCpu(total / ticks, (total - idle - iowait - steal) / ticks, steal / ticks)


class ServerSample(NamedTuple):
    """One reading. The CPU figures are over the interval since the previous reading (None on the first).

    `server_cpu` is in cores (1.0: one CPU busy the whole interval); `host_busy` and `host_steal` are shares
    of the whole machine. A server that gets well under `os.cpu_count()` cores while the host is not busy
    either is waiting (on its batcher, on locust); with the host busy or stolen, it is being starved.
    """

    seconds: float
    rss_mb: float
    server_cpu: float | None
    host_busy: float | None
    host_steal: float | None


class ServerSampler(threading.Thread):
    """Samples the server's RSS and CPU, and the host's CPU, every `interval` seconds while the load runs.

    Two readings (ready, end) cannot tell allocator growth during warm-up from a slow leak; a series can.
    The CPU columns say whether latency that moved during a run followed the CPU the server got.
    """

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(name="server-sampler", daemon=True)
        self.pid, self.interval = pid, max(interval, 0.1)
        self.samples: list[ServerSample] = []
        self._stop_event = threading.Event()
        self._origin = time.monotonic()
        self._last: tuple[float, float | None, HostCpu | None] | None = None

    def run(self) -> None:
        self._origin = time.monotonic()
        while True:
            self.sample()
            if self._stop_event.wait(self.interval):
                return

    def sample(self) -> None:
        tree = process_tree(self.pid)
        now, memory = time.monotonic(), server_memory_mb(self.pid, tree)
        cpu, host = process_cpu_seconds(self.pid, tree), host_cpu_seconds()
        if memory is None:
            return
        server_cpu = host_busy = host_steal = None
        if self._last is not None:
            last_time, last_cpu, last_host = self._last
            if cpu is not None and last_cpu is not None and now > last_time:
                server_cpu = round((cpu - last_cpu) / (now - last_time), 3)
            if host is not None and last_host is not None and host.total > last_host.total:
                span = host.total - last_host.total
                host_busy = round((host.busy - last_host.busy) / span, 3)
                host_steal = round((host.steal - last_host.steal) / span, 3)
        self._last = (now, cpu, host)
        seconds = round(now - self._origin, 1)
        self.samples.append(ServerSample(seconds, memory["rss_mb"], server_cpu, host_busy, host_steal))

    def stop(self) -> list[ServerSample]:
        """Stops sampling after one last sample; the series so far."""
        self._stop_event.set()
        self.join(timeout=5)
        self.sample()
        return self.samples


def cpu_summary(samples: Sequence[ServerSample]) -> dict[str, float | int] | None:
    """The CPU the server got over the run (cores: mean, 10th and 90th percentile of the intervals) and
    the host's mean busy and steal shares; None with fewer than 2 intervals."""
    server = [s.server_cpu for s in samples if s.server_cpu is not None]
    busy = [s.host_busy for s in samples if s.host_busy is not None]
    steal = [s.host_steal for s in samples if s.host_steal is not None]
    if len(server) < 2:
        return None
    deciles = statistics.quantiles(server, n=10, method="inclusive")
    summary: dict[str, float | int] = {
        "intervals": len(server),
        "cpus": os.cpu_count() or 1,
        "server_cores_mean": round(statistics.fmean(server), 3),
        "server_cores_p10": round(deciles[0], 3),
        "server_cores_p90": round(deciles[-1], 3),
    }
    if busy and steal:
        summary |= {
            "host_busy_mean": round(statistics.fmean(busy), 3),
            "host_steal_mean": round(statistics.fmean(steal), 3),
        }
    return summary


def memory_trend(samples: Sequence[tuple[float, float]]) -> dict[str, float | int | None] | None:
    """RSS growth over the second half of a run: the least-squares slope in MB per minute, and the medians
    of both halves. None with fewer than 3 samples in the second half (a run too short to say)."""
    if not samples:
        return None
    half = samples[-1][0] / 2
    late = [(t, mb) for t, mb in samples if t >= half]
    early = [mb for t, mb in samples if t < half]
    if len(late) < 3 or late[-1][0] == late[0][0]:
        return None
    slope = statistics.linear_regression([t for t, _ in late], [mb for _, mb in late]).slope
    return {
        "samples": len(samples),
        "second_half_mb_per_min": round(60 * slope, 3),
        "first_half_median_mb": round(statistics.median(early), 1) if early else None,
        "second_half_median_mb": round(statistics.median(mb for _, mb in late), 1),
        "max_mb": max(mb for _, mb in samples),
    }


def stop_server(server: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM (the server drains its queue), then SIGKILL if it outlives `grace` seconds."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return server.returncode


def read_stats(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def summarize(rows: list[dict[str, str]], docs_per_request: int, run_seconds: float) -> dict[str, Any]:
    """Request totals and latency percentiles of the POST entries, and each stage header's percentiles.

    `rows` are the locustfile's final CSV (`--final-csv`): one row per locust entry.
    """
    posts = [r for r in rows if r["type"] == "POST"]
    requests = sum(int(r["requests"]) for r in posts)
    failures = sum(int(r["failures"]) for r in posts)
    # Documents embedded: those of answered requests only (a 429 or 401 comes back fast and embeds none).
    documents = sum(
        (int(r["requests"]) - int(r["failures"])) * (docs_per_request if "json" in r["name"] else 1)
        for r in posts
    )

    def latency(row: dict[str, str]) -> dict[str, float]:
        return {key: float(row[key]) for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms")}

    return {
        "requests": requests,
        "failures": failures,
        "error_rate": failures / requests if requests else None,
        "requests_per_s": requests / run_seconds if run_seconds else None,
        "documents_per_s": documents / run_seconds if run_seconds else None,
        "endpoints": {
            r["name"]: {"requests": int(r["requests"]), "failures": int(r["failures"]), **latency(r)}
            for r in posts
        },
        "stages": {r["name"]: latency(r) for r in rows if r["type"] == "stage"},
    }


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"model `{summary['model']}` ({summary['backend']}, max length {summary['model_max_length']}), "
        f"{summary['users']} users, {summary['run_seconds']} s, "
        f"pages: {summary['pages']}, machine: {summary['machine']}",
        "",
        "| entry | requests | failures | p50 ms | p95 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, e in summary["endpoints"].items():
        lines.append(
            f"| POST {name} | {e['requests']} | {e['failures']} | {e['p50_ms']:.0f} | {e['p95_ms']:.0f} "
            f"| {e['p99_ms']:.0f} |"
        )
    for name, s in summary["stages"].items():
        lines.append(f"| {name} | | | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['p99_ms']:.0f} |")
    rate = summary["error_rate"]
    lines += [
        "",
        f"{summary['requests']} requests, {summary['failures']} failed (error rate "
        f"{'n/a' if rate is None else f'{rate:.4f}'}), {summary['requests_per_s']:.2f} requests/s, "
        f"{summary['documents_per_s']:.2f} documents/s",
    ]
    memory = summary.get("server_memory") or {}
    if memory.get("ready") and memory.get("end"):
        lines.append(
            f"server RSS (with its processes) {memory['ready']['rss_mb']:.0f} MB when ready, "
            f"{memory['end']['rss_mb']:.0f} MB at "
            f"the end (peak {memory['end']['peak_rss_mb']:.0f} MB)"
        )
    cpu = summary.get("server_cpu")
    if cpu:
        line = (
            f"server CPU (with its processes): mean {cpu['server_cores_mean']:.2f} of {cpu['cpus']} cores "
            f"over {cpu['intervals']} "
            f"intervals (10th-90th percentile {cpu['server_cores_p10']:.2f}-{cpu['server_cores_p90']:.2f})"
        )
        if "host_busy_mean" in cpu:
            line += (
                f"; host busy {cpu['host_busy_mean']:.0%} (server, locust and the rest), "
                f"steal {cpu['host_steal_mean']:.1%}"
            )
        lines.append(line)
    trend = summary.get("memory_trend")
    if trend:
        lines.append(
            f"server RSS, {trend['samples']} samples: median {trend['first_half_median_mb']} MB in the first "
            f"half of the run, {trend['second_half_median_mb']} MB in the second; second-half slope "
            f"{trend['second_half_mb_per_min']:+.2f} MB/min; max {trend['max_mb']} MB"
        )
    return "\n".join(lines)


def locust_command(args: argparse.Namespace, base: str, out: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "loadtests" / "locustfile.py"),
        "--headless",
        "--users",
        str(args.users),
        "--spawn-rate",
        str(args.spawn_rate),
        "--run-time",
        f"{args.run_time}s",
        "--host",
        base,
        "--csv",
        str(out / "locust"),
        "--csv-full-history",  # per-entry rows in locust_stats_history.csv, not only "Aggregated"
        "--html",
        str(out / "report.html"),
        "--only-summary",
        "--stop-timeout",
        "30",
        "--loglevel",
        "WARNING",
        "--page-pool",
        str(args.page_pool),
        "--docs-per-request",
        str(args.docs_per_request),
        "--raw-share",
        str(args.raw_share),
        "--final-csv",
        str(out / "summary.csv"),
    ]
    if args.corpus:
        command += ["--corpus", str(Path(args.corpus).resolve())]
    return command


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    base = f"http://{HOST}:{port}"
    env = server_environment(args, port)
    drain = float(env.get("HTMLLM_DRAIN_TIMEOUT_S", "30"))
    with (out / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "service.api"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            print(f"loadtest: server on {base} (log: {out / 'server.log'}); waiting for /ready", flush=True)
            wait_ready(base, server, args.ready_timeout)
            info = get_json(f"{base}/info")
            locust_env = locust_environment(env)
            print(f"loadtest: {args.users} users for {args.run_time} s", flush=True)
            memory_ready = server_memory_mb(server.pid)
            sampler = ServerSampler(server.pid, args.sample_interval)
            sampler.start()
            started = time.monotonic()
            try:
                locust = subprocess.run(
                    locust_command(args, base, out), cwd=ROOT, env=locust_env, check=False
                )
            finally:
                samples = sampler.stop()
            elapsed = time.monotonic() - started
            memory_end = server_memory_mb(server.pid)
        finally:
            status = stop_server(server, grace=drain + 15)
    with (out / "server.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(ServerSample._fields)
        writer.writerows(["" if value is None else value for value in sample] for sample in samples)
    stats = out / "summary.csv"
    if not stats.is_file():
        print(f"loadtest: locust wrote no statistics (exit status {locust.returncode})", file=sys.stderr)
        return 1
    summary = summarize(read_stats(stats), args.docs_per_request, float(args.run_time))
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
        server_exit_status=status,
        locust_exit_status=locust.returncode,
        reports={
            "summary_csv": str(stats),
            "locust_csv": str(out / "locust_stats.csv"),
            "html": str(out / "report.html"),
            "server_csv": str(out / "server.csv"),
        },
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(markdown(summary))
    print(f"loadtest: reports in {out}")
    return 0 if summary["failures"] == 0 and summary["requests"] > 0 and locust.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
