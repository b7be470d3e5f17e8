"""Whether the pruner's formatting-element estimate (`reconstruction_bytes`) covers the elements the parser
really re-creates.

    .venv/bin/python benchmarks/reconstruction_estimate.py --trials 8000 --seed 2 --runs 12

`reconstruction_bytes` must not fall below what Lexbor's "reconstruct the active formatting elements"
really builds: the memory pre-check trusts it, so a page it underestimates without bound (clones nest
in each other: N formatting elements left open before M paragraphs make N x M elements) passes the
check and takes gigabytes. Erring long is by design (it cannot always tell where the parser's stack
stands), but one large enough refuses a page that the parser would have built.

Each trial builds a page: a lead (a context where the parser's rules differ: tables, cells, captions,
`<object>`, templates, selects, foreign content, `<frameset>`) and up to three random tags, then
`--open` distinct `<b id=N>` left open (the clones the estimate must see: each one is re-created at
every reconstruction point after its parent closes), then a random unit of up to nine tags, end tags,
self-closing tags, text and comments repeated `--repeats` times. The real clone count is Lexbor's
serialisation's formatting elements minus the page's formatting start tags (as the pre-checks'
tokenizer `tag_tokens` reads them: a start tag the parser ignores is still taken off, a tag in raw text
that the serialiser writes back is counted, either by one a tag at most). The estimate, in bytes,
stands for at most one clone per `MEMORY_PER_CLONE` (each clone charges that at least): a unit is
under-estimated where the real clones pass that by more than one a tag (the slack the counting needs),
and those are printed, worst first. Over-estimates are reported as estimate/real, the estimate read as
clones of the lead's `<b id=N>` (`MEMORY_PER_CLONE` and one `MEMORY_PER_ATTRIBUTE`: the low reading,
so the ratio does not inflate); and against the cheap bound the pruner tries first (the whole list
re-created at every tag: `tags_with_attributes` times the tags), which the replay is there to beat.

`--repo` measures another checkout's `service.core.prune` and `service.core.precheck` (a baseline tree)
on the same units. No timing here is a pass/fail figure; the output is for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from selectolax.lexbor import LexborHTMLParser

# A formatting element's start tag in Lexbor's serialisation (well-formed: a name ends at a space or ">").
SERIALISED_FORMATTING = re.compile(rb"<(?:b|big|code|em|font|i|nobr|s|small|strike|strong|tt|u|a)[\s>/]")
# Names where the parser's rules differ (tables and templates drawn more often: most fences are theirs).
NAMES = [
    *("td", "th", "tr", "tbody", "thead", "tfoot", "caption", "col", "colgroup", "table", "table", "table"),
    *("object", "applet", "marquee", "template", "template", "select", "option", "svg", "math", "mi"),
    *("mo", "desc", "foreignObject", "title", "div", "span", "p", "li", "ul", "b", "i", "a", "nobr"),
    *("font", "frameset", "frame", "body", "html", "button", "form", "textarea", "input", "keygen"),
    *("plaintext", "xmp", "iframe", "noscript", "style", "h1", "em", "dd", "annotation-xml", "image"),
    *("img", "br", "hr"),
]
TEXT = ["x", "x", " ", "<!---->", "<!--c-->x", "\n", "<!x>", "</ >", "<?p>", "&amp;", "\x00"]
LEADS = [
    *("", "<table>", "<table><tr><td>", "<template>", "<select>", "<svg>", "<math>", "<template><col>"),
    *("<table><td><object>", "<math><mi>", "<table><caption>", "<table><select>", "<object>"),
    *("<svg><foreignObject>", "<template><table>", "<table><col>", "<table><colgroup>", "<frameset>"),
    *("<table><tr><td><table>", "<table><tr><td><template>", "<select><svg>", "<table><tr><td><svg>"),
    *("<table><b>", "<table><marquee>", "<p>", "<ul><li>", "<table><tr><td><select><option>"),
    *("<!doctype html>", "<!doctype html><p>", "<svg><desc>", "<math><annotation-xml encoding=text/html>"),
]


@dataclass(frozen=True)
class Outcome:
    """One unit's page measured: the estimate in bytes, Lexbor's clones, the page's tags (`<`), and the
    cheap bound in bytes."""

    estimate: int
    real: int
    tags: int
    cheap: int


def random_tag(rng: random.Random) -> str:
    """A start tag, a self-closing one, an end tag, or text or a comment (no tag)."""
    name = rng.choice(NAMES)
    draw = rng.random()
    if draw < 0.5:
        return f"<{name}>"
    if draw < 0.55:
        return f"<{name}/>"
    if draw < 0.85:
        return f"</{name}>"
    return rng.choice(TEXT)


def random_unit(rng: random.Random, tags: int) -> str:
    return "".join(random_tag(rng) for _ in range(tags))


def page_of(lead: str, unit: str, open_: int, repeats: int) -> str:
    return lead + "".join(f"<b id={i}>" for i in range(open_)) + unit * repeats


# The modules measured: what `Checkout` holds, in its order, then the memory costs.
MODULES = (
    "prune",
    "precheck.tags",
    "precheck.elements",
    "precheck.attributes",
    "precheck.reconstruction",
    "precheck.memory",
)


@dataclass(frozen=True)
class Checkout:
    """The modules measured, imported from one checkout."""

    prune: ModuleType
    tags: ModuleType
    elements: ModuleType
    attributes: ModuleType
    reconstruction: ModuleType


def real_clones(checkout: Checkout, page: str) -> int:
    """The formatting elements Lexbor re-created: those of its serialisation (parsed as the pruner
    parses) less the page's formatting start tags."""
    root = LexborHTMLParser(page, scripting=True, options=checkout.prune._PARSER_OPTIONS).root
    serialised = root.html if root is not None and root.html is not None else ""
    made = len(SERIALISED_FORMATTING.findall(serialised.encode("utf-8", "surrogatepass")))
    data = page.encode("utf-8", "surrogatepass")
    written = sum(
        1
        for end, name, *_ in checkout.tags.tag_tokens(data)
        if not end and name in checkout.elements.FORMATTING
    )
    return int(made - written)


def measure(checkout: Checkout, page: str) -> Outcome:
    tags = page.count("<")
    list_bytes, _ = checkout.attributes.tags_with_attributes(page)
    estimate = checkout.reconstruction.reconstruction_bytes(page)
    return Outcome(estimate, real_clones(checkout, page), tags, list_bytes * tags)


def quantiles(values: list[float]) -> str:
    """p50, p90, p99 and the largest (nearest rank: no interpolation between units)."""
    if not values:
        return "none"
    ordered = sorted(values)
    picks = [ordered[min(len(ordered) - 1, int(share * len(ordered)))] for share in (0.5, 0.9, 0.99)]
    return "p50 {:.1f}, p90 {:.1f}, p99 {:.1f}, max {:.1f}".format(*picks, ordered[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8000, help="units drawn per run")
    parser.add_argument("--seed", type=int, default=2, help="the first run's seed (runs take the next ones)")
    parser.add_argument("--runs", type=int, default=12, help="runs, each with its own seed")
    parser.add_argument("--open", type=int, default=30, help="distinct <b id=N> left open before the unit")
    parser.add_argument("--repeats", type=int, default=60, help="the unit's repetitions")
    parser.add_argument("--show", type=int, default=10, help="under-estimated units printed")
    parser.add_argument(
        "--repo", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to measure"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))
    modules = {name: importlib.import_module(f"service.core.{name}") for name in MODULES}
    checkout = Checkout(*(modules[name] for name in MODULES[:-1]))
    memory = modules["precheck.memory"]
    per_clone = memory.MEMORY_PER_CLONE
    per_lead_clone = per_clone + memory.MEMORY_PER_ATTRIBUTE  # a `<b id=N>`: one attribute
    outcomes: dict[tuple[str, str], Outcome] = {}
    failures: list[tuple[str, str, str]] = []
    started = time.perf_counter()
    for seed in range(args.seed, args.seed + args.runs):
        rng = random.Random(seed)
        for _ in range(args.trials):
            lead = rng.choice(LEADS) + random_unit(rng, rng.randint(0, 3))
            unit = random_unit(rng, rng.randint(1, 9))
            if (lead, unit) in outcomes:
                continue
            try:
                outcomes[lead, unit] = measure(checkout, page_of(lead, unit, args.open, args.repeats))
            except Exception as error:  # a crash of the estimate is a finding: keep fuzzing, report it
                failures.append((lead, unit, repr(error)))
    took = time.perf_counter() - started
    print(
        f"{len(outcomes):,} distinct units ({args.runs} runs of {args.trials} from seed {args.seed}), "
        f"{args.open} <b id=N> open, unit x {args.repeats}; {args.repo}; {took:.0f} s"
    )
    under = [
        (out.real - out.estimate / per_clone, lead, unit, out)
        for (lead, unit), out in outcomes.items()
        if out.real * per_clone > out.estimate + per_clone * out.tags
    ]
    strictly = sum(1 for out in outcomes.values() if out.real * per_clone > out.estimate)
    print(f"under the real clones by more than a clone a tag: {len(under)} (by any amount: {strictly})")
    for gap, lead, unit, out in sorted(under, reverse=True)[: args.show]:
        print(
            f"  short {gap:7.0f}: estimate {out.estimate / per_clone:.0f} clones at most, real {out.real}, "
            f"{out.tags} tags  {lead!r} || {unit!r}"
        )
    cloned = [out for out in outcomes.values() if out.real > 0]
    print(
        f"estimate/real, the estimate as clones of {per_lead_clone} B ({len(cloned):,} units with clones): "
        + quantiles([out.estimate / per_lead_clone / out.real for out in cloned])
    )
    spurious = [out.estimate / per_lead_clone for out in outcomes.values() if out.real <= 0 and out.estimate]
    none = sum(1 for out in outcomes.values() if out.real <= 0)
    print(f"units without clones charged some: {len(spurious):,} of {none:,}, clones: {quantiles(spurious)}")
    charged = [out for out in outcomes.values() if out.estimate > 0]
    print(
        f"cheap bound/estimate ({len(charged):,} units charged): "
        + quantiles([out.cheap / out.estimate for out in charged])
    )
    print(f"the estimate raised on {len(failures)} units")
    for lead, unit, cause in failures[: args.show]:
        print(f"  {cause}  {lead!r} || {unit!r}")


if __name__ == "__main__":
    main()
