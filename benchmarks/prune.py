"""Benchmark the pruner: the fast implementation against the BeautifulSoup reference, in one run.

    .venv/bin/python benchmarks/prune.py --corpus ../shared/corpus

For every page of the corpus (raw bytes, decoding included in every timing) it times
`service.core.prune.prune_html` (best of `--repeat` runs), the reference of `tests/reference_prune.py`
(BeautifulSoup + lxml on the HTML5 tree; one run) and, unless `--no-raw-lxml`, the same rules on lxml's
own tree of the page (the paper's literal set-up, `reference_prune_raw`), and `prune_html` as the
service's preprocessing processes run it ("as served": held to a memory limit of 2048 MiB or less, they
leave out the text growth check, and stopped after a time limit, the name lookup check:
`service.core.preparation.prune_document`). It reports pages/s and MB/s of each, the median per-page
speed-up and the ratio of totals, the output size against the raw bytes, the token reduction
(whitespace tokenizer, raw page vs pruned page), and the share of pages on which the fast and reference
outputs are identical, with the ids of the others.

Timings are CPU time of this process (`time.process_time`) on one pinned core: the benchmark machine
is shared, and wall-clock time would include waiting for the CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.options import affinity_cpu, run
from service.core.decoding import decode_html
from service.core.pages import iter_pages
from service.core.prune import PRUNE_VERSION, prune_html
from tests.reference_prune import reference_prune, reference_prune_raw


def _timed(fn: Callable[[bytes], str], data: bytes, repeat: int) -> tuple[str, float]:
    best = float("inf")
    result = ""
    for _ in range(repeat):
        start = time.process_time()
        result = fn(data)
        best = min(best, time.process_time() - start)
    return result, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="../shared/corpus", help="page collection (see iter_pages)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N pages")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the fast pruner per page (best)")
    parser.add_argument("--cpu", type=affinity_cpu, default=0, help="pin the process to this CPU (one core)")
    parser.add_argument(
        "--no-raw-lxml", action="store_true", help="skip the reference on lxml's own tree of the page"
    )
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    pages = list(iter_pages(args.corpus, limit=args.limit))
    if not pages:
        print(f"no pages in {args.corpus}", file=sys.stderr)
        return 1
    # Warm up imports and caches outside the timings.
    prune_html(pages[0].html)
    reference_prune(pages[0].html)

    fast_s: list[float] = []
    ref_s: list[float] = []
    raw_s: list[float] = []
    served_s: list[float] = []
    served_different: list[str] = []
    served = functools.partial(prune_html, text_growth=False, name_lookups=False)
    raw_bytes = out_bytes = raw_tokens = out_tokens = 0
    different: list[str] = []
    raw_different = 0
    for page in pages:
        fast, t_fast = _timed(prune_html, page.html, args.repeat)
        ref, t_ref = _timed(reference_prune, page.html, 1)
        fast_s.append(t_fast)
        ref_s.append(t_ref)
        as_served, t_served = _timed(served, page.html, args.repeat)
        served_s.append(t_served)
        if as_served != fast:
            served_different.append(page.id)
        if fast != ref:
            different.append(page.id)
        if not args.no_raw_lxml:
            raw, t_raw = _timed(reference_prune_raw, page.html, 1)
            raw_s.append(t_raw)
            raw_different += raw != fast
        raw_bytes += len(page.html)
        out_bytes += len(fast.encode("utf-8"))
        raw_tokens += len(decode_html(page.html).text.split())
        out_tokens += len(fast.split())

    n, mb = len(pages), raw_bytes / 1e6
    speedups = [r / f for r, f in zip(ref_s, fast_s, strict=True) if f > 0]
    figures: dict[str, object] = {
        "prune_version": PRUNE_VERSION,
        "pages": n,
        "raw_mb": round(mb, 2),
        "fast_pages_per_s": round(n / sum(fast_s), 1),
        "fast_mb_per_s": round(mb / sum(fast_s), 2),
        "fast_median_ms": round(statistics.median(fast_s) * 1e3, 3),
        "reference_pages_per_s": round(n / sum(ref_s), 1),
        "reference_mb_per_s": round(mb / sum(ref_s), 2),
        "reference_median_ms": round(statistics.median(ref_s) * 1e3, 3),
        "speedup_median_per_page": round(statistics.median(speedups), 1),
        "speedup_of_totals": round(sum(ref_s) / sum(fast_s), 1),
        "output_share_of_raw_bytes": round(out_bytes / raw_bytes, 4),
        "raw_tokens": raw_tokens,
        "pruned_tokens": out_tokens,
        "token_reduction": round(1 - out_tokens / raw_tokens, 4),
        "identical_share": round(1 - len(different) / n, 4),
        "different_pages": different,
        "served_pages_per_s": round(n / sum(served_s), 1),
        "served_median_ms": round(statistics.median(served_s) * 1e3, 3),
        "served_speedup_median_per_page": round(
            statistics.median(r / f for r, f in zip(ref_s, served_s, strict=True) if f > 0), 1
        ),
        "served_speedup_of_totals": round(sum(ref_s) / sum(served_s), 1),
        "served_different_pages": served_different,
    }
    if raw_s:
        raw_speedups = [r / f for r, f in zip(raw_s, fast_s, strict=True) if f > 0]
        figures |= {
            "raw_lxml_pages_per_s": round(n / sum(raw_s), 1),
            "raw_lxml_median_ms": round(statistics.median(raw_s) * 1e3, 3),
            "raw_lxml_speedup_median_per_page": round(statistics.median(raw_speedups), 1),
            "raw_lxml_identical_share": round(1 - raw_different / n, 4),
        }

    print(f"pruner {PRUNE_VERSION}: {n} pages, {mb:.1f} MB raw, one core (CPU time)")
    print(
        f"fast       {figures['fast_pages_per_s']:>8} pages/s {figures['fast_mb_per_s']:>7} MB/s"
        f"  median {figures['fast_median_ms']} ms/page"
    )
    print(
        f"reference  {figures['reference_pages_per_s']:>8} pages/s {figures['reference_mb_per_s']:>7} MB/s"
        f"  median {figures['reference_median_ms']} ms/page"
    )
    print(
        f"speed-up   {figures['speedup_median_per_page']}x median per page, "
        f"{figures['speedup_of_totals']}x of totals"
    )
    print(
        f"as served  {figures['served_pages_per_s']:>8} pages/s  "
        f"median {figures['served_median_ms']} ms/page, "
        f"speed-up {figures['served_speedup_median_per_page']}x median, "
        f"{figures['served_speedup_of_totals']}x of totals; output differs from fast on "
        f"{len(served_different)} pages"
    )
    if raw_s:
        print(
            f"raw lxml   {figures['raw_lxml_pages_per_s']:>8} pages/s  median "
            f"{figures['raw_lxml_median_ms']} ms/page, "
            f"speed-up {figures['raw_lxml_speedup_median_per_page']}x, "
            f"identical to fast on {figures['raw_lxml_identical_share']:.1%} of pages"
        )
    print(f"output     {out_bytes / 1e6:.2f} MB = {figures['output_share_of_raw_bytes']:.2%} of raw bytes")
    print(
        f"tokens     {raw_tokens} raw -> {out_tokens} pruned "
        f"({figures['token_reduction']:.1%} fewer, whitespace tokenizer)"
    )
    print(f"identical  {figures['identical_share']:.2%} of pages; different: {', '.join(different) or '-'}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
