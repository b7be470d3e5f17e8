"""The engine under a container CPU limit: threads sized from the CPU budget vs one per CPU, in one run.

    sudo .venv/bin/python benchmarks/cpu_limit.py --corpus ../shared/corpus --limits 0.5,1,1.5

Kubernetes enforces a CPU limit as a cgroup bandwidth quota. torch and onnxruntime size their thread
pools from the CPUs in the affinity mask (every core of the node), not from the quota, so the threads
burn the period's quota early and the container is throttled for the rest of it. Each round runs the
bundled default model in a child process placed in a fresh cgroup with the quota, twice: with one
intra-op thread per CPU in the affinity mask (torch's own default, what the service ran before it read
the quota) and with the threads `service.core.cpus` chooses (`intra_op_threads=None`); where the limit
is fractional, also with the limit rounded down, the rounding the budget does not take. `--clients`
concurrent callers post one corpus page each, back to back, for `--seconds`. Reported per limit: docs/s,
p50 and p99 request latency, and the ratios budget / one-per-CPU. Rounds alternate the order.

Needs root and a writable cgroup hierarchy with the cpu controller (v1 `cpu`, or v2 with `cpu` in the
root's cgroup.subtree_control); it says so and exits 2 otherwise. On a machine with few cores the
difference is bounded by that core count: with 64 cores and a 2-CPU limit the default runs 32 times the
threads the quota pays for, here 2 cores give at most 2 times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.options import check_page_source, child_output, comma_list, positive_float, run  # noqa: E402

PERIOD_US = 100_000


class ChildResult(TypedDict):
    threads: int
    budget: str
    docs: int
    elapsed_s: float
    latencies: list[float]


def cgroup_parent() -> tuple[Path, int] | None:
    """A writable cgroup directory with the cpu controller, and its version; None where there is none."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, 1
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(v2, os.W_OK):
        return v2, 2
    return None


def make_cgroup(parent: Path, version: int, name: str, cpus: float) -> Path:
    group = parent / name
    group.mkdir(exist_ok=True)
    quota = int(cpus * PERIOD_US)
    if version == 1:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    return group


def child(args: argparse.Namespace) -> int:
    """One measurement inside `args.cgroup`: joins it first, so torch starts under the quota."""
    (Path(args.cgroup) / "cgroup.procs").write_text(str(os.getpid()))
    from service.core.cpus import cpu_budget
    from service.core.errors import HtmllmError
    from service.core.pages import iter_pages
    from service.engine import Document, Engine, EngineConfig

    pages: list[bytes] = []
    for page in iter_pages(args.corpus):
        html = page.html if isinstance(page.html, bytes) else page.html.encode()
        pages.append(html)
        if len(pages) >= args.pages:
            break
    # The graph goes under out/ (ignored), never into the checkpoint: that is the bundled model's folder.
    onnx_path = ROOT / "out" / "cpu_limit" / f"{args.checkpoint.resolve().name}.onnx"
    config = EngineConfig(
        backend=args.backend,
        intra_op_threads=args.threads or None,
        onnx_path=str(onnx_path) if args.backend == "onnx" else None,
    )
    engine = Engine.from_checkpoint(args.checkpoint, config)
    latencies: list[float] = []

    async def run() -> float:
        async with engine:
            await engine.warmup()
            stop = time.perf_counter() + args.seconds
            started = time.perf_counter()

            async def client(offset: int) -> None:
                index = offset
                while time.perf_counter() < stop:
                    sent = time.perf_counter()
                    with contextlib.suppress(HtmllmError):  # a page the pruner refuses: alike in both
                        await engine.embed([Document(html=pages[index % len(pages)])])
                        latencies.append(time.perf_counter() - sent)
                    index += args.clients

            await asyncio.gather(*(client(i) for i in range(args.clients)))
            return time.perf_counter() - started

    elapsed = asyncio.run(run())
    print(
        json.dumps(
            {
                "threads": engine.info.threads,
                "budget": cpu_budget().describe(),
                "docs": len(latencies),
                "elapsed_s": elapsed,
                "latencies": latencies,
            }
        )
    )
    return 0


def variants(cpus: float) -> dict[str, int]:
    """Thread counts to compare under a limit of `cpus`; 0 lets the engine choose (the budget)."""
    from service.core.cpus import affinity_cpus

    chosen = {"one-per-cpu": affinity_cpus(), "budget": 0}
    down = math.floor(cpus)
    if 1 <= down < min(math.ceil(cpus), affinity_cpus()):
        chosen["rounded-down"] = down  # the rounding question: floor(limit) instead of ceil
    return chosen


def measure(args: argparse.Namespace, group: Path, threads: int) -> ChildResult:
    command = [sys.executable, __file__, "--child", "--cgroup", str(group), "--threads", str(threads)]
    command += ["--corpus", str(args.corpus), "--checkpoint", str(args.checkpoint), "--backend", args.backend]
    command += ["--seconds", str(args.seconds), "--clients", str(args.clients), "--pages", str(args.pages)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "HTMLLM_INTRA_OP_THREADS")}
    result: ChildResult = json.loads(child_output(command, env=env).strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "service" / "assets" / "default-model")
    parser.add_argument("--backend", choices=("torch", "onnx"), default="torch")
    parser.add_argument(
        "--limits",
        type=comma_list(positive_float),
        default=[0.5, 1.0, 1.5],
        help="CPU limits to run under, comma-separated",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per child")
    parser.add_argument("--clients", type=int, default=8, help="concurrent callers, one page each")
    parser.add_argument("--pages", type=int, default=200, help="corpus pages posted in turn")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per limit, alternating the order")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cgroup", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    check_page_source(args.corpus)  # here, not in a child: one line, before a model is loaded
    found = cgroup_parent()
    if found is None:
        print("cpu_limit.py needs root and a writable cgroup with the cpu controller", file=sys.stderr)
        return 2
    parent, version = found
    limits: list[float] = args.limits
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, cgroup v{version} at {parent}")
    print(
        f"backend {args.backend}, {args.clients} clients, {args.seconds:g} s per child, {args.rounds} rounds"
    )
    header = f"{'limit':>6} {'variant':>12} {'threads':>7} {'docs/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
    rows: list[str] = []
    summary: list[str] = []
    for cpus in limits:
        group = make_cgroup(parent, version, f"htmllm-bench-{os.getpid()}", cpus)
        compared = variants(cpus)
        names = list(compared)
        runs: dict[str, list[ChildResult]] = {name: [] for name in names}
        try:
            for round_ in range(args.rounds):
                for name in names if round_ % 2 == 0 else names[::-1]:
                    runs[name].append(measure(args, group, compared[name]))
        finally:
            with contextlib.suppress(OSError):
                group.rmdir()
        stats: dict[str, tuple[float, float, float]] = {}
        for variant in names:
            docs = sum(r["docs"] for r in runs[variant])
            elapsed = sum(r["elapsed_s"] for r in runs[variant])
            lat = np.array([x for r in runs[variant] for x in r["latencies"]])
            stats[variant] = (docs / elapsed, float(np.percentile(lat, 50)), float(np.percentile(lat, 99)))
            threads = runs[variant][0]["threads"]
            rate, p50, p99 = stats[variant]
            rows.append(
                f"{cpus:>6g} {variant:>12} {threads:>7} {rate:>8.2f} {p50 * 1e3:>7.0f} {p99 * 1e3:>7.0f}"
            )
        print(f"  limit {cpus:g}: the child read {runs['budget'][0]['budget']}")
        rate, p50, p99 = stats["budget"]
        for baseline in ("one-per-cpu", "rounded-down"):
            if baseline in stats:
                base_rate, base_p50, base_p99 = stats[baseline]
                summary.append(
                    f"limit {cpus:g} CPUs: budget / {baseline} docs/s {rate / base_rate:.2f}x, "
                    f"p50 {p50 / base_p50:.2f}x, p99 {p99 / base_p99:.2f}x"
                )
    print(header)
    print("\n".join(rows))
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
