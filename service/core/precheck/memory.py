"""What Lexbor's tree takes, measured: the memory the pre-checks charge per tag, per attribute and per
element the parser re-creates.

A page with so many tags that its tree would break the memory bound is refused before parsing
(`InputTooLargeError`; peak RSS under 10x the input plus 200 MB: about `MEMORY_PER_TAG` bytes per `<`
and `MEMORY_PER_ATTRIBUTE` per attribute, and `MEMORY_PER_CLONE` for each element the parser would
re-create from formatting elements left open: `reconstruction_bytes`).
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
