"""What the Engine's result cache buys on a crawl stream with repeated pages, in one run.

    .venv/bin/python benchmarks/result_cache.py --corpus ../shared/corpus --unique 400 --repeats 0.3

The stream: `--unique` corpus pages, plus enough random repeats of them that `--repeats` of the stream
are pages seen before (re-crawls, mirrors, error pages), shuffled. The bundled default model embeds the
same stream twice, as `--clients` concurrent callers sending one page each: with the cache off (the
baseline) and with `result_cache_documents` large enough to hold every page. Reported: docs/s of both
and the CPU seconds the process spent per document (on a shared VM the CPU ratio is the steadier one:
hypervisor steal moves wall time, not the work done), their ratios, the cache hits, and the largest
difference between a cached answer and the uncached one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.options import run  # noqa: E402
from service.core.errors import HtmllmError  # noqa: E402
from service.core.pages import iter_pages  # noqa: E402
from service.engine import Document, DocumentResult, Engine, EngineConfig, EngineObserver  # noqa: E402


class _Hits(EngineObserver):
    def __init__(self) -> None:
        self.hits = 0

    def cache_hit(self) -> None:
        self.hits += 1


async def _run(
    checkpoint: Path, stream: list[bytes], clients: int, cache: int
) -> tuple[float, float, list[DocumentResult | None], int]:
    observer = _Hits()
    engine = Engine.from_checkpoint(checkpoint, EngineConfig(result_cache_documents=cache))
    engine.observer = observer
    results: list[DocumentResult | None] = [None] * len(stream)
    position = 0
    async with engine:
        await engine.warmup()
        started, cpu_started = time.perf_counter(), time.process_time()

        async def client() -> None:
            nonlocal position
            while position < len(stream):
                index, position = position, position + 1
                with contextlib.suppress(HtmllmError):  # refused by the pruner: alike in both runs
                    (results[index],) = await engine.embed([Document(html=stream[index])])

        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return elapsed, cpu, results, observer.hits


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "service" / "assets" / "default-model")
    parser.add_argument("--unique", type=int, default=400)
    parser.add_argument("--repeats", type=float, default=0.3, help="share of the stream that repeats a page")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.repeats < 1:
        parser.error("--repeats must be in [0, 1)")

    rng = random.Random(args.seed)
    unique = [p.html for p in iter_pages(args.corpus, limit=args.unique)]
    extra = round(len(unique) * args.repeats / (1 - args.repeats))
    stream = unique + [rng.choice(unique) for _ in range(extra)]
    rng.shuffle(stream)

    off_s, off_cpu, off, _ = asyncio.run(_run(args.checkpoint, stream, args.clients, 0))
    on_s, on_cpu, on, hits = asyncio.run(_run(args.checkpoint, stream, args.clients, len(unique)))
    worst = max(
        (float(np.abs(a.embedding - b.embedding).max()) for a, b in zip(off, on, strict=True) if a and b),
        default=0.0,
    )
    print(
        f"# result cache: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{len(stream)} documents ({len(unique)} unique, {extra} repeats), {args.clients} clients"
    )
    print("| cache | seconds | docs/s | CPU s per doc | hits | docs/s vs off | CPU per doc, off / on |")
    print("|---|---|---|---|---|---|---|")
    n = len(stream)
    print(f"| off | {off_s:.1f} | {n / off_s:.2f} | {off_cpu / n:.3f} | 0 | 1.00 | 1.00 |")
    print(
        f"| on ({len(unique)} documents) | {on_s:.1f} | {n / on_s:.2f} | {on_cpu / n:.3f} | {hits} "
        f"| {off_s / on_s:.2f} | {off_cpu / on_cpu:.2f} |"
    )
    print(f"largest |cached - uncached| over all embedding components: {worst:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
