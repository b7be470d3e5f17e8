"""The steps Lexbor takes looking names up in its hash tables of the page's tag and attribute names
(`estimate_name_lookups`): names sharing a bucket make each use walk a long list.

Lexbor keeps the tag names and attribute names it does not know (`_KNOWN_TAGS`, `_KNOWN_ATTRIBUTES`)
in two hash tables of 128 fixed buckets, each a linked list (`lexbor_hash_init(..., 128, ...)`,
Jenkins' one-at-a-time hash of the lowercased name: `_buckets`): each new name is appended to its
bucket's list, walking the names there, and every later use of it walks the list up to it. Names
chosen to share one bucket make every use of the last walk them all: 20,000 such end tag names and
200,000 repeats of the last (2.4 MB) parse in 9.1 s (about 2.3 ns a step), the same with attribute
names; 60,000 distinct names of one bucket, each used once (660 KB), in 9.7 s (5.4 ns a step: each
compares names of one length). More walks, measured the same way: a DOCTYPE's name is in the
attribute names' table; the parser spells SVG's mixed-case tag and attribute names (`<clippath>`,
`viewbox`) as SVG does and looks that spelling up too (`_SVG_SPELLINGS`); a foreign attribute
(`xlink:show`, `_FOREIGN_ATTRIBUTES`) is looked up twice, and its local name (`show`) once; and the
hidden-element selector of `service.core.prune` looks `hidden` up at every element (20,000 names in
its bucket and 200,000 elements: 13 s), so the pruner leaves it out where the page does not hold the
name.

The estimate bounds each use by its bucket's length (a name's first use by the names before it), over
a superset of the names the tokenizer reads (no page can hide one from it, as a comment or a quoted
value could hide a tag from a regex):
- a tag name follows every `<` or `</` and a letter the tokenizer reads as a tag: every such `<` is
  read as one here (a `<` read into an earlier one's name is part of a name of no tag, or starts an
  end tag of a raw-text element, all known names);
- a DOCTYPE's name follows every `<!doctype` and spaces, up to a space or `>`;
- an attribute name starts after a space, a `/` or the quote closing a quoted value, and runs to a
  space, `/`, `>` or `=` (its first character may be `=`): every such run is read as one, and after
  every `=`, spaces and a quote (a value's opening, or not), the quote closing it (the next one) is
  read as a value's close: a real value's opening is one of these, whatever false ones hold it;
- but no name follows a `>` before a `<` or a quote (the tag the name would be in ended at the `>`,
  or the `>` was in a quoted value that has not closed): a page's text is no name.
A name longer than `_HASHED_LENGTH` bytes is not hashed: it may be in any bucket (`_Table.bound`).
Names Lexbor knows are left out of the counts as they are read (`_none_of`), but for those looked up
again (SVG's spellings, foreign attributes).

What it costs: about 50 ms a megabyte of markup (the corpus: 3.5 s for 149 MB, as much as the other
checks together), so a preprocessing process its parent stops after a time limit prunes without it
(`service.core.preparation`); the thread pool, `htmllm embed --preprocess-pool thread` and library
callers, where nothing can stop a parse of minutes (it leaves the GIL free, but holds its thread and
a core), keep it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

# The tag names Lexbor knows (its `lxb_tag_res_shs_data_default`): they never reach the hash table.
_KNOWN_TAGS = frozenset(
    b"""a abbr acronym address altglyph altglyphdef altglyphitem animatecolor animatemotion
    animatetransform annotation-xml applet area article aside audio b base basefont bdi bdo bgsound big
    blink blockquote body br button canvas caption center cite clippath code col colgroup data datalist
    dd del desc details dfn dialog dir div dl dt em embed feblend fecolormatrix fecomponenttransfer
    fecomposite feconvolvematrix fediffuselighting fedisplacementmap fedistantlight fedropshadow feflood
    fefunca fefuncb fefuncg fefuncr fegaussianblur feimage femerge femergenode femorphology feoffset
    fepointlight fespecularlighting fespotlight fetile feturbulence fieldset figcaption figure font
    footer foreignobject form frame frameset glyphref h1 h2 h3 h4 h5 h6 head header hgroup hr html i
    iframe image img input ins isindex kbd keygen label legend li lineargradient link listing main
    malignmark map mark marquee math menu meta meter mfenced mglyph mi mn mo ms mtext multicol nav
    nextid nobr noembed noframes noscript object ol optgroup option output p param path picture
    plaintext pre progress q radialgradient rb rp rt rtc ruby s samp script section select slot small
    source spacer span strike strong style sub summary sup svg table tbody td template textarea
    textpath tfoot th thead time title tr track tt u ul var video wbr xmp""".split()
)
# The attribute names Lexbor knows (its `lxb_dom_attr_res_shs_data`).
_KNOWN_ATTRIBUTES = frozenset(
    b"""active alt charset checked class color content dir disabled face focus for height hover href
    html http-equiv id is maxlength multiple placeholder pool public readonly required scheme selected
    size slot src style system title type width xmlns""".split()
)
# SVG's mixed-case names (the HTML Standard's adjustments): the parser looks each spelling up as is.
_SVG_SPELLINGS = {
    name.lower(): name
    for name in b"""altGlyph altGlyphDef altGlyphItem animateColor animateMotion animateTransform clipPath
    feBlend feColorMatrix feComponentTransfer feComposite feConvolveMatrix feDiffuseLighting
    feDisplacementMap feDistantLight feDropShadow feFlood feFuncA feFuncB feFuncG feFuncR
    feGaussianBlur feImage feMerge feMergeNode feMorphology feOffset fePointLight feSpecularLighting
    feSpotLight feTile feTurbulence foreignObject glyphRef linearGradient radialGradient textPath
    attributeName attributeType baseFrequency baseProfile calcMode clipPathUnits diffuseConstant
    edgeMode filterUnits gradientTransform gradientUnits kernelMatrix kernelUnitLength keyPoints
    keySplines keyTimes lengthAdjust limitingConeAngle markerHeight markerUnits markerWidth
    maskContentUnits maskUnits numOctaves pathLength patternContentUnits patternTransform patternUnits
    pointsAtX pointsAtY pointsAtZ preserveAlpha preserveAspectRatio primitiveUnits refX refY repeatCount
    repeatDur requiredExtensions requiredFeatures specularConstant specularExponent spreadMethod
    startOffset stdDeviation stitchTiles surfaceScale systemLanguage tableValues targetX targetY
    textLength viewBox viewTarget xChannelSelector yChannelSelector zoomAndPan definitionURL""".split()
}
# Attributes the parser adjusts in foreign content, looking their names up once more, and their local
# names (`href`, `show`, `xlink`).
_FOREIGN_ATTRIBUTES = frozenset(
    b"""xlink:actuate xlink:arcrole xlink:href xlink:role xlink:show xlink:title xlink:type xml:lang
    xml:space xmlns xmlns:xlink""".split()
)
# The attribute name the hidden-element selector looks up at every element.
SELECTOR_ATTRIBUTE = b"hidden"
_BUCKETS = 128
_HASHED_LENGTH = 64
_WIDTHS = (16, _HASHED_LENGTH)


def _none_of(names: Iterable[bytes], ends: bytes) -> bytes:
    """A regex lookahead that fails at any of `names` followed by one of `ends`: grouped by first letter
    (a third of the time of one alternation), it keeps most known names out of the counts at all."""
    groups: dict[bytes, list[bytes]] = {}
    for name in sorted(names, key=len, reverse=True):
        groups.setdefault(name[:1], []).append(re.escape(name[1:]))
    alternatives = b"|".join(first + b"(?:" + b"|".join(rests) + b")" for first, rests in groups.items())
    return b"(?!(?:" + alternatives + b")[" + ends + b"])"


# A tag's name, but one Lexbor knows and looks up only as written (SVG's are looked up as spelled too).
_TAG_NAME = re.compile(
    rb"</?" + _none_of(_KNOWN_TAGS - set(_SVG_SPELLINGS), rb"\t\n\f\r />") + rb"([a-z][^\t\n\f\r />]*+)"
)
# Text after a tag's end, up to the next "<" or quote: no name is there (the module's docstring).
_AFTER_TAG_END = re.compile(rb""">[^<"']++""")
_NAME = rb"[^\t\n\f\r />][^\t\n\f\r />=]*+"
# An attribute's name after a space or "/", but one Lexbor knows (and looks up only once).
_ATTRIBUTE_NAME = re.compile(
    rb"[\t\n\f\r /]"
    + _none_of(_KNOWN_ATTRIBUTES - _FOREIGN_ATTRIBUTES, rb"\t\n\f\r />=")
    + rb"("
    + _NAME
    + rb")"
)
# Where a quoted value may open, the name right after its closing quote (none: ""): read ahead, so
# that every opening is read (a match that took the value in would skip an opening in it, and a real
# value's opening can be in a false one's: `<br c='="'a=""x>`); one pattern per quote, as a value
# holds the other.
_AFTER_VALUES = (
    re.compile(rb'=[\t\n\f\r ]*+"(?=[^"]*+"(' + _NAME + rb")?)"),
    re.compile(rb"=[\t\n\f\r ]*+'(?=[^']*+'(" + _NAME + rb")?)"),
)
# A DOCTYPE's name, which Lexbor keeps in the attribute names' table (`<!DOCTYPEx>` too).
_DOCTYPE_NAME = re.compile(rb"<!doctype[\t\n\f\r ]*+([^\t\n\f\r >]++)")
_REPLACEMENT = "\ufffd".encode()


class NameLookups(NamedTuple):
    """`estimate_name_lookups`' answer."""

    steps: int  # the most steps the parser's lookups take
    per_element: int  # and the selector's at each element (0: no element can have `SELECTOR_ATTRIBUTE`)


class _Table:
    """One of Lexbor's name tables: how often each name is looked up, and in which bucket it lies."""

    def __init__(self, known: frozenset[bytes]) -> None:
        self.known = known
        self.uses: Counter[bytes] = Counter()

    def add(self, names: Iterable[bytes]) -> None:
        self.uses.update(names)

    def bound(self, extra: dict[bytes, int]) -> tuple[int, list[int]]:
        """(the steps of every use, at most its bucket's length, each bucket's length), after
        `extra[name]` more uses of names looked up in any case (SVG's spellings: not lowercased, known
        or not)."""
        uses = {name: count for name, count in self.uses.items() if name not in self.known}
        for name, count in extra.items():
            uses[name] = uses.get(name, 0) + count
        hashed = [name for name in uses if len(name) <= _HASHED_LENGTH]
        unhashed = len(uses) - len(hashed)  # (names that may lie in any bucket)
        unhashed_uses = sum(uses.values()) - sum(uses[name] for name in hashed)
        lengths = np.zeros(_BUCKETS, dtype=np.int64)
        counts = np.zeros(_BUCKETS, dtype=np.int64)
        if hashed:
            buckets = _buckets(hashed)
            np.add.at(lengths, buckets, 1)
            np.add.at(counts, buckets, np.fromiter((uses[name] for name in hashed), np.int64, len(hashed)))
        # Each name's first use appends it to its bucket's list, walking the names before it (at most
        # D(D-1)/2 for a bucket of D names); each other use walks at most the whole list.
        steps = int((lengths * (lengths - 1) // 2 + (counts - lengths) * lengths).sum())
        steps += unhashed * int(counts.max())
        steps += unhashed_uses * (int(lengths.max()) + unhashed)
        return steps, [int(length) + unhashed for length in lengths]


def estimate_name_lookups(document: str | bytes) -> NameLookups:
    """The steps Lexbor's lookups of the page's tag and attribute names take at most (each a visit of
    one name in a bucket's list, about 2.3 ns), and those of a selector of `SELECTOR_ATTRIBUTE` at each
    element; 0 where the page does not hold the attribute's name at all, so that no element can have
    the attribute: the caller then leaves it out of the selector (its lookups at every element would
    be most of the estimate of a page whose scripts read as many names, 2,000 in the attribute's
    bucket)."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    lowered = data.lower()
    del data
    if b"\0" in lowered:  # (the tokenizer reads NUL in a name as U+FFFD)
        lowered = lowered.replace(b"\0", _REPLACEMENT)
    selector = SELECTOR_ATTRIBUTE in lowered  # (else no element has the attribute)
    tags = _Table(_KNOWN_TAGS)
    tags.add(_TAG_NAME.findall(lowered))
    attributes = _Table(_KNOWN_ATTRIBUTES)
    attributes.add(_DOCTYPE_NAME.findall(lowered))
    markup = _AFTER_TAG_END.sub(b">", lowered)
    del lowered
    attributes.add(_ATTRIBUTE_NAME.findall(markup))  # (none at the page's start: it is no tag)
    for after_values in _AFTER_VALUES:
        attributes.add(after_values.findall(markup))
    del markup
    attributes.uses.pop(b"", None)  # (no name after a value)
    tag_steps, _ = tags.bound(_spellings(tags.uses))
    extra = _spellings(attributes.uses)
    for name in _FOREIGN_ATTRIBUTES:
        if name in attributes.uses:  # (its name again, and its local name)
            for looked_up in {name, name.rpartition(b":")[2]}:
                extra[looked_up] = extra.get(looked_up, 0) + attributes.uses[name]
    attribute_steps, lengths = attributes.bound(extra)
    if not selector:
        return NameLookups(tag_steps + attribute_steps, 0)
    return NameLookups(tag_steps + attribute_steps, lengths[_buckets([SELECTOR_ATTRIBUTE])[0]])


def _spellings(uses: Counter[bytes]) -> dict[bytes, int]:
    """SVG's spellings of the names used, with their uses."""
    return {spelling: uses[name] for name, spelling in _SVG_SPELLINGS.items() if name in uses}


def _buckets(names: list[bytes]) -> np.ndarray:
    """Each name's bucket: Jenkins' one-at-a-time hash (Lexbor's `lexbor_hash_make_id`) modulo 128, for
    names of at most `_HASHED_LENGTH` bytes, in C: the names of each width class laid out in the rows of
    one array, padded in front with zero bytes (which leave the hash at 0), and hashed a column at a time."""
    lengths = np.fromiter(map(len, names), np.int64, len(names))
    buckets = np.empty(len(names), dtype=np.int64)
    narrower = 0
    for width in _WIDTHS:  # (two widths: few numpy calls on small pages, little padding)
        rows = np.flatnonzero((lengths > narrower) & (lengths <= width))
        narrower = width
        if not len(rows):
            continue
        sizes = lengths[rows]
        flat = np.frombuffer(b"".join([names[row] for row in rows]), dtype=np.uint8)
        padded = np.zeros((len(rows), width), dtype=np.uint8)
        starts = np.cumsum(sizes) - sizes  # (each name's first byte in `flat`)
        offsets = np.arange(len(flat)) - np.repeat(starts, sizes)
        padded[np.repeat(np.arange(len(rows)), sizes), np.repeat(width - sizes, sizes) + offsets] = flat
        hashes = np.zeros(len(rows), dtype=np.uint32)
        for column in range(width):
            hashes += padded[:, column]
            hashes += hashes << np.uint32(10)
            hashes ^= hashes >> np.uint32(6)
        hashes += hashes << np.uint32(3)
        hashes ^= hashes >> np.uint32(11)
        hashes += hashes << np.uint32(15)
        buckets[rows] = hashes % _BUCKETS
    return buckets
