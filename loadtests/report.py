"""From locust's final statistics to the run's report: totals, percentiles, the Markdown table, the verdict.

The numbers come from the locustfile's `--final-csv` (`summary.csv`: exact final totals, unlike locust's
periodic CSVs, which can miss the last second), one row per locust entry: the POST entries, and the
stage headers recorded under the request type `stage` (`loadtests.client.STAGE_REQUEST_TYPE`).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from loadtests.client import STAGE_REQUEST_TYPE


def read_stats(path: Path) -> list[dict[str, str]]:
    """The rows of a locust CSV, every value a string as written."""
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
        "stages": {r["name"]: latency(r) for r in rows if r["type"] == STAGE_REQUEST_TYPE},
    }


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


def passed(summary: dict[str, Any], locust_status: int) -> bool:
    """The run's verdict: requests were sent, none failed, and locust itself exited cleanly."""
    return summary["failures"] == 0 and summary["requests"] > 0 and locust_status == 0
