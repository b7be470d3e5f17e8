"""The steps Lexbor takes looking names up in its hash tables of the page's tag and attribute names
(`estimate_name_lookups`): names sharing a bucket make each use walk a long list.

Lexbor keeps the tag names and attribute names it does not know (`_KNOWN_TAGS`, `_KNOWN_ATTRIBUTES`) in
two hash tables of 128 fixed buckets, each a linked list (`lexbor_hash_init(..., 128, ...)`, Jenkins'
one-at-a-time hash of the lowercased name: `_buckets`): each new name is appended to its bucket's list,
walking the names there, and every later use of it walks the list up to it. Names chosen to share one
bucket make every use of the last walk them all: 20,000 such end tag names and 200,000 repeats of the
last (2.4 MB) parse in 9.1 s (about 2.3 ns a step), the same with attribute names; 60,000 distinct names
of one bucket, each used once (660 KB), in 9.7 s (5.4 ns a step: each compares names of one length).
More walks, measured the same way: a DOCTYPE's name is in the attribute names' table; while an
`<annotation-xml>` is the current node the tree builder looks its `encoding` up at every token (20,000
names in that bucket, 2 MB of `</q>`: 19 s); the parser spells SVG's mixed-case tag and attribute names
(`<clippath>`, `viewbox`) as SVG does and looks that spelling up too (`_SVG_SPELLINGS`); a foreign
attribute (`xlink:show`, `_FOREIGN_ATTRIBUTES`) is looked up twice, and its local name (`show`) once;
and the hidden-element selector of `service.core.prune` looks `hidden` up at every element (20,000 names
in its bucket and 200,000 elements: 13 s), so the pruner leaves it out where the page does not hold the
name.

The estimate bounds each use by its bucket's length (a name's first use by the names before it), each
step weighted by the names in its table (`_CACHE_NAMES`: many lists interleave in memory, so each step
misses the cache: 15-45 ns a step with 30,000-150,000 names, against 2.3), over a superset of the names
the tokenizer reads (`_read_tags`). A tag read from where it starts is read as the tokenizer reads it
(the tag grammar of `service.core.precheck.tags`: its attributes' names, values, quoted values that
hold `>`); so the page is read as a run of tags, each from the next `<` and a letter after the one
before it. A real tag that is not one of these starts inside one of them (a `<a` in a comment or a
script, read as a tag), after a `>` that ended what the tokenizer was in (a comment, a tag): outside
the false tag's quoted values that `>` would have ended it too, so it is in one of them; or it is the
end tag of raw text (`</title>`, `</script>`), which the tokenizer reads after no `>`. So every tag
starting inside a tag after a `>` in its quoted values, and every raw text's end tag, is read again
from its own start; past `_READ_AGAIN` bytes read again a byte of the page (tags nested in unclosed
values) the estimate reads a wider superset instead (`_names_anywhere`). DOCTYPE names follow every
`<!doctype`. Words in quoted values, scripts and text are then no names (SVG path data, inline JSON: a
coarser reading counted them, refusing such pages from 3 MB). A name longer than `_HASHED_LENGTH`
bytes is not hashed: it may be in any bucket (`_Table.bound`).

What it costs: about 15 ms a megabyte of markup (the corpus: 2.3 s for 149 MB), so a preprocessing
process its parent stops after a time limit prunes without it (`service.core.preparation`); the
thread pool, `htmllm embed --preprocess-pool thread` and library callers, where nothing can stop a
parse of minutes (it leaves the GIL free, but holds its thread and a core), keep it.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

from service.core.precheck.tags import RAW_TEXT_NAMES, TAG_ATTRIBUTES_REST

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
# A step's cost grows with the table's names, which the lists interleave in memory: 2.3 ns a step in
# the cache, 15 ns with 30,000 names, 25 with 60,000, 36-44 with 150,000 (a review, session 26: one
# walk misses the cache at each name); each step counts as len(names) / _CACHE_NAMES, at most
# _MOST_WEIGHT, steps in the cache.
_CACHE_NAMES = 4000
_MOST_WEIGHT = 20.0
_HASHED_LENGTH = 64
_WIDTHS = (16, _HASHED_LENGTH)
# The buckets of names hashed before, in this process (`_buckets`); emptied when it would pass
# _BUCKETS_KEPT names (under 10 MiB; threads emptying it together may pass that count by a little).
_BUCKETS_KEPT = 1 << 16
_BUCKET_OF: dict[bytes, int] = {}


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
# A tag as the tokenizer reads it from its `<` (`_read_tags`): its name, the rest (`TAG_ATTRIBUTES_REST`:
# its attributes, a `>` only in quoted values); the names in a rest; a tag's
# start; an end tag of raw text, which the tokenizer reads after no `>`.
_TAG = re.compile(rb"</?([a-z][^\t\n\f\r />]*+)(" + TAG_ATTRIBUTES_REST + rb")")
_ATTRIBUTES = re.compile(
    rb"[\t\n\f\r />]*+("
    + _NAME
    + rb""")(?:[\t\n\f\r ]*+=[\t\n\f\r ]*+(?:"[^"]*+"?|'[^']*+'?|[^\t\n\f\r >]*+))?"""
)
_TAG_START = re.compile(rb"</?[a-z]")
_RAW_TEXT_END = re.compile(rb"</(?:" + RAW_TEXT_NAMES + rb")(?=[\t\n\f\r />])")
# The most `_read_tags` reads again inside tags, in bytes a byte of the page; the bytes of rests or of
# the page read for names at a time (so that a page of millions of names is refused before it has them).
_READ_AGAIN = 4
_BATCH = 1 << 20
_TRAILING = b"\t\n\f\r />"
# While an <annotation-xml> is the current node, the tree builder looks up its `encoding` at each token.
_ANNOTATION = b"<annotation-xml"
_ANNOTATION_ATTRIBUTE = b"encoding"
# A DOCTYPE's name, which Lexbor keeps in the attribute names' table (`<!DOCTYPEx>` too).
_DOCTYPE_NAME = re.compile(rb"<!doctype[\t\n\f\r ]*+([^\t\n\f\r >]++)")
_REPLACEMENT = "\ufffd".encode()


class NameLookups(NamedTuple):
    """`estimate_name_lookups`' answer."""

    steps: int  # the most steps the parser's lookups take
    per_element: int  # and the selector's at each element (0 only where no element can have the attribute)


class _Table:
    """One of Lexbor's name tables: how often each name is looked up, and in which bucket it lies."""

    def __init__(self, known: frozenset[bytes], most: int) -> None:
        self.known = known
        self.most = most + len(known)  # (the distinct names counted, known ones too)
        self.uses: Counter[bytes] = Counter()

    def add(self, names: Iterable[bytes]) -> None:
        """Count `names`; _TooManyNames past `most` distinct names (then no page of them fits the cap,
        and their count would only take memory)."""
        self.uses.update(names)
        if len(self.uses) > self.most:
            raise _TooManyNames(_fewest_steps(len(self.uses) - len(self.known)))

    def bound(self, extra: dict[bytes, int], probe: bytes = SELECTOR_ATTRIBUTE) -> tuple[int, int]:
        """(the steps of every use, at most its bucket's length; the steps of a lookup of `probe`, its
        bucket's length), after `extra[name]` more uses of names looked up in any case (SVG's spellings:
        not lowercased, known or not)."""
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
        # A list of names spread in memory misses the cache at each step: _CACHE_NAMES names to the unit.
        weight = _weight(len(uses))
        return int(steps * weight), int((int(lengths[_buckets([probe])[0]]) + unhashed) * weight)


class _TooManyNames(Exception):
    """A table holds more distinct names than a page within the caller's cap can (`_Table.add`)."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps)
        self.steps = steps


def _weight(names: int) -> float:
    """What a step costs in a table of `names` names, in steps in the cache (`_CACHE_NAMES`)."""
    return min(_MOST_WEIGHT, max(1.0, names / _CACHE_NAMES))


def _fewest_steps(names: int) -> int:
    """The fewest steps `_Table.bound` can give `names` distinct names (however they are hashed or
    used: D^2/512 - D, weighted)."""
    return int(max(0, names * names // 512 - names) * _weight(names))


def _most_names(within: int | None) -> int:
    """The most distinct names a table may hold for its fewest steps to stay `within` (no limit: None)."""
    if within is None:
        return 1 << 62
    low, high = 0, 1 << 32
    while low < high:
        middle = (low + high + 1) // 2
        if _fewest_steps(middle) <= within:
            low = middle
        else:
            high = middle - 1
    return low


def estimate_name_lookups(document: str | bytes, *, within: int | None = None) -> NameLookups:
    """The steps Lexbor's lookups of the page's tag and attribute names take at most (each a visit of
    one name in a bucket's list, about 2.3 ns in the cache), and those of a selector of
    `SELECTOR_ATTRIBUTE` at each element; 0 where the page does not hold the attribute's name at all,
    so that no element can have the attribute: the caller then leaves it out of the selector. With
    `within`, a page whose distinct names alone would take more steps is answered more, at once."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    lowered = data.lower()
    del data
    if b"\0" in lowered:  # (the tokenizer reads NUL in a name as U+FFFD)
        lowered = lowered.replace(b"\0", _REPLACEMENT)
    selector = SELECTOR_ATTRIBUTE in lowered  # (else no element has the attribute)
    most = _most_names(within)
    tags = _Table(_KNOWN_TAGS, most)
    attributes = _Table(_KNOWN_ATTRIBUTES, most)
    try:
        read = _read_tags(lowered)
        if read is None:  # (past the budget for reading tags again)
            tags.add(_TAG_NAME.findall(lowered))
            for names in _names_anywhere(lowered):
                attributes.add(names)
        else:
            tags.add(read[0])
            for names in _names_of_rests(read[1]):
                attributes.add(names)
        del read
        attributes.add(_DOCTYPE_NAME.findall(lowered))
    except _TooManyNames as many:
        return NameLookups(many.steps, int(selector))
    attributes.uses.pop(b"", None)  # (no name after a value)
    tag_steps, _ = tags.bound(_spellings(tags.uses))
    extra = _spellings(attributes.uses)
    for name in _FOREIGN_ATTRIBUTES:
        if name in attributes.uses:  # (its name again, and its local name)
            for looked_up in {name, name.rpartition(b":")[2]}:
                extra[looked_up] = extra.get(looked_up, 0) + attributes.uses[name]
    if _ANNOTATION in lowered:  # (at every token while an <annotation-xml> is the current node)
        tokens = lowered.count(b"<") + lowered.count(b"&") + lowered.count(_REPLACEMENT) + 1
        extra[_ANNOTATION_ATTRIBUTE] = extra.get(_ANNOTATION_ATTRIBUTE, 0) + tokens
    del lowered
    attribute_steps, per_element = attributes.bound(extra)
    return NameLookups(tag_steps + attribute_steps, max(1, per_element) if selector else 0)


def _read_tags(lowered: bytes) -> tuple[list[bytes], list[bytes]] | None:
    """The names and rests (attributes) of every tag the tokenizer may read (the module's docstring:
    each tag read from its start with the tokenizer's grammar), or None where reading tags again
    inside tags whose quoted values hold a `>` would take past `_READ_AGAIN` bytes a byte of the page."""
    tags = _TAG.findall(lowered)
    tag_names = [name for name, _ in tags]
    rests = [rest for _, rest in tags]
    starts = [match.start() for match in _RAW_TEXT_END.finditer(lowered)]
    if sum(map(bytes.count, rests, itertools.repeat(b">"))):  # (a `>` in a rest is in a quoted value)
        for tag in _TAG.finditer(lowered):
            quoted = lowered.find(b">", tag.start(2), tag.end())
            if quoted >= 0:
                starts += [start.start() for start in _TAG_START.finditer(lowered, quoted, tag.end())]
    del tags
    budget = _READ_AGAIN * len(lowered)
    for start in starts:
        again = _TAG.match(lowered, start)
        if again is None:
            continue
        budget -= again.end() - start
        if budget < 0:
            return None
        tag_names.append(again[1])
        rests.append(again[2])
    return tag_names, rests


def _names_of_rests(rests: list[bytes]) -> Iterator[list[bytes]]:
    """The attribute names of the tags' rests, about `_BATCH` bytes of rests at a time (joined by `>`,
    which parts names and takes no value; cut only between two rests)."""
    if not rests:
        return
    lengths = np.fromiter(map(len, rests), np.int64, len(rests))
    if lengths.max() > _BATCH:  # (one tag's rest alone is more: read a match at a time)
        for rest in rests:
            names = (match[1] for match in _ATTRIBUTES.finditer(rest.rstrip(_TRAILING)))
            while batch := list(itertools.islice(names, _BATCH // 8)):
                yield batch
        return
    joined = b">".join(rests)
    ends = np.cumsum(lengths + 1) - 1  # (where each rest ends in `joined`)
    start = 0
    while start < len(joined):
        after = int(np.searchsorted(ends, start + _BATCH))
        end = int(ends[after]) if after < len(ends) else len(joined)
        yield _names_in(joined[start:end])
        start = end + 1


def _names_in(rest: bytes) -> list[bytes]:
    """The attribute names of a tag's rest (or of rests joined by `>`). Without its trailing spaces,
    slashes and `>`: `_ATTRIBUTES` would read a run of them to its end from each of its bytes (the
    rests of 270,000 tags without attributes took minutes)."""
    return _ATTRIBUTES.findall(rest.rstrip(_TRAILING))


def _names_anywhere(lowered: bytes) -> Iterator[list[bytes]]:
    """A wider superset of the attribute names, read without following tags (where `_read_tags` gives
    up), about `_BATCH` bytes at a time: after every space, `/` or quote that may close a value, but
    not in text after a `>`. (Tag names: `_TAG_NAME`.)"""
    markup = _AFTER_TAG_END.sub(b">", lowered)
    start = 0
    while start < len(markup):  # (cut after a `>`: no name starts there, none runs over it)
        end = markup.find(b">", start + _BATCH) + 1 or len(markup)
        yield _ATTRIBUTE_NAME.findall(markup, start, end)
        start = end
    for after_values in _AFTER_VALUES:
        names = (match[1] for match in after_values.finditer(markup) if match[1])
        while batch := list(itertools.islice(names, _BATCH // 8)):
            yield batch


def _spellings(uses: Counter[bytes]) -> dict[bytes, int]:
    """SVG's spellings of the names used, with their uses."""
    return {spelling: uses[name] for name, spelling in _SVG_SPELLINGS.items() if name in uses}


def _buckets(names: list[bytes]) -> np.ndarray:
    """Each name's bucket (`_hashed_buckets`), from `_BUCKET_OF` where an earlier page had the name: most
    unknown names recur from page to page (`data-*`, framework attributes, custom elements), and hashing a
    page's few new ones is numpy calls whose count, not the names, is most of the cost."""
    buckets = np.fromiter((_BUCKET_OF.get(name, -1) for name in names), np.int64, len(names))
    missing = np.flatnonzero(buckets < 0)
    if len(missing):
        new = [names[index] for index in missing]
        hashed = _hashed_buckets(new)
        buckets[missing] = hashed
        if len(new) <= _BUCKETS_KEPT:  # (a page of more distinct names: none kept)
            if len(_BUCKET_OF) + len(new) > _BUCKETS_KEPT:
                _BUCKET_OF.clear()
            _BUCKET_OF.update(zip(new, hashed.tolist(), strict=True))
    return buckets


def _hashed_buckets(names: list[bytes]) -> np.ndarray:
    """Each name's bucket: Jenkins' one-at-a-time hash (Lexbor's `lexbor_hash_make_id`) modulo 128, for
    names of at most `_HASHED_LENGTH` bytes, in C: the names of each width class laid out in the rows of
    one array, padded in front with zero bytes (which leave the hash at 0), and hashed a column at a time."""
    lengths = np.fromiter(map(len, names), np.int64, len(names))
    if len(names) and not 0 < lengths.min() <= lengths.max() <= _HASHED_LENGTH:
        raise ValueError(f"only names of 1 to {_HASHED_LENGTH} bytes are hashed here")
    buckets = np.empty(len(names), dtype=np.int64)
    narrower = 0
    for widest in _WIDTHS:  # (two classes: few numpy calls on small pages, little padding)
        rows = np.flatnonzero((lengths > narrower) & (lengths <= widest))
        narrower = widest
        if not len(rows):
            continue
        sizes = lengths[rows]
        width = int(sizes.max())  # (a column each byte of the longest name of the class)
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
