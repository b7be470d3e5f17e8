"""Benchmark the service's bounded tokenization against tokenizing whole pages, in one run.

    .venv/bin/python benchmarks/tokenization.py --corpus ../shared/corpus
    .venv/bin/python benchmarks/tokenization.py --synthetic-only

The service tokenizes only the prefix of a pruned page that fills the model's length
(`HtmlTokenizer.encode(..., count_all=False)`). This script measures, with the checkpoint's tokenizer
(the bundled default model's unless `--checkpoint`):
- on every corpus page (pruned once, outside the timings): milliseconds per page of the bounded encode
  and of the whole page's encode cut afterwards (the baseline), at each `--lengths`, and whether their
  ids agree on every page (they must: the bounded encode is exact);
- on synthetic pathological pages, the kinds whose missing whitespace once made the bounded encode read
  megabytes (CJK prose, a punctuation run, glued tags, giant words: each [UNK], so the bounded encode
  read on to the end until service.core.words shortened them) and a long ordinary page: the same two
  timings (the word-character table is built before, as a worker builds it once);
- the longest pause a ticking thread sees while a 3 MB page is tokenized whole: through `tokenizers`'
  `Tokenizer.encode` (holds the GIL) and through `HtmlTokenizer` (releases it). In the server that
  thread is the event loop.
Timings are wall-clock, best of `--repeat`; the machine is shared, so compare ratios within a run.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.options import at_least, check_page_source, comma_list, run
from service.api.settings import default_model_path
from service.core.pages import iter_pages
from service.core.prune import prune_html
from service.core.tokenizer import HtmlTokenizer
from service.core.words import word_chars


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def _timings(tok: HtmlTokenizer, texts: list[str], length: int, repeat: int) -> tuple[float, float, int]:
    """(bounded s, whole s, texts whose ids agree) for tokenizing `texts` to `length` tokens."""
    bounded = _best(lambda: [tok.encode(t, max_length=length, count_all=False) for t in texts], repeat)
    whole = _best(lambda: [tok.encode(t, max_length=length) for t in texts], repeat)
    agree = sum(
        tok.encode(t, max_length=length, count_all=False).ids == tok.encode(t, max_length=length).ids
        for t in texts
    )
    return bounded, whole, agree


def synthetic_pages() -> dict[str, str]:
    words = " ".join(f"word{i % 97}" for i in range(20_000))
    return {
        "CJK prose, 300K characters": "<p>" + "北京是中华人民共和国的首都。" * 21_500 + "</p>",
        "punctuation run, 1 MB": "<div>" + "!?-=*" * 200_000 + "</div>",
        "glued tags, 1 MB": "<ul>" + "<li>item</li><li>x,y</li>" * 40_000 + "</ul>",
        "one 1 MB word, then text": "x" * 1_000_000 + " " + words,
        "one 4 MB word": "y" * 4_000_000,
        "4 MB of 30 KB words": " ".join(["z" * 30_000] * 133),
        "4 MB of 209-char words": " ".join(["z" * 209] * 19_000),
        "4 MB of symbols": "©®" * 2_000_000,
        "3 MB of jamo words": " ".join(["\u1100\u1161\u11a8" * 1000] * 1000),
        "ordinary text, 150 KB": "<p>" + words + "</p>",
    }


def longest_pause(work: Callable[[], object]) -> float:
    """The longest gap between two 1-ms ticks of another thread while `work` runs."""
    stop = threading.Event()
    gaps: list[float] = []

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.05)
    work()
    stop.set()
    ticker.join()
    return max(gaps)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, help="the shared corpus directory (manifest.jsonl)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the bundled model")
    parser.add_argument(
        "--lengths",
        type=comma_list(at_least(1)),
        default=[256, 512, 2048],
        help="max lengths, comma-separated",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synthetic-only", action="store_true")
    args = parser.parse_args()
    if not args.synthetic_only:
        if args.corpus is None:
            parser.error("--corpus is required unless --synthetic-only")
        check_page_source(args.corpus)
    tok = HtmlTokenizer.from_file(args.checkpoint or default_model_path())
    lengths: list[int] = args.lengths
    print(f"tokenizer {tok!r}")
    started = time.perf_counter()
    word_chars()
    print(f"word-character table: built in {time.perf_counter() - started:.2f} s (once per process)")

    if not args.synthetic_only:
        pruned = []
        for page in iter_pages(args.corpus, bad_rows="report"):
            if page.error is None:
                try:
                    pruned.append(prune_html(page.html))
                except Exception:  # a page the pruner refuses is not a tokenization case
                    continue
        print(f"\ncorpus: {len(pruned)} pruned pages")
        print(
            f"{'length':>6} | {'bounded ms/page':>15} | {'whole ms/page':>13} | {'speed-up':>8} | ids agree"
        )
        for length in lengths:
            bounded, whole, agree = _timings(tok, pruned, length, args.repeat)
            per = 1e3 / len(pruned)
            print(
                f"{length:>6} | {bounded * per:>15.3f} | {whole * per:>13.3f} | {whole / bounded:>7.1f}x "
                f"| {agree}/{len(pruned)}"
            )

    length = lengths[0]
    print(f"\nsynthetic pages at {length} tokens")
    print(f"{'page':<28} | {'bounded ms':>10} | {'whole ms':>9} | {'speed-up':>8} | ids agree")
    for name, text in synthetic_pages().items():
        bounded, whole, agree = _timings(tok, [text], length, args.repeat)
        print(
            f"{name:<28} | {bounded * 1e3:>10.2f} | {whole * 1e3:>9.1f} | {whole / bounded:>7.0f}x "
            f"| {agree == 1}"
        )

    big = "word " * 600_000
    holding = longest_pause(lambda: tok.backend.encode(big, add_special_tokens=False))
    releasing = longest_pause(lambda: tok.encode(big))
    print(
        f"\nlongest pause of another thread while a 3 MB page is tokenized whole: "
        f"Tokenizer.encode {holding * 1e3:.0f} ms, HtmlTokenizer.encode {releasing * 1e3:.0f} ms "
        f"({holding / releasing:.0f}x shorter)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
