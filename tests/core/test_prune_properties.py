"""Properties of the pruner on generated pages, and the fast implementation against the reference.

Pages come from a generator that follows HTML's content model (phrasing content in `<p>` and headings,
`<li>` in lists, cells in rows) and mixes in everything the pruner must remove: scripts and styles
holding markup-like strings, comments, `<noscript>`, `<template>`, SVG drawings, hidden elements,
attributes, entities and whitespace. It records, as it builds a page, the words a reader would see, in
order; every text node is padded with spaces, so that no two words can touch across a tag.
"""

from __future__ import annotations

import html
import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.precheck.elements import VOID
from service.core.prune import _HEADINGS, _NEVER_MOVED_UP, _NEVER_REPLACED, prune_html
from tests.reference_prune import reference_prune

WORDS = ("alpha", "beta", "gamma", "delta", "Čech", "naïve", "x&amp;y", "&lt;tag&gt;", "a&nbsp;b", "1.5")
INLINE = ("span", "b", "i", "em", "strong", "small", "a", "label")
BLOCK = ("div", "section", "article", "header", "footer", "nav", "blockquote", "main", "aside", "figure")
ATTRIBUTES = ('class="c1 c2"', 'id="n1"', 'data-x="1 > 0"', 'style="color: red"', "title='t &amp; t'")
NOISE = (
    '<script>var s = "<p>not text</p>"; if (a < b) {}</script>',
    "<style>p > b { color: red }</style>",
    "<!-- a comment with <b>markup</b> -->",
    "<noscript><p>enable javascript</p></noscript>",
    "<template><p>template row</p></template>",
    "<svg viewBox='0 0 1 1'><g><text>drawing</text></g></svg>",
    "<div hidden><p>hidden words</p></div>",
    "<span style='display:none'>invisible</span>",
    "<input type='hidden' value='1'>",
    "<div><span></span></div>",
    "<img src='a.png'>",
    "<br>",
    "<iframe src='f.html'>fallback</iframe>",
)
TAG_OR_TEXT = re.compile(r"<(/?)([a-z0-9]+)>|([^<]+)")


class Page:
    """A page under construction: its markup and the words a reader sees, in order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.parts: list[str] = []
        self.words: list[str] = []
        self.document_html = ""

    def text(self) -> None:
        chosen = [self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 3))]
        self.parts.append(" " + " ".join(chosen) + self.rng.choice((" ", "\n  ", " \t ")))
        self.words.extend(html.unescape(" ".join(chosen)).split())

    def start(self, tag: str) -> None:
        attrs = " ".join(self.rng.sample(ATTRIBUTES, self.rng.randint(0, 2)))
        upper = self.rng.random() < 0.1
        self.parts.append(f"<{tag.upper() if upper else tag}{' ' + attrs if attrs else ''}>")

    def end(self, tag: str) -> None:
        self.parts.append(f"</{tag}>")

    def phrasing(self, depth: int) -> None:
        for _ in range(self.rng.randint(1, 3)):
            roll = self.rng.random()
            if roll < 0.45 or depth <= 0:
                self.text()
            elif roll < 0.8:
                tag = self.rng.choice(INLINE)
                self.start(tag)
                self.phrasing(depth - 1)
                self.end(tag)
            elif roll < 0.9:
                self.parts.append(self.rng.choice(("<br>", "<img src='i.png'>", "<wbr>")))
            else:
                self.parts.append(self.rng.choice(NOISE[:3] + NOISE[7:9]))

    def flow(self, depth: int) -> None:
        for _ in range(self.rng.randint(1, 4)):
            roll = self.rng.random()
            if roll < 0.15 or depth <= 0:
                self.text()
            elif roll < 0.35:
                tag = self.rng.choice(BLOCK)
                self.start(tag)
                self.flow(depth - 1)
                self.end(tag)
            elif roll < 0.5:
                tag = self.rng.choice(("p", "h1", "h2", "h3"))
                self.start(tag)
                self.phrasing(depth - 1)
                self.end(tag)
            elif roll < 0.6:
                tag = self.rng.choice(("ul", "ol"))
                self.start(tag)
                for _ in range(self.rng.randint(1, 3)):
                    self.start("li")
                    self.flow(depth - 1) if self.rng.random() < 0.3 else self.phrasing(depth - 1)
                    self.end("li")
                self.end(tag)
            elif roll < 0.68:
                self.start("table")
                for _ in range(self.rng.randint(1, 2)):
                    self.start("tr")
                    for _ in range(self.rng.randint(1, 2)):
                        cell = self.rng.choice(("td", "th"))
                        self.start(cell)
                        self.phrasing(depth - 1)
                        self.end(cell)
                    self.end("tr")
                self.end("table")
            elif roll < 0.75:
                self.phrasing(depth - 1)
            else:
                self.parts.append(self.rng.choice(NOISE))

    def document(self) -> str:
        head = ""
        if self.rng.random() < 0.7:
            head = "<title>"
            self.text()
            head += self.parts.pop() + "</title>"
        self.parts.append(f"<!DOCTYPE html><html><head>{head}<meta charset='utf-8'></head><body>")
        self.flow(5)
        self.parts.append("</body></html>")
        return "".join(self.parts)


def generate(seed: int | random.Random) -> Page:
    page = Page(seed if isinstance(seed, random.Random) else random.Random(seed))
    page.document_html = page.document()
    return page


def visible_words(pruned: str) -> list[str]:
    return html.unescape(re.sub(r"<[^>]*>", " ", pruned)).split()


def single_child_violations(pruned: str) -> list[str]:
    """Elements of the output with exactly one element child and no text, outside rule 5's exceptions."""
    stack: list[list[object]] = [["#root", 0, False, ""]]  # tag, element children, has text, last child
    bad: list[str] = []
    for slash, name, text in TAG_OR_TEXT.findall(pruned):
        if text:
            stack[-1][2] = stack[-1][2] or bool(text.strip())
        elif slash:
            tag, kids, has_text, last = stack.pop()
            parent = stack[-1]
            parent[1] = int(parent[1]) + 1  # type: ignore[call-overload]
            parent[3] = tag
            exempt = tag in _NEVER_REPLACED or last in _NEVER_MOVED_UP or last in _HEADINGS
            if kids == 1 and not has_text and not exempt:
                bad.append(str(tag))
        elif name in VOID:
            stack[-1][1] = int(stack[-1][1]) + 1  # type: ignore[call-overload]
            stack[-1][3] = name
        else:
            stack.append([name, 0, False, ""])
    return bad


PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(st.randoms(use_true_random=False))
def test_idempotent(rng: random.Random) -> None:
    pruned = prune_html(generate(rng).document_html)
    assert prune_html(pruned) == pruned


@PROPERTY_SETTINGS
@given(st.randoms(use_true_random=False))
def test_no_attributes_scripts_styles_or_comments(rng: random.Random) -> None:
    pruned = prune_html(generate(rng).document_html)
    assert re.fullmatch(r"(?:</?[a-z][a-z0-9]*>|[^<>])*", pruned), pruned
    for marker in ("<script", "<style", "<!--", "not text", "drawing", "hidden words", "invisible"):
        assert marker not in pruned


@PROPERTY_SETTINGS
@given(st.randoms(use_true_random=False))
def test_visible_words_are_kept_in_order(rng: random.Random) -> None:
    page = generate(rng)
    assert visible_words(prune_html(page.document_html)) == page.words


@PROPERTY_SETTINGS
@given(st.randoms(use_true_random=False))
def test_no_element_with_exactly_one_element_child(rng: random.Random) -> None:
    assert single_child_violations(prune_html(generate(rng).document_html)) == []


def test_fast_matches_the_reference_token_for_token() -> None:
    mismatches = []
    for seed in range(150):
        page = generate(seed).document_html
        fast, ref = prune_html(page), reference_prune(page)
        if fast != ref:
            fast_tokens, ref_tokens = TAG_OR_TEXT.findall(fast), TAG_OR_TEXT.findall(ref)
            first = next(
                (i for i, (a, b) in enumerate(zip(fast_tokens, ref_tokens, strict=False)) if a != b),
                min(len(fast_tokens), len(ref_tokens)),
            )
            mismatches.append((seed, first, fast_tokens[first : first + 3], ref_tokens[first : first + 3]))
    assert mismatches == []


def test_reference_matches_on_the_documented_decisions() -> None:
    pages = (
        "<html><head><title>T</title></head><body><p>a</p><p>b</p></body></html>",
        "<table><tr><td>x</td></tr></table><ul><li>m<ul><li>s</li></ul></li></ul>",
        "<p>x<iframe>f</iframe><svg><text>d</text></svg> &lt;&amp;&gt; a&nbsp;b</p><xmp><b>x</b></xmp>",
        "<div> <p hidden>h</p> <span style='display: none'>n</span> <b>v</b> </div>",
    )
    for page in pages:
        assert prune_html(page) == reference_prune(page)


def test_generator_produces_what_it_claims() -> None:
    page = generate(7)
    assert page.words and "<script>" in "".join(generate(s).document_html for s in range(20))
