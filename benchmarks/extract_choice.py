"""How the union's choice among the outputs that pass the filter changes its quality: a study on a corpus.

    .venv/bin/python benchmarks/extract_choice.py --corpus ../shared/corpus

Every extractor's output of every page is computed once (in-process, `extract_all`, the union's filter),
then each rule picks one output per page from the same texts, and is scored as `benchmarks/extract.py`
scores the union: yield, total words, `with` snippets found and `without` snippets absent. The
"consensus" of a page is the word 4-grams (Chinese and Japanese characters, Thai, Lao, Khmer and
Myanmar letters each a word) that at least two of the three outputs share. Figures and the conclusion
in docs/benchmarks.md, "Choosing among the passing outputs".
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from extract import Sample, load, squash  # noqa: E402

from benchmarks.options import run  # noqa: E402
from service.core.extract import EXTRACTORS, Extraction, InlineRunner, extract_all  # noqa: E402

_TOKEN = re.compile(
    r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]|[^\W_]+"
)
_SHINGLE = 4


@dataclass
class Page:
    sample: Sample
    outputs: dict[str, Extraction]  # the extractors that ran, in the default order
    shingles: dict[str, set[tuple[str, ...]]]

    @property
    def passing(self) -> list[str]:
        return [name for name, out in self.outputs.items() if out.passed]

    def first(self, order: tuple[str, ...] = EXTRACTORS) -> str | None:
        """The union's rule: the first passing output in `order`, else the longest."""
        passed = [name for name in order if name in self.outputs and self.outputs[name].passed]
        if passed:
            return passed[0]
        ran = [name for name in order if name in self.outputs]
        return max(ran, key=lambda name: self.outputs[name].words) if ran else None

    def consensus(self) -> set[tuple[str, ...]]:
        names = list(self.shingles)
        agreed: set[tuple[str, ...]] = set()
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                agreed |= self.shingles[a] & self.shingles[b]
        return agreed

    def precision_recall(self, name: str, consensus: set[tuple[str, ...]]) -> tuple[float, float]:
        own = self.shingles[name]
        shared = len(own & consensus)
        return (shared / len(own) if own else 0.0, shared / len(consensus) if consensus else 0.0)


def shingles(text: str) -> set[tuple[str, ...]]:
    tokens = _TOKEN.findall(text.lower())
    if len(tokens) < _SHINGLE:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + _SHINGLE]) for i in range(len(tokens) - _SHINGLE + 1)}


def longest(page: Page) -> str | None:
    passed = page.passing
    return max(passed, key=lambda name: page.outputs[name].words) if passed else page.first()


def best_f1(page: Page) -> str | None:
    if len(page.passing) < 2:
        return page.first()
    consensus = page.consensus()

    def f1(name: str) -> float:
        p, r = page.precision_recall(name, consensus)
        return 2 * p * r / (p + r) if p + r else 0.0

    return max(page.passing, key=f1)  # the earliest in order on ties


def most_consensus(page: Page) -> str | None:
    if len(page.passing) < 2:
        return page.first()
    consensus = page.consensus()
    return max(page.passing, key=lambda name: page.precision_recall(name, consensus)[1])


def switch_for_recall(margin: float) -> Callable[[Page], str | None]:
    def rule(page: Page) -> str | None:
        chosen = page.first()
        if len(page.passing) < 2 or chosen is None:
            return chosen
        consensus = page.consensus()
        recall = page.precision_recall(chosen, consensus)[1]
        for name in page.passing:
            if page.precision_recall(name, consensus)[1] > recall + margin:
                chosen, recall = name, page.precision_recall(name, consensus)[1]
        return chosen

    return rule


def switch_when_uncovered(page: Page) -> str | None:
    """The first, unless it holds under half of what the two others agree on (at least 20 shingles)."""
    chosen = page.first()
    others = [name for name in page.shingles if name != chosen]
    if len(page.passing) < 2 or chosen is None or len(others) < 2:
        return chosen
    agreed = page.shingles[others[0]] & page.shingles[others[1]]
    if len(agreed) < 20 or len(page.shingles[chosen] & agreed) >= len(agreed) / 2:
        return chosen
    return next(name for name in page.passing if name != chosen)


def switch_when_dominated(page: Page) -> str | None:
    chosen = page.first()
    if len(page.passing) < 2 or chosen is None:
        return chosen
    consensus = page.consensus()
    p, r = page.precision_recall(chosen, consensus)
    for name in page.passing:
        q, s = page.precision_recall(name, consensus)
        if s >= r and q > p:
            chosen, p, r = name, q, s
    return chosen


def oracle(page: Page) -> str | None:
    def found(name: str) -> tuple[int, int]:
        flat = squash(page.outputs[name].text)
        return (
            sum(squash(s) in flat for s in page.sample.with_snippets),
            sum(squash(s) not in flat for s in page.sample.without_snippets),
        )

    return max(page.passing, key=found) if page.passing else page.first()


RULES: dict[str, Callable[[Page], str | None]] = {
    "first in order, resiliparse first (the union)": lambda page: page.first(),
    "first in order, trafilatura first": lambda page: page.first(("trafilatura", "resiliparse", "justext")),
    "longest": longest,
    "best F1 against the consensus": best_f1,
    "most of the consensus": most_consensus,
    "the first, unless another holds 30 points more of the consensus": switch_for_recall(0.3),
    "the first, unless it holds under half of what the other two agree on": switch_when_uncovered,
    "the first, unless another holds as much of the consensus and less else": switch_when_dominated,
    "best by the snippets themselves (an oracle, for scale)": oracle,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus", default="../shared/corpus", help="page corpus (a dir with manifest.jsonl)"
    )
    parser.add_argument("--limit", type=int, default=None, help="use only the first N pages")
    parser.add_argument("--min-words", type=int, default=50, help="yield threshold and the union's filter")
    args = parser.parse_args()

    pages = []
    for sample in load(args.corpus, args.limit):
        results = extract_all(sample.html, runner=InlineRunner(), timeout_s=None, min_words=args.min_words)
        outputs = {name: out for name, out in results.items() if isinstance(out, Extraction)}
        pages.append(Page(sample, outputs, {name: shingles(out.text) for name, out in outputs.items()}))
    print(f"{len(pages)} pages from {args.corpus}", file=sys.stderr)

    print("| rule among the outputs that pass | yield | total words | with found | without absent | chosen |")
    print("|---|---:|---:|---:|---:|---|")
    for label, rule in RULES.items():
        yielded = words = found = absent = 0
        chosen: Counter[str] = Counter()
        for page in pages:
            name = rule(page)
            out = page.outputs[name] if name is not None else None
            text, count = (out.text, out.words) if out is not None else ("", 0)
            chosen[name or "none"] += 1
            flat = squash(text)
            yielded += count >= args.min_words
            words += count
            found += sum(squash(s) in flat for s in page.sample.with_snippets)
            absent += sum(squash(s) not in flat for s in page.sample.without_snippets)
        with_total = sum(len(p.sample.with_snippets) for p in pages) or 1
        without_total = sum(len(p.sample.without_snippets) for p in pages) or 1
        print(
            f"| {label} | {yielded / len(pages):.1%} | {words:,} | {found / with_total:.2%} "
            f"| {absent / without_total:.2%} | {dict(chosen)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
