"""How far the pruner's nesting pre-check (`estimate_depth`) is from the depth the parser really builds.

    .venv/bin/python benchmarks/depth_estimate.py --trials 1500 --seed 1

`estimate_depth` must not fall far below the parser's depth: that is what bounds Lexbor's quadratic
tree building (every scope check walks the open elements), so a page it underestimates without bound
parses in time quadratic in its size. A constant factor is by design (a `<table>` counts once where the
parser opens table, tbody, tr and td; `<p>`, `<li>`, `<a>` do not count, as the parser closes them
itself): what this measures is whether the gap *grows* with the page.

Each trial draws a random unit of tags (names chosen where the parser's rules differ: formatting
elements, scope boundaries, table structure, foreign content, `<select>`), repeats it R and 4R times,
and compares the estimate with the depth of Lexbor's tree. A unit whose real depth grows with R while
the estimate stays (real/estimate at 4R more than `--ratio` and four times what it was at R, within a
margin) is printed: an underestimate without bound. It also prints the worst ratios seen, the pages
the estimate refuses that the parser nests shallowly (false refusals: estimate past the cap, real depth
far below it; units with a `<template>` are left out of that count: the parser's stack holds its
content, which Lexbor's tree does not show), and for a few pages found by hand (`KNOWN`) the estimate,
the real depth and how the pruner fares, at about a megabyte each.

No timing here is a pass/fail figure; the output is for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from selectolax.lexbor import LexborHTMLParser

from service.core.errors import HtmllmError
from service.core.precheck.nesting import DEFAULT_MAX_DEPTH, estimate_depth
from service.core.prune import prune_html

NAMES = [
    *("div", "span", "p", "li", "ul", "b", "i", "font", "a", "table", "tr", "td", "th", "tbody", "caption"),
    *("object", "template", "select", "option", "svg", "g", "math", "mi", "form", "button", "h1", "h2"),
    *("nobr", "em", "dd", "dt", "section"),
]
# Pages found by hand: what each does to the estimate is in its name. Repeated to about `--known-bytes`.
KNOWN = {
    "end tags the parser ignores (a cell is open above the span)": "<span><table><tr><td></span></table>x",
    "end tags the parser ignores (a div is open above the span)": "<span><div>x</span>",
    "glossary: dt and dd left open": "<dt>term<dd>meaning",
    "spans left open in divs": "<div><span>x</div>",
    "spans left open in paragraphs": "<p><span>x</p>",
    "fonts left open in cells": (
        "<table><tr><td><font face=arial>x</td><td><font face=arial>y</td></tr></table>"
    ),
    "a font between a table and its rows": "<table><font size=2><tr><td>x<td>y</tr></table>",
    "misnested: a font around a paragraph's start": "<font size=2><p>x</font>",
    "an attribute name starting with = hides a tag from a regex": '<br ="><div>">',
    "a double-escaped script hides end tags from a regex": (
        "<div><script><!--<script></script></div>--></script>"
    ),
}


def random_unit(rng: random.Random, tags: int) -> str:
    parts = []
    for _ in range(tags):
        name = rng.choice(NAMES)
        draw = rng.random()
        parts.append(f"<{name}>" if draw < 0.5 else f"</{name}>" if draw < 0.9 else "x")
    return "".join(parts)


def real_depth(page: str) -> int:
    """The depth of Lexbor's tree (elements only; parsed as the pruner parses, scripting on, so a
    `<noscript>` holds text), walked without recursion."""
    root = LexborHTMLParser(page, scripting=True).root
    deepest = 0
    stack = [(root, 1)] if root is not None else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        child = node.child
        while child is not None:
            if child.tag not in ("-text", "-comment"):
                stack.append((child, depth + 1))
            child = child.next
    return deepest


def estimated(page: str) -> int:
    """The estimate with no cap (the function skips pages of fewer `<` than its limit)."""
    count = page.count("<")
    return estimate_depth(page, limit=count - 1) if count > 1 else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=50, help="R: the unit's repetitions (and 4R)")
    parser.add_argument("--ratio", type=float, default=8.0)
    parser.add_argument("--known-bytes", type=int, default=1_000_000, help="size of each known page")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    unbounded: list[tuple[float, str, int, int, int, int]] = []
    false_refusals: list[tuple[int, str, int]] = []
    worst_ratio = 0.0
    started = time.perf_counter()
    for _ in range(args.trials):
        unit = random_unit(rng, rng.randint(2, 10))
        small, large = unit * args.repeats, unit * (4 * args.repeats)
        real_small, real_large = real_depth(small), real_depth(large)
        est_small, est_large = estimated(small), estimated(large)
        ratio_small = real_small / max(est_small, 1)
        ratio_large = real_large / max(est_large, 1)
        worst_ratio = max(worst_ratio, ratio_large)
        if ratio_large > args.ratio and ratio_large > 3.5 * ratio_small:
            unbounded.append((ratio_large, unit, est_small, real_small, est_large, real_large))
        capped = unit * (DEFAULT_MAX_DEPTH // max(1, unit.count("<")) * 2 + 1)
        if "<template>" in unit:
            continue  # the parser's stack holds a template's content; Lexbor's tree does not show it
        if estimate_depth(capped) > DEFAULT_MAX_DEPTH and real_depth(capped) < DEFAULT_MAX_DEPTH // 8:
            false_refusals.append((real_depth(capped), unit, len(capped)))
    print(f"{args.trials} units, R={args.repeats}, {time.perf_counter() - started:.0f} s")
    print(f"worst real/estimate at 4R: {worst_ratio:.1f}")
    print(f"units whose gap grows with the page (real/estimate > {args.ratio} at 4R): {len(unbounded)}")
    for ratio, unit, est_small, real_small, est_large, real_large in sorted(unbounded, reverse=True)[:8]:
        print(f"  {ratio:7.1f}  {unit!r}: R {est_small}/{real_small}, 4R {est_large}/{real_large} (est/real)")
    print(
        f"false refusals (estimate past {DEFAULT_MAX_DEPTH}, real depth under {DEFAULT_MAX_DEPTH // 8}): "
        f"{len(false_refusals)}"
    )
    for real, unit, size in sorted(false_refusals)[:8]:
        print(f"  real depth {real:5d}  {unit!r} ({size:,} bytes)")
    print(f"known pages, each repeated to about {args.known_bytes:,} bytes: estimate / real depth, prune")
    for name, unit in KNOWN.items():
        page = unit * (args.known_bytes // len(unit))
        start = time.perf_counter()
        try:
            prune_html(page)
            outcome = "pruned"
        except HtmllmError as error:
            outcome = f"refused ({error.code.value})"
        took = time.perf_counter() - start
        print(f"  {estimated(page):7d} / {real_depth(page):7d}  {outcome} in {took:.2f} s  {name}: {unit!r}")


if __name__ == "__main__":
    main()
