"""Locust load test for the htmllm service: crawlers posting raw pages to `POST /v1/embed`.

Each simulated user is a crawler worker that posts pages back to back: mostly JSON bodies of
`--docs-per-request` documents, sometimes one raw page (`text/html`, bytes as crawled). Pages come from
`--corpus` (any source `service.core.pages.iter_pages` reads: the shared corpus directory, a JSONL file, a
directory of HTML files) or, by default, from `loadtests.pagegen`, whose sizes follow real crawled HTML.

Besides request latency, every response's `x-prune-time`, `x-tokenize-time`, `x-queue-time`,
`x-inference-time` and `x-total-time` headers (milliseconds) are recorded as their own entries (request
type `stage`), so the CSV and HTML reports show where the time goes under load.

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
    STAGE_REQUEST_TYPE,
    LoadPage,
    check_embed_response,
    embed_body,
    load_pool,
    stage_times,
    write_final_csv,
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
        "periodic --csv files, which can miss the last second)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("HTMLLM_API_KEY", ""),
        help="bearer token when the server has HTMLLM_API_KEY set (default: that variable)",
    )


def on_quitting(environment: Any, **_: Any) -> None:
    path = str(getattr(environment.parsed_options, "final_csv", "") or "")
    if path:
        write_final_csv(path, environment.stats.entries.values())


# Locust loads this file to run it; registering these hooks is what loading it is for. (The event hooks
# are untyped in locust, hence the Any.)
_hooks: Any = events
_hooks.init_command_line_parser.add_listener(add_arguments)
_hooks.quitting.add_listener(on_quitting)

# One pool per load-generator process, filled by the first user to start (the others find it filled).
_pool: list[LoadPage] = []


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

    def record_stages(self, headers: Any) -> None:
        for name, milliseconds in stage_times(headers).items():
            self.environment.events.request.fire(
                request_type=STAGE_REQUEST_TYPE,
                name=name,
                response_time=milliseconds,
                response_length=0,
                exception=None,
                context={},
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
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")
                return
            problem = check_embed_response(response.content or b"", ids)
            if problem:
                response.failure(problem)
                return
            response.success()
        self.record_stages(response.headers)
