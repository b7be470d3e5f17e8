"""From the run's final statistics to its report: totals, percentiles, failures, the Markdown table, the
verdict.

The numbers come from the locustfile's own counts (`loadtests.client.RunStats`), written when locust
quits: `summary.csv` (`--final-csv`), one row per POST entry with latency percentiles of its answered
requests, and one per stage header (type `stage`, `loadtests.client.STAGE_REQUEST_TYPE`); and
`failures.csv` (`--failures-csv`), the failures by entry and kind (`HTTP 429 overloaded`).
"""

from __future__ import annotations

import csv
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from loadtests.client import STAGE_REQUEST_TYPE

# How a server that drained after the driver's SIGTERM ends: 0 (service.api.main exits with its own
# status), or killed by the re-raised SIGTERM (-15: uvicorn's way, before the server kept its status).
# Not 143: that is the server's own status for a SIGTERM before it served, the run of another server.
DRAINED_STATUSES = (0, -signal.SIGTERM)
_LATENCY_KEYS = ("p50_ms", "p95_ms", "p99_ms", "max_ms")


def read_stats(path: Path) -> list[dict[str, str]]:
    """The rows of a locust CSV, every value a string as written."""
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def summarize(
    rows: list[dict[str, str]],
    docs_per_request: int,
    run_seconds: float,
    failures: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Request totals and latency percentiles of the POST entries, each stage header's percentiles, and
    the failures by kind and by status.

    `rows` are the locustfile's final CSV (`--final-csv`): one row per entry, percentiles over the
    answered requests (None where none was); `failures` its `--failures-csv` rows.
    """
    posts = [r for r in rows if r["type"] == "POST"]
    requests = sum(int(r["requests"]) for r in posts)
    failed = sum(int(r["failures"]) for r in posts)
    # Documents embedded: those of answered requests only (a 429 or 401 comes back fast and embeds none).
    documents = sum(
        (int(r["requests"]) - int(r["failures"])) * (docs_per_request if "json" in r["name"] else 1)
        for r in posts
    )

    def latency(row: dict[str, str]) -> dict[str, float | None]:
        return {key: float(row[key]) if row.get(key) else None for key in _LATENCY_KEYS}

    by_kind: Counter[str] = Counter()
    per_entry: dict[str, Counter[str]] = {}
    for row in failures or []:
        if row["type"] == "POST":
            by_kind[row["failure"]] += int(row["count"])
            per_entry.setdefault(row["name"], Counter())[row["failure"]] += int(row["count"])
    by_status: Counter[str] = Counter()
    for kind, count in by_kind.items():
        # "HTTP 429 overloaded" -> "429"; status 0 is no answer at all (a refused or dropped connection).
        by_status[kind.split()[1] if kind.startswith("HTTP ") and len(kind.split()) > 1 else "?"] += count
    return {
        "requests": requests,
        "failures": failed,
        "error_rate": failed / requests if requests else None,
        "requests_per_s": requests / run_seconds if run_seconds else None,
        "documents_per_s": documents / run_seconds if run_seconds else None,
        "failures_by_status": dict(sorted(by_status.items())),
        "failures_by_kind": dict(by_kind.most_common()),
        "endpoints": {
            r["name"]: {
                "requests": int(r["requests"]),
                "failures": int(r["failures"]),
                **latency(r),
                "failures_by_kind": dict(per_entry.get(r["name"], Counter()).most_common()),
            }
            for r in posts
        },
        "stages": {r["name"]: latency(r) for r in rows if r["type"] == STAGE_REQUEST_TYPE},
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def markdown(summary: dict[str, Any]) -> str:
    """The summary as printed at the end of a run: a table per entry and stage, then the run's totals."""
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
            f"| POST {name} | {e['requests']} | {e['failures']} | {_ms(e['p50_ms'])} | {_ms(e['p95_ms'])} "
            f"| {_ms(e['p99_ms'])} |"
        )
    for kind, count in summary.get("failures_by_kind", {}).items():
        lines.append(f"| failed: {kind} | | {count} | | | |")
    for name, s in summary["stages"].items():
        lines.append(f"| {name} | | | {_ms(s['p50_ms'])} | {_ms(s['p95_ms'])} | {_ms(s['p99_ms'])} |")
    rate = summary["error_rate"]
    lines += [
        "",
        "(latency percentiles: answered requests only; failures are counted apart, by kind)",
        f"{summary['requests']} requests, {summary['failures']} failed (error rate "
        f"{'n/a' if rate is None else f'{rate:.4f}'}), {summary['requests_per_s']:.2f} requests/s, "
        f"{summary['documents_per_s']:.2f} documents/s",
    ]
    lines.append(server_exit_line(summary))
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
    generator = summary.get("generator_cpu")
    if generator:
        line = (
            f"load generator (locust, one process) CPU: mean {generator['cores_mean']:.2f} cores, 90th "
            f"percentile {generator['cores_p90']:.2f}, most {generator['cores_max']:.2f}"
        )
        if generator["near_one_core"]:
            line += (
                "; NEAR ONE CORE: locust was the limit, and the latency and throughput are partly its own "
                "(fewer users, or locust on another machine)"
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


def server_exit_line(summary: dict[str, Any]) -> str:
    """How the server ended: during the run (it died under the load), or after the driver's SIGTERM."""
    status = summary.get("server_exit_status")
    during = summary.get("server_exited_during_run")
    if during:
        return (
            f"server exited with status {during['status']} at {during['seconds']:.0f} s into the run: "
            "locust was stopped, the run FAILED (server.log says why)"
        )
    if status in DRAINED_STATUSES:
        return f"server drained and exited with status {status} after SIGTERM"
    return f"server exited with status {status} after SIGTERM, not {DRAINED_STATUSES}: the run FAILED"


def passed(summary: dict[str, Any], locust_status: int) -> bool:
    """The run's verdict: requests were sent, none failed, locust itself exited cleanly, and the server
    lived through the run and drained after SIGTERM (a server that had never served, status 143, had
    passed: another server on its port had answered every request)."""
    return (
        summary["failures"] == 0
        and summary["requests"] > 0
        and locust_status == 0
        and not summary.get("server_exited_during_run")
        and summary.get("server_exit_status") in DRAINED_STATUSES
    )
