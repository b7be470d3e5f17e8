"""Engine-only soak: does resident memory grow while the Engine embeds pages for minutes on end?

    .venv/bin/python benchmarks/memory.py --corpus ../shared/corpus --seconds 300

Each variant runs in its own process, one after the other: the bundled default model, `--clients`
concurrent callers each sending requests of 1, 2, 4 or 8 random corpus pages (mostly 1), as crawlers
would through the service but without HTTP, so growth seen here belongs to the engine (prune, tokenize,
batcher, torch) and growth seen only in `loadtests/run.py`'s soak belongs to the HTTP layer. RSS is
sampled every `--interval` seconds; the report gives, per variant, the RSS after warm-up, its median
and slope over the second half of the run (`loadtests.sampler.memory_trend`), the peak, the documents
embedded, and both against the first variant (the baseline, glibc's default malloc):
- default: glibc malloc as the image runs it without settings;
- arena2: `MALLOC_ARENA_MAX=2`, which bounds glibc's per-thread arenas (each prune/tokenize thread and
  each torch thread would otherwise get its own and keep its freed pages).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.options import check_page_source, child_output, run  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {"default": {}, "arena2": {"MALLOC_ARENA_MAX": "2"}}


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text(encoding="ascii")
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    """One variant, in this process: the samples (seconds, documents, RSS MB)."""
    from service.core.errors import HtmllmError
    from service.core.pages import iter_pages
    from service.engine import Document, Engine, EngineConfig

    pages = [p.html for p in iter_pages(args.corpus, limit=args.limit)]
    rng = random.Random(args.seed)
    config = EngineConfig(preprocess_workers=2, max_batch_requests=64, max_batch_tokens=16384)
    engine = Engine.from_checkpoint(args.checkpoint, config)
    samples: list[tuple[float, int, float]] = []
    documents = 0
    async with engine:
        await engine.warmup()
        start = time.perf_counter()

        async def client() -> None:
            nonlocal documents
            while time.perf_counter() - start < args.seconds:
                size = rng.choice((1, 1, 1, 2, 4, 8))
                # A page the pruner refuses fails its call alike in every variant.
                with contextlib.suppress(HtmllmError):
                    await engine.embed([Document(html=rng.choice(pages)) for _ in range(size)])
                documents += size

        async def sampler() -> None:
            while time.perf_counter() - start < args.seconds:
                samples.append((time.perf_counter() - start, documents, rss_mb()))
                await asyncio.sleep(args.interval)

        await asyncio.gather(sampler(), *(client() for _ in range(args.clients)))
        samples.append((time.perf_counter() - start, documents, rss_mb()))
    return {"samples": samples}


def summarize(samples: list[list[float]]) -> dict[str, Any]:
    from loadtests.sampler import memory_trend

    trend = memory_trend([(t, mb) for t, _, mb in samples]) or {}
    # The first sample 60 s in (past the warm-up), or the last one of a shorter run: its time is kept so
    # that the table says which (a 20 s run's column had said "at 60 s").
    at, after_warmup = next(((t, mb) for t, _, mb in samples if t >= 60), (samples[-1][0], samples[-1][2]))
    seconds, documents = samples[-1][0], samples[-1][1]
    return {
        "rss_after_warmup_mb": round(after_warmup, 1),
        "rss_after_warmup_s": round(at),
        "second_half_median_mb": trend.get("second_half_median_mb"),
        "second_half_mb_per_min": trend.get("second_half_mb_per_min"),
        "max_mb": round(max(mb for _, _, mb in samples), 1),
        "documents": int(documents),
        "docs_per_s": round(documents / seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "service" / "assets" / "default-model")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="corpus pages to draw from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        json.dump(asyncio.run(soak(args)), sys.stdout)
        return 0

    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}")
    check_page_source(args.corpus)  # here, not in a child: one line, before a model is loaded
    child = [sys.executable, __file__, "--child", *(argv if argv is not None else sys.argv[1:])]
    print(
        f"# engine soak: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{args.seconds:.0f} s per variant, {args.clients} clients"
    )
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        env = {**os.environ, **VARIANTS[name]}
        results[name] = summarize(json.loads(child_output(child, env=env))["samples"])
    base = results[names[0]]
    print(
        "| variant | RSS after warm-up (MB, at s) | 2nd-half median (MB) | 2nd-half slope (MB/min) "
        f"| peak (MB) | docs/s | median vs {names[0]} |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ratio = (r["second_half_median_mb"] or 0) / (base["second_half_median_mb"] or 1)
        print(
            f"| {name} | {r['rss_after_warmup_mb']} (at {r['rss_after_warmup_s']} s) "
            f"| {r['second_half_median_mb']} | {r['second_half_mb_per_min']} | {r['max_mb']} "
            f"| {r['docs_per_s']} | {ratio:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
