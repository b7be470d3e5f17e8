"""What Lexbor's tree takes, measured: the memory the pre-checks charge per tag, per attribute and per
element the parser re-creates.

A page with so many tags that its tree would break the memory bound is refused before parsing
(`InputTooLargeError`; peak RSS under 10x the input plus 200 MB: about `MEMORY_PER_TAG` bytes per `<`
but `MEMORY_PER_END_TAG` per end tag that makes no element (`end_tags_without_elements`),
`MEMORY_PER_ATTRIBUTE` per attribute, and `MEMORY_PER_CLONE` for each element the parser would
re-create from formatting elements left open: `reconstruction_bytes`, and `TEXT_COPY_KEPT` of the
bytes copied to grow a text node in pieces: `text_growth_memory`).
"""

from __future__ import annotations

# Peak memory is bounded by 10x the input plus 200 MiB: Lexbor's tree and the pruning lists take at
# most about MEMORY_PER_TAG bytes per "<" (measured on pages made of nothing but "<p>x"), so a page
# with more tags than its budget allows is refused before parsing (the interpreter keeps the rest).
MEMORY_PER_TAG = 400
# Each attribute takes Lexbor about 250 bytes more (measured: 250-300 on pages of `<b a b c d e f>x</b>`
# and of tags with 26 to 1,000 distinct names), and one can be written in two bytes (" a", "/a"): a
# 16 MiB page of 676-attribute tags took 1.35 GB under the per-tag charge alone. Counted only where
# the most attributes a page could hold would break its budget (pages over about a megabyte).
MEMORY_PER_ATTRIBUTE = 250
# A formatting element the parser re-creates (see `reconstruction_bytes`) costs about a tag's memory and
# 2 us: 60 KB of `<p><b id=N>x` made 8 million of them (16 s, 3.2 GB).
MEMORY_PER_CLONE = MEMORY_PER_TAG
# An end tag makes no node (the HTML Standard: only `</p>` with no <p> in scope makes an empty <p>, and
# `</br>` a <br>); one that pops an element makes the text after it a new text node (about 140 bytes:
# `<b>x</b>y` against `<i>x</i>`), which the element's own charge does not cover. Long tag names cost
# more than the 10x a byte allows (about 13 bytes a character of a name): at 300, 14 MB of
# `<abcdefghijklm>x</abcdefghijklm>y` peaked 4 MiB under the bound; at 350, 53 MiB under. Every page
# measured at the largest size this lets through is under the bound (docs/preprocessing.md).
MEMORY_PER_END_TAG = 350
# Of the bytes Lexbor copies to grow a text node in pieces (`service.core.precheck.text_growth`), what
# it keeps: 0.12 to 0.35 of them with one allocation between two pieces (measured on pages of pieces
# from 1 byte to 64 KB between comments, cells and attributes), 0.53 with two, 1.05 with three or more
# (its arena then reuses none of the old copies), and none with nothing allocated between (a piece
# foster-parented too); a character reference may decode to 1.2 times its bytes (`&nGt;`: 6), which the
# estimate counts since 2026-12-05 (the headroom stays).
TEXT_COPY_KEPT = 1.1
# The same per allocation between two pieces: at most 0.36 (one: 0.34-0.36, two: 0.25-0.27, three: 0.34-
# 0.36 of the copy, then less: measured on `<p>` + pieces of 8-200 bytes between 1-10 `</x a=N>`), 0.45
# with the character references; for the cheap bounds that count allocations, each ahead of one copy.
TEXT_COPY_KEPT_PER_ALLOCATION = 0.45

# Every ASCII letter as "a", but p, b and r as themselves: after it, "</a", "</b" and "</r" start the
# end tags that make no element ("</p" and "</br" do; "</" and no letter is a bogus comment, a node).
_LETTERS = b"abcdefghijklmnopqrstuvwxyz"
_END_TAG_LETTERS = bytes.maketrans(
    _LETTERS + _LETTERS.upper(), bytes(c if c in b"pbr" else ord("a") for c in _LETTERS) * 2
)


def end_tags_without_elements(document: str | bytes) -> int:
    """How many `<` of the page start an end tag other than `</p` and `</br` (any case): each may be
    charged `MEMORY_PER_END_TAG` instead of `MEMORY_PER_TAG`. Those in raw text, comments or attribute
    values count too (they make no node either). In C: one translation and four counts (0.1 s for 16 MB)."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    letters = data.translate(_END_TAG_LETTERS)
    del data
    return letters.count(b"</a") + letters.count(b"</r") + letters.count(b"</b") - letters.count(b"</br")
