"""What the load-test users send and how they judge the answers, free of locust.

Kept apart from `locustfile.py` because importing locust monkey-patches the standard library with
gevent; tests and `loadtests.run` use these helpers without that.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loadtests.pagegen import synthetic_pages
from service.core.decoding import decode_html
from service.core.pages import PageSourceError, iter_pages

STAGE_HEADERS = ("x-prune-time", "x-tokenize-time", "x-queue-time", "x-inference-time", "x-total-time")
# The request type under which the stage headers are recorded, next to the real POST entries.
STAGE_REQUEST_TYPE = "stage"
FINAL_COLUMNS = (
    "type",
    "name",
    "requests",
    "failures",
    "requests_per_s",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
)


@dataclass(frozen=True)
class LoadPage:
    id: str
    html: bytes  # raw, as crawled: what a raw-body request sends
    text: str  # decoded once up front: what a JSON body carries


def load_pool(corpus: str | Path, size: int, seed: int) -> list[LoadPage]:
    """The pages the users post: decoded once here, so the load generator spends its CPU on requests.

    `corpus` is any source `iter_pages` reads; empty means synthetic pages from `loadtests.pagegen`.
    `PageSourceError` for a source that cannot be read or holds no page.
    """
    source: Iterable[Any] = (
        iter_pages(corpus, limit=size) if corpus else itertools.islice(synthetic_pages(seed), size)
    )
    pool = [LoadPage(id=p.id, html=p.html, text=decode_html(p.html).text) for p in source]
    if not pool:
        raise PageSourceError(f"no pages in {corpus or 'the synthetic generator'}")
    return pool


def embed_body(pages: Sequence[LoadPage], ids: Sequence[str]) -> bytes:
    """A JSON `/v1/embed` body for `pages`, with the ids the answer must echo."""
    documents = [{"id": i, "html": p.text} for i, p in zip(ids, pages, strict=True)]
    return json.dumps({"documents": documents}).encode("utf-8")


def stage_times(headers: Mapping[str, str] | Any) -> dict[str, float]:
    """The x-*-time headers present on a response, in milliseconds; malformed ones are skipped."""
    found: dict[str, float] = {}
    for name in STAGE_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        try:
            found[name] = float(value)
        except ValueError:
            continue
    return found


def check_embed_response(body: bytes, expected_ids: Sequence[str]) -> str | None:
    """Why a 200 response is wrong (not JSON, ids, empty embeddings), or None for a complete answer."""
    try:
        data = json.loads(body)["data"]
        got = [item.get("id") for item in data]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "response is not an embed result"
    if got != list(expected_ids):
        return f"expected ids {list(expected_ids)}, got {got}"
    if not all(item.get("embedding") for item in data):
        return "empty embedding"
    return None


class StatsEntry(Protocol):
    """The part of locust's `StatsEntry` the final summary reads."""

    method: str | None
    name: str
    num_requests: int
    num_failures: int
    max_response_time: float

    @property
    def total_rps(self) -> float: ...

    def get_response_time_percentile(self, percent: float) -> float: ...


def final_rows(entries: Iterable[StatsEntry]) -> list[dict[str, str]]:
    """Per locust entry: counts, throughput and latency percentiles (locust's own percentile method)."""
    rows: list[dict[str, str]] = []
    for entry in sorted(entries, key=lambda e: (e.method or "", e.name)):
        rows.append(
            {
                "type": str(entry.method),
                "name": entry.name,
                "requests": str(entry.num_requests),
                "failures": str(entry.num_failures),
                "requests_per_s": f"{entry.total_rps:.3f}",
                "p50_ms": f"{entry.get_response_time_percentile(0.50):.0f}",
                "p95_ms": f"{entry.get_response_time_percentile(0.95):.0f}",
                "p99_ms": f"{entry.get_response_time_percentile(0.99):.0f}",
                "max_ms": f"{entry.max_response_time:.0f}",
            }
        )
    return rows


def write_final_csv(path: str | Path, entries: Iterable[StatsEntry]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FINAL_COLUMNS)
        writer.writeheader()
        writer.writerows(final_rows(entries))
