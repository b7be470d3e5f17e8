"""A burst of large pages: the server's peak memory with the in-flight body budget and without it.

    .venv/bin/python benchmarks/body_burst.py --clients 150 --page-mb 15

The same server (`python -m service.api`, the bundled default model) is started twice: with
`HTMLLM_MAX_INFLIGHT_BYTES` at its default (or `--budget-mb`) and with it at 1 TiB, which is no bound at
all. Each time `--clients` clients at once post one raw page of `--page-mb` MB (generated: paragraphs
of words, as a long article or a forum dump would be; a crawler's largest pages are this size), and the
resident memory of the server and its children is sampled every 20 ms. Reported per run: the statuses
the clients got (200, 429 with Retry-After, or a transport error), the peak RSS above the idle server's,
and the seconds the burst took. Without a budget the peak grows with the number of clients (each
accepted body stays in memory until answered); with it, it stays near idle + a small multiple of the
budget, and the clients beyond it are told to come back.

`--body json` posts the same bytes as a JSON request of four documents (a quarter of the page each),
`--body json-emoji` the same with an emoji at the start of each document, which makes Python hold each
parsed document in four bytes a character: the server charges a JSON body for its parsed strings too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.service import start_server  # noqa: E402
from service.api.settings import Settings, default_model_path  # noqa: E402

UNBOUNDED = 1 << 40  # 1 TiB: no budget


def large_page(megabytes: float, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    words = ["crawl", "page", "index", "search", "html", "text", "model", "token", "batch", "queue"]
    paragraphs = []
    size = 0
    target = int(megabytes * 1024 * 1024)
    while size < target:
        paragraph = "<p>" + " ".join(rng.choice(words) for _ in range(rng.randint(20, 80))) + "</p>\n"
        paragraphs.append(paragraph)
        size += len(paragraph)
    return (
        "<html><head><title>a long page</title></head><body>" + "".join(paragraphs) + "</body></html>"
    ).encode()


def tree_rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its children (the worker processes), in MiB."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(child) for child in children]
    except OSError:
        pass
    for each in pids:
        try:
            status = Path(f"/proc/{each}/status").read_text(encoding="ascii")
        except OSError:
            continue
        line = next((line for line in status.splitlines() if line.startswith("VmRSS:")), None)
        total += int(line.split()[1]) if line else 0
    return total / 1024


async def burst(url: str, pid: int, body: bytes, clients: int) -> tuple[Counter[str], float, float]:
    """(statuses, peak RSS MiB, seconds) of `clients` concurrent posts of `body`."""
    peak = 0.0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_mb(pid))
            await asyncio.sleep(0.02)

    content_type = "application/json" if body.startswith(b"{") else "text/html"

    async def post(client: httpx.AsyncClient) -> str:
        try:
            response = await client.post(
                f"{url}/v1/embed", content=body, headers={"content-type": content_type}, timeout=600
            )
        except httpx.TransportError as exc:
            return type(exc).__name__
        if response.status_code == 429 and "retry-after" not in response.headers:
            return "429 without Retry-After"
        return str(response.status_code)

    watcher = asyncio.create_task(watch())
    started = time.perf_counter()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients)) as client:
        statuses = await asyncio.gather(*(post(client) for _ in range(clients)))
    seconds = time.perf_counter() - started
    done.set()
    await watcher
    return Counter(statuses), peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--clients", type=int, default=150)
    parser.add_argument("--page-mb", type=float, default=15.0)
    parser.add_argument("--budget-mb", type=float, default=None, help="default: the setting's default")
    parser.add_argument("--body", choices=("raw", "json", "json-emoji"), default="raw")
    args = parser.parse_args()
    body = large_page(args.page_mb)
    if args.body != "raw":
        text = body.decode()
        quarter = len(text) // 4
        prefix = "\N{GRINNING FACE}" if args.body == "json-emoji" else ""
        documents = [{"html": prefix + text[i * quarter : (i + 1) * quarter]} for i in range(4)]
        body = json.dumps({"documents": documents}, ensure_ascii=False).encode()
    budget = (
        Settings.model_fields["max_inflight_bytes"].default
        if args.budget_mb is None
        else int(args.budget_mb * 1024 * 1024)
    )
    size = len(body) / 2**20
    print(
        f"{platform.node()} {os.cpu_count()} CPUs; {args.clients} clients x {size:.1f} MiB, {args.body} body"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, limit in (("budget", budget), ("no budget", UNBOUNDED)):
            env = {"HTMLLM_MAX_INFLIGHT_BYTES": str(limit), "HTMLLM_REQUEST_TIMEOUT_S": "600"}
            proc, url = start_server(args.model, env, Path(tmp) / "server.log")
            try:
                time.sleep(1.0)  # the warm-up's garbage settles
                idle = tree_rss_mb(proc.pid)
                statuses, peak, seconds = asyncio.run(burst(url, proc.pid, body, args.clients))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            rows.append((name, limit, statuses, idle, peak, seconds))
    for name, limit, statuses, idle, peak, seconds in rows:
        shown = "none" if limit == UNBOUNDED else f"{limit / 2**20:.0f} MiB"
        print(
            f"{name:>9} ({shown}): {dict(sorted(statuses.items()))}  idle {idle:.0f} MiB, "
            f"peak {peak:.0f} MiB (+{peak - idle:.0f}), {seconds:.1f} s"
        )
    bounded, unbounded = rows[0][4] - rows[0][3], rows[1][4] - rows[1][3]
    print(f"peak above idle, no budget / budget: {unbounded / max(bounded, 1):.2f}x")


if __name__ == "__main__":
    main()
