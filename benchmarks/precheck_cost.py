"""What the pruner's pre-parse checks cost on large pages, against Lexbor's parse of the same page and
against a baseline checkout's checks, measured in the same run.

    .venv/bin/python benchmarks/precheck_cost.py --baseline /tmp/before --runs 3

The checks (`service.core.precheck`) run on every page before Lexbor parses it, so on ordinary large
pages (a 2 MB data table, a price list) they should cost a fraction of the parse. Each page is built
here (no corpus page is needed): 2 MB of `<col><td>` in one table, a 2 MB data table, the same with
`<tbody>`, `<th>` and class attributes, 2 MB of `<p>x</p>`. For each page the CPU time
(`time.process_time`) of `estimate_depth`, `reconstruction_bytes`, `max_attributes`,
`tags_with_attributes`, `count_attributes`, `estimate_name_lookups` and of `LexborHTMLParser(page)` is
taken in a fresh process, the checkout measured and the baseline alternating, `--runs` times; the
medians are printed
with the ratio baseline/checkout for the depth estimate and for the gate: the checks as
`_prune_document` runs them, the parse stubbed out (it calls `reconstruction_bytes` and
`count_attributes` only where its memory pre-bounds say so; each is timed on its own regardless).
With `--corpus DIR`, also the gate summed over every page of the corpus (decoded as `prune_html`
decodes it): what the checks cost ordinary pages, most of which they pass with their cheap bounds.
A check the baseline lacks (`text_copies` before session 24, `name_lookups` before session 26) is left
out of its rows.
No figure here is a pass/fail line; the output is for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SIZE = 2_000_000
ROOT = Path(__file__).resolve().parents[1]


def pages() -> dict[str, bytes]:
    """The measured pages, each about `SIZE` bytes."""

    def fill(unit: str, head: str) -> bytes:
        return (head + unit * ((SIZE - len(head)) // len(unit))).encode()

    return {
        "col/td run": fill("<col><td>", "<table>"),
        "data table": fill("<tr><td>123</td><td>abc</td><td>4.5</td></tr>", "<table>"),
        "tbody/th/class table": fill(
            "<tr><th class=x>h</th><td class=x>123</td><td class=x>abc</td></tr>", "<table><tbody>"
        ),
        "<p>x</p>": fill("<p>x</p>", ""),
    }


def measure(repo: Path, corpus: Path | None) -> dict[str, dict[str, float]]:
    """CPU seconds of each check and of Lexbor's parse on each page, with `repo`'s checks (this process);
    with a corpus, the gate over all its pages too."""
    sys.path.insert(0, str(repo))
    from selectolax.lexbor import LexborHTMLParser

    from service.core import prune
    from service.core.precheck import attributes, nesting, reconstruction

    if not Path(nesting.__file__).resolve().is_relative_to(repo):
        raise SystemExit(f"imported {nesting.__file__}, not {repo}'s")
    calls = {
        "estimate_depth": lambda doc: nesting.estimate_depth(doc, limit=8192),
        "reconstruction_bytes": lambda doc: reconstruction.reconstruction_bytes(doc, limit=10 * len(doc)),
        "max_attributes": attributes.max_attributes,
        "tags_with_attributes": lambda doc: attributes.tags_with_attributes(doc, within=None, cap=True),
        "count_attributes": attributes.count_attributes,
        "lexbor_parse": LexborHTMLParser,
        "gate": lambda doc: _gate(prune, doc),
    }
    try:
        from service.core.precheck import text_growth  # type: ignore[attr-defined,unused-ignore]

        calls["text_copies"] = text_growth.text_copies
    except ImportError:
        pass  # a baseline from before it
    try:
        from service.core.precheck import names  # type: ignore[attr-defined,unused-ignore]

        calls["name_lookups"] = names.estimate_name_lookups
    except ImportError:
        pass  # a baseline from before session 26
    out: dict[str, dict[str, float]] = {}
    for name, doc in pages().items():
        out[name] = {}
        for label, call in calls.items():
            start = time.process_time()
            call(doc)
            out[name][label] = time.process_time() - start
    if corpus is not None:
        from service.core.decoding import decode_html, utf8_payload
        from service.core.pages import iter_pages

        total = 0.0
        for page in iter_pages(corpus):
            payload = utf8_payload(page.html)
            doc = payload if payload is not None else decode_html(page.html).text
            start = time.process_time()
            _gate(prune, doc)
            total += time.process_time() - start
        out["corpus"] = {"gate": total}
    return out


def _gate(prune: Any, doc: bytes) -> None:
    """The checks as `_prune_document` runs them on `doc` (the ones its pre-bounds call for, in order),
    the parse left out; a refusal ends them as it would end the page."""
    parse, prune._clean_serialization = prune._clean_serialization, lambda document, selector=None: ""
    try:
        prune._prune_document(doc, prune.DEFAULT_MAX_DEPTH)
    except prune.PruneError:
        pass
    finally:
        prune._clean_serialization = parse


def checkout(text: str) -> Path:
    """An argparse type: a checkout whose checks can be measured (a child measured any path it was given,
    and a missing one failed there, as a `CalledProcessError` that hid why)."""
    path = Path(text)
    if not (path / "service" / "core" / "precheck").is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a checkout with service/core/precheck")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=checkout, default=ROOT)
    parser.add_argument("--baseline", type=checkout, help="another checkout (with service/core/precheck)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--corpus", type=Path, help="also time the gate on every page of this corpus")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a child: measure this checkout
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one.resolve(), args.corpus)))
        return 0
    # Imported here, in the parent only: a child must import `service` from the checkout it measures
    # first, and the shared refusals import this checkout's.
    sys.path.insert(0, str(ROOT))
    from benchmarks.options import run

    return run(lambda: compare(args))


def compare(args: argparse.Namespace) -> None:
    """The parent: children measure the checkout and the baseline in turn; the medians are printed."""
    from benchmarks.options import check_page_source, child_output

    if args.corpus is not None:
        check_page_source(args.corpus)
    trees = {"checkout": args.repo.resolve()}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    runs: dict[str, list[dict[str, dict[str, float]]]] = {tree: [] for tree in trees}
    for _ in range(args.runs):
        for tree, path in trees.items():  # alternating: a noisy stretch of the machine hits both
            child = [sys.executable, __file__, "--one", str(path)]
            if args.corpus is not None:
                child += ["--corpus", str(args.corpus.resolve())]
            runs[tree].append(json.loads(child_output(child)))
    print(f"CPU seconds, median of {args.runs} runs; pages of {SIZE / 1e6:.0f} MB")
    for name in [*pages(), *(["corpus"] if args.corpus is not None else [])]:
        print(f"\n{name}")
        sums: dict[str, float] = {}
        for tree in trees:
            medians = {k: statistics.median(run[name][k] for run in runs[tree]) for k in runs[tree][0][name]}
            sums[tree] = medians["gate"]
            sums[f"{tree} depth"] = medians.get("estimate_depth", float("nan"))
            cells = "  ".join(f"{k} {v:.3f}" for k, v in medians.items())
            print(f"  {tree:9s} {cells}")
        if "baseline" in trees:
            print(f"  baseline/checkout: {ratios(sums)}")


def ratios(sums: dict[str, float]) -> str:
    """The ratios, "depth Dx, gate Gx"; the depth left out where it was not timed (the corpus row times
    only the gate: it had printed "depth nanx")."""
    cells = []
    if not math.isnan(sums["baseline depth"]) and not math.isnan(sums["checkout depth"]):
        cells.append(f"depth {sums['baseline depth'] / sums['checkout depth']:.1f}x")
    cells.append(f"gate {sums['baseline'] / sums['checkout']:.1f}x")
    return ", ".join(cells)


if __name__ == "__main__":
    sys.exit(main())
