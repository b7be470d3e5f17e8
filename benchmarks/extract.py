"""Benchmark the extractors and their union on a page corpus: speed, yield, words and snippet quality.

    .venv/bin/python benchmarks/extract.py --corpus ../shared/corpus

For each of resiliparse, trafilatura, jusText, the union (default order) and the union in seeded random
order, in one run over the same pages, through the real isolated path (`ExtractorPool`, one worker, so
pages/s is a one-core figure):
- pages/s, and its ratio to the baseline measured in the same run: resiliparse called in-process
  (`InlineRunner`, no isolation), the cheapest extraction there is;
- yield: the share of pages with >= 50 words;
- total words;
- quality on the manifest's snippets: the share of `with` snippets found in the text and the share of
  `without` snippets absent from it (exact, case-sensitive, both sides normalised as extracted text is,
  `normalize_text`, and their whitespace collapsed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.options import run  # noqa: E402
from service.core.extract import (  # noqa: E402
    EXTRACTORS,
    Extraction,
    ExtractionError,
    ExtractionTimeoutError,
    ExtractorPool,
    InlineRunner,
    Runner,
    count_words,
    extract,
)
from service.core.extract.normalize import normalize_text  # noqa: E402
from service.core.pages import iter_pages  # noqa: E402


@dataclass
class Sample:
    id: str
    html: bytes
    with_snippets: list[str]
    without_snippets: list[str]


@dataclass
class Row:
    name: str
    seconds: float = 0.0
    pages: int = 0
    yielded: int = 0
    words: int = 0
    with_found: int = 0
    with_total: int = 0
    without_absent: int = 0
    without_total: int = 0
    errors: int = 0
    timeouts: int = 0
    chosen: Counter[str] = field(default_factory=Counter)

    def metrics(self, baseline_pps: float) -> dict[str, Any]:
        pps = self.pages / self.seconds if self.seconds else 0.0
        return {
            "method": self.name,
            "pages": self.pages,
            "pages_per_s": round(pps, 1),
            "x_baseline": round(pps / baseline_pps, 3) if baseline_pps else None,
            "yield": round(self.yielded / self.pages, 4) if self.pages else 0.0,
            "total_words": self.words,
            "with_recall": round(self.with_found / self.with_total, 4) if self.with_total else None,
            "without_absent": round(self.without_absent / self.without_total, 4)
            if self.without_total
            else None,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "chosen": dict(self.chosen),
        }


def squash(text: str) -> str:
    # Some snippets were copied from pages with their invisible characters ("Klima\xadwandel": soft
    # hyphens in 9 of the corpus's, U+2063 in one): they are what a reader sees, as the extracted text
    # is now, so both sides go through the normalisation every output gets (it includes NFC).
    return " ".join(normalize_text(text).split())


def load(corpus: str, limit: int | None) -> list[Sample]:
    samples = []
    for page in iter_pages(corpus, limit=limit):
        with_s = [s for s in page.meta.get("with", []) if isinstance(s, str)]
        without_s = [s for s in page.meta.get("without", []) if isinstance(s, str)]
        samples.append(Sample(page.id, page.html, with_s, without_s))
    return samples


def score(row: Row, sample: Sample, text: str, min_words: int) -> None:
    words = count_words(text)
    flat = squash(text)
    row.pages += 1
    row.yielded += words >= min_words
    row.words += words
    row.with_total += len(sample.with_snippets)
    row.with_found += sum(squash(s) in flat for s in sample.with_snippets)
    row.without_total += len(sample.without_snippets)
    row.without_absent += sum(squash(s) not in flat for s in sample.without_snippets)


def run_method(
    name: str, samples: list[Sample], runner: Runner, args: argparse.Namespace, **options: Any
) -> Row:
    row = Row(name)
    texts: list[str] = []
    started = time.perf_counter()
    for sample in samples:
        try:
            result: Extraction = extract(
                sample.html, timeout_s=args.timeout_s, min_words=args.min_words, runner=runner, **options
            )
        except ExtractionError as exc:
            row.errors += 1
            row.timeouts += isinstance(exc, ExtractionTimeoutError)
            texts.append("")
            continue
        row.chosen[result.extractor] += 1
        row.timeouts += sum(a.timed_out for a in result.attempts)
        texts.append(result.text)
    row.seconds = time.perf_counter() - started
    # Scoring stays outside the timed loop: it measures the benchmark, not the extractor.
    for sample, text in zip(samples, texts, strict=True):
        score(row, sample, text, args.min_words)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus", default="../shared/corpus", help="page corpus (a dir with manifest.jsonl)"
    )
    parser.add_argument("--limit", type=int, default=None, help="use only the first N pages")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="time limit per extractor and page")
    parser.add_argument("--min-words", type=int, default=50, help="yield threshold and the union's filter")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-order union")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()

    samples = load(args.corpus, args.limit)
    if not samples:
        print(f"no pages in {args.corpus}", file=sys.stderr)
        return 1
    print(f"{len(samples)} pages from {args.corpus}", file=sys.stderr)

    baseline = run_method(
        "baseline: resiliparse in-process", samples, InlineRunner(), args, extractor="resiliparse"
    )
    rows = []
    with ExtractorPool(1) as pool:
        extract(samples[0].html, "union", runner=pool)  # start the worker outside the timings
        for name in EXTRACTORS:
            rows.append(run_method(name, samples, pool, args, extractor=name))
            print(f"  {name}: {rows[-1].seconds:.1f} s", file=sys.stderr)
        rows.append(run_method("union", samples, pool, args, extractor="union"))
        rows.append(
            run_method(
                f"union (random, seed {args.seed})", samples, pool, args, order="random", seed=args.seed
            )
        )
    base_pps = baseline.pages / baseline.seconds
    table = [r.metrics(base_pps) for r in [baseline, *rows]]

    header = (
        "| method | pages/s | x baseline | yield (>= {0} words) | total words | with found | without absent |"
    )
    print(header.format(args.min_words))
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in table:
        print(
            f"| {m['method']} | {m['pages_per_s']} | {m['x_baseline']} | {m['yield']:.1%} "
            f"| {m['total_words']:,} | {m['with_recall']:.1%} | {m['without_absent']:.1%} |"
        )
    for m in table:
        if m["errors"] or m["timeouts"]:
            print(f"{m['method']}: {m['errors']} pages failed, {m['timeouts']} extractor time-outs")
    for m in table[-2:]:
        print(f"{m['method']} chose: {m['chosen']}")

    singles = [m for m in table if m["method"] in EXTRACTORS]
    union = next(m for m in table if m["method"] == "union")
    best_yield = max(m["yield"] for m in singles)
    best_recall = max(m["with_recall"] for m in singles)
    print(
        f"union yield {union['yield']:.1%} vs best single {best_yield:.1%} "
        f"({'higher' if union['yield'] > best_yield else 'NOT higher'}); "
        f"with-recall {union['with_recall']:.1%} vs best single {best_recall:.1%} "
        f"({(union['with_recall'] - best_recall) * 100:+.1f} points)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
