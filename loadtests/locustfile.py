"""Locust load test for the htmllm service: crawlers posting raw pages to `POST /v1/embed`.

Each simulated user is a crawler worker that posts pages back to back: mostly JSON bodies of
`--docs-per-request` documents, sometimes one raw page (`text/html`, bytes as crawled). Pages come from
`--corpus` (any source `service.core.pages.iter_pages` reads: the shared corpus directory, a JSONL file, a
directory of HTML files) or, by default, from `loadtests.pagegen`, whose sizes follow real crawled HTML.

The run's figures are the locustfile's own (`loadtests.client.RunStats`), written when locust quits:
`--final-csv` gets each entry's requests, failures and latency percentiles over the answered requests
(locust's own percentiles include the failures' times), and a row per stage header (`x-prune-time`,
`x-tokenize-time`, `x-queue-time`, `x-inference-time`, `x-total-time`, milliseconds, type `stage`) that
shows where the time went; `--failures-csv` gets the failures counted by entry and kind (`HTTP 429
overloaded`, `HTTP 0 ConnectionRefusedError: Connection refused`). Locust's own CSVs and HTML report
count the POST entries only: the stage headers are not locust requests (fired as such, they had made
its Aggregated row six times the real request count and rate).

Run it through `make loadtest` (or `python -m loadtests.run`), which starts a local server on 127.0.0.1
and bounds the run; to run locust by hand against a server you started yourself:

    python -m locust -f loadtests/locustfile.py --headless -u 8 -r 4 -t 60s --host http://127.0.0.1:8000
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from locust import FastHttpUser, between, events, task

from loadtests.client import (
    FAILURE_COLUMNS,
    FINAL_COLUMNS,
    LoadPage,
    RunStats,
    embed_body,
    load_pool,
    request_failure,
    write_csv,
)


def add_arguments(parser: Any) -> None:
    """The load test's own flags, next to locust's (`locust --help` lists them)."""
    parser.add_argument(
        "--corpus",
        default="",
        help="pages to post, any source iter_pages reads (default: synthetic pages from loadtests.pagegen)",
    )
    parser.add_argument("--page-pool", type=int, default=200, help="pages held in memory and posted in turn")
    parser.add_argument("--docs-per-request", type=int, default=1, help="documents per JSON request")
    parser.add_argument(
        "--raw-share", type=float, default=0.1, help="share of requests sent as raw text/html"
    )
    parser.add_argument("--page-seed", type=int, default=0, help="seed of the synthetic pages and the draws")
    parser.add_argument(
        "--final-csv",
        default="",
        help="write the run's final totals and percentiles here when locust quits (exact, unlike the "
        "periodic --csv files, which can miss the last second; percentiles of answered requests only)",
    )
    parser.add_argument(
        "--failures-csv",
        default="",
        help="write the run's failures, counted by entry and kind (HTTP 429 overloaded), here when "
        "locust quits",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("HTMLLM_API_KEY", ""),
        help="bearer token when the server has HTMLLM_API_KEY set (default: that variable)",
    )


def on_quitting(environment: Any, **_: Any) -> None:
    options = environment.parsed_options
    final = str(getattr(options, "final_csv", "") or "")
    if final:
        write_csv(final, FINAL_COLUMNS, _stats.rows())
    failures = str(getattr(options, "failures_csv", "") or "")
    if failures:
        write_csv(failures, FAILURE_COLUMNS, _stats.failure_rows())


# Locust loads this file to run it; registering these hooks is what loading it is for. (The event hooks
# are untyped in locust, hence the Any.)
_hooks: Any = events
_hooks.init_command_line_parser.add_listener(add_arguments)
_hooks.quitting.add_listener(on_quitting)

# One pool per load-generator process, filled by the first user to start (the others find it filled).
_pool: list[LoadPage] = []
# One count per load-generator process, written when it quits (`on_quitting`).
_stats = RunStats()


class CrawlerUser(FastHttpUser):
    """A crawler worker: posts a page (or a few), reads the answer, posts the next."""

    # Crawlers pipeline fetches, but a worker pauses a little between pages (parsing, politeness).
    wait_time = between(0.0, 0.05)
    network_timeout = 120.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.docs_per_request = max(1, int(getattr(options, "docs_per_request", 1)))
        self.raw_share = float(getattr(options, "raw_share", 0.1))
        key = str(getattr(options, "api_key", "") or "")
        self.auth = {"authorization": f"Bearer {key}"} if key else {}
        seed = int(getattr(options, "page_seed", 0))
        self.rng = random.Random(f"{seed}-{id(self)}")
        if not _pool:
            _pool[:] = load_pool(
                str(getattr(options, "corpus", "")), int(getattr(options, "page_pool", 200)), seed
            )

    @task
    def embed(self) -> None:
        if self.rng.random() < self.raw_share:
            page = self.rng.choice(_pool)
            self.post(
                f"/v1/embed?id={quote(page.id, safe='')}",
                name="/v1/embed raw text/html",
                data=page.html,
                content_type="text/html",
                ids=[page.id],
            )
            return
        pages = [self.rng.choice(_pool) for _ in range(self.docs_per_request)]
        ids = [f"{p.id}#{i}" for i, p in enumerate(pages)]
        self.post(
            "/v1/embed",
            name=f"/v1/embed json x{len(pages)}",
            data=embed_body(pages, ids),
            content_type="application/json",
            ids=ids,
        )

    def post(self, path: str, *, name: str, data: bytes, content_type: str, ids: Sequence[str]) -> None:
        headers = {"content-type": content_type, **self.auth}
        # FastHttpSession sends bytes bodies as they are; its annotation only names str.
        payload: Any = data
        with self.client.post(
            path, name=name, data=payload, headers=headers, catch_response=True
        ) as response:
            # Status 0: no answer; the connection's error is `response.error`, its content None.
            body = None if response.status_code == 0 else response.content
            failure = request_failure(response.status_code, body, getattr(response, "error", None), ids)
            if failure is None:
                response.success()
            else:
                response.failure(failure)
        _stats.request(name, float(response.request_meta["response_time"]), failure)
        if failure is None:
            _stats.stages(response.headers)
