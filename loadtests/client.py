"""What the load-test users send, how they judge the answers and what they count, free of locust.

Kept apart from `locustfile.py` because importing locust monkey-patches the standard library with
gevent; tests and `loadtests.run` use these helpers without that.

The run's figures are counted here (`RunStats`), not taken from locust's statistics: locust records the
response time of a failure as it does an answer's (429s answered in 6 ms had pulled a p50 of 262 ms down
to 15 ms, and a dead server's refused connections reported p50 1 ms), and the stage headers, recorded as
locust requests, had multiplied its request counts and rates by six.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.pagegen import synthetic_pages
from service.core.decoding import decode_html
from service.core.pages import PageSourceError, iter_pages

STAGE_HEADERS = ("x-prune-time", "x-tokenize-time", "x-queue-time", "x-inference-time", "x-total-time")
# The type of the stage headers' rows in the final CSV, next to the POST entries' rows.
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
FAILURE_COLUMNS = ("type", "name", "failure", "count")
# The service's error codes are short snake_case words (service.core.errors.ErrorCode).
_ERROR_CODE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")


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
    """Why a 200 response is wrong, in words that are the same for every response wrong that way (they
    name the failure in the reports), or None for a complete answer."""
    try:
        data = json.loads(body)["data"]
        got = [item.get("id") for item in data]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "response is not an embed result"
    if got != list(expected_ids):
        return "ids not those sent, in order"
    if not all(item.get("embedding") for item in data):
        return "empty embedding"
    return None


def error_code(body: bytes | None) -> str | None:
    """The service's error code in a failure's body (`{"error": {"code": ...}}`), or None."""
    try:
        code = json.loads(body or b"")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else None


def connection_error(error: BaseException | None) -> str:
    """What stood in for an answer that never came: the exception's type and the OS's words for it
    (`ConnectionRefusedError: Connection refused`), never text that changes from one request to the next."""
    if error is None:
        return "no response"
    name = type(error).__name__
    reason = getattr(error, "strerror", None)
    return f"{name}: {reason}" if isinstance(reason, str) and reason else name


def request_failure(
    status: int, body: bytes | None, error: BaseException | None, expected_ids: Sequence[str]
) -> str | None:
    """A request's failure, named by kind (`HTTP 429 overloaded`, `HTTP 0 ConnectionRefusedError:
    Connection refused`, `HTTP 200 empty embedding`), or None for a complete answer.

    The name is the same for every failure of its kind: locust keeps a row per distinct message, and
    messages carrying a body's text had spread one kind over a row per request. Status 0 is no answer
    at all (a refused or dropped connection, a timeout): its name is the error, which had been left out
    (`HTTP 0: `)."""
    if status == 0:
        return f"HTTP 0 {connection_error(error)}"
    if status != 200:
        code = error_code(body)
        return f"HTTP {status} {code}" if code else f"HTTP {status}"
    problem = check_embed_response(body or b"", expected_ids)
    return None if problem is None else f"HTTP 200 {problem}"


class LatencyCounts:
    """Milliseconds, rounded to whole ones and counted: exact percentiles to the millisecond, in memory
    bounded by the distinct values (a 2-hour run's hundreds of thousands of requests keep a few thousand)."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.total = 0
        self.max_ms = 0.0

    def add(self, milliseconds: float) -> None:
        self.counts[round(milliseconds)] += 1
        self.total += 1
        self.max_ms = max(self.max_ms, milliseconds)

    def percentile(self, share: float) -> int | None:
        """The nearest-rank percentile (`share` 0.5 for the median); None with nothing counted."""
        if not self.total:
            return None
        rank, seen = max(1, math.ceil(share * self.total)), 0
        for milliseconds in sorted(self.counts):
            seen += self.counts[milliseconds]
            if seen >= rank:
                return milliseconds
        return max(self.counts)  # not reached: the counts add up to the total


@dataclass
class EntryStats:
    """One entry of the run: a POST of one kind, or one stage header."""

    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    latency: LatencyCounts = field(default_factory=LatencyCounts)  # answered requests only
    first: float | None = None
    last: float | None = None


class RunStats:
    """The run's own statistics, written when locust quits (`--final-csv`, `--failures-csv`).

    Latency percentiles are over the answered requests only; failures are counted apart, by kind
    (`request_failure`). The stage headers are counted here too, never as locust requests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.entries: dict[tuple[str, str], EntryStats] = {}

    def _entry(self, kind: str, name: str) -> EntryStats:
        entry = self.entries.setdefault((kind, name), EntryStats())
        now = self.clock()
        entry.first = now if entry.first is None else entry.first
        entry.last = now
        return entry

    def request(self, name: str, milliseconds: float, failure: str | None, method: str = "POST") -> None:
        """A request that ended: its time counts only if it was answered (`failure` None)."""
        entry = self._entry(method, name)
        entry.requests += 1
        if failure is None:
            entry.latency.add(milliseconds)
        else:
            entry.failures[failure] += 1

    def stages(self, headers: Mapping[str, str] | Any) -> None:
        """An answer's x-*-time headers (`stage_times`), one entry each."""
        for name, milliseconds in stage_times(headers).items():
            self.request(name, milliseconds, None, method=STAGE_REQUEST_TYPE)

    def rows(self) -> list[dict[str, str]]:
        """Per entry: requests, failures, throughput, and latency percentiles of the answered requests
        (empty cells where none was answered)."""
        rows: list[dict[str, str]] = []
        for (kind, name), entry in sorted(self.entries.items()):
            span = (entry.last or 0.0) - (entry.first or 0.0)
            cells = {
                "p50_ms": entry.latency.percentile(0.50),
                "p95_ms": entry.latency.percentile(0.95),
                "p99_ms": entry.latency.percentile(0.99),
                "max_ms": round(entry.latency.max_ms) if entry.latency.total else None,
            }
            rows.append(
                {
                    "type": kind,
                    "name": name,
                    "requests": str(entry.requests),
                    "failures": str(sum(entry.failures.values())),
                    "requests_per_s": f"{entry.requests / span:.3f}" if span > 0 else "",
                    **{key: "" if value is None else str(value) for key, value in cells.items()},
                }
            )
        return rows

    def failure_rows(self) -> list[dict[str, str]]:
        """Per entry and kind of failure: how many."""
        return [
            {"type": kind, "name": name, "failure": failure, "count": str(count)}
            for (kind, name), entry in sorted(self.entries.items())
            for failure, count in sorted(entry.failures.items())
        ]


def write_csv(path: str | Path, columns: Sequence[str], rows: Iterable[Mapping[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
