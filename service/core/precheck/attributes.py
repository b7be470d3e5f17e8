"""How many attributes a page's elements have, counted before parsing.

An element with more than `MAX_ATTRIBUTES` attributes is refused (`TooManyAttributesError`: Lexbor's
tokenizer is quadratic in them: a million would take an hour; `max_attributes`), and so are `<html>`
and `<body>` tags whose attributes the parser merges into one element past that cap
(`merged_root_attributes`); each attribute takes memory too (`count_attributes`), and so does each
attribute a re-created formatting element copies (`tags_with_attributes`, the cheap bound the
reconstruction replay refines).
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re

from service.core.precheck.elements import FORMATTING_NAMES, NOAHS_ARK
from service.core.precheck.memory import MEMORY_PER_ATTRIBUTE, MEMORY_PER_CLONE
from service.core.precheck.tags import (
    ATTRIBUTE_NAME,
    ATTRIBUTE_VALUE,
    TAG_ATTRIBUTES_REST,
    TAG_REST,
    tag_tokens,
)

MAX_ATTRIBUTES = 1024  # an element with more is refused before parsing (see max_attributes)
_LONG_TAG_CHARS = 2 * MAX_ATTRIBUTES  # a tag with that many attributes is at least this long
_FORMATTING_WITH_ATTRIBUTES = re.compile(  # (the first letters first: most "<" start none of these)
    rb"<(?=[abcefhinstu])(?:b(?:ig)?|code|em|font|i|nobr|s(?:mall|trike|trong)?|tt|u|(html|body)|(a))"
    rb"(?=[\t\n\f\r /])"
    rb"(" + TAG_ATTRIBUTES_REST + rb")"
)
# Every formatting start tag (with or without attributes): the list holds no more entries than the page
# has of those (a clone replaces the entry it copies).
_FORMATTING_START = re.compile(
    rb"<(?=[abcefinstu])(?:b(?:ig)?|code|em|font|i|nobr|s(?:mall|trike|trong)?|tt|u|a)(?=[\t\n\f\r />])"
)
# The attributes of an <html> or <body> start tag: the parser merges those of every repeated one into the
# one element, checking each against those it has (90,000 `<html aN>` took 30 s).
_ROOT_ATTRIBUTES = re.compile(rb"<(?:html|body)(?=[\t\n\f\r /])(" + TAG_ATTRIBUTES_REST + rb")")
_FEW_ROOT_TAGS = 16  # <html>/<body> tags with attributes a page may have before they are counted
# For the attribute pre-check: a whole tag (see TAG_REST), and what follows its name.
_TAG_EXTENT = re.compile(rb"<[a-zA-Z]" + TAG_REST)
_TAG_ATTRIBUTES = re.compile(rb"<[a-zA-Z][^\t\n\f\r />]*+(" + TAG_ATTRIBUTES_REST + rb")")
# For counting names: their characters to "a", the characters between them (`ATTRIBUTE_NAME`'s) to " ".
_NAME_RUNS = bytes.maketrans(bytes(range(256)), bytes(32 if c in b"\t\n\f\r />" else 97 for c in range(256)))
_COUNT_TAGS = 64
# The same, keeping the ">" between tags, to count each tag's names apart.
_NAME_RUNS_BY_TAG = bytes(62 if c == 62 else b for c, b in enumerate(_NAME_RUNS))
_COUNT_RUNS = operator.methodcaller("count", b" a")
# A quoted attribute value with a ">" in it: the only way a tag outgrows the run of text around it.
_QUOTED_GT = re.compile(rb"""=[\t\n\f\r ]*+(?:"[^">]*+>|'[^'>]*+>)""")
_TAG_START = re.compile(rb"<[a-zA-Z]")


def max_attributes(document: str | bytes) -> int:
    """The most attributes any one element of the page has, counted only for very long tags.

    Lexbor's tokenizer is quadratic in the distinct attributes of one element (4,000 per tag cost
    0.7 s per MB of such tags, 10,000 half a second for one tag, a million would take an hour). An
    element with more than `MAX_ATTRIBUTES` needs a tag of at least `_LONG_TAG_CHARS` characters. Such
    a tag either spans a run of that many characters without a `>` (any such run covers a multiple of
    half that length, so a few `find` calls per page find them), or holds a quoted attribute value with
    a `>` in it (one regex search finds those). Only the tags found that way are measured; a count over
    the cap is confirmed on the page without its raw text (`i<n` in a long inline script is no tag).
    """
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    counts = [(start, attribute_count(tag)) for start, tag in _long_tags(data)]
    most = max((count for _, count in counts), default=0)
    if most <= MAX_ATTRIBUTES:
        return most
    # Confirmed: a tag that starts where the tokenizer reads no markup (a comment, raw text) is none.
    hidden: list[tuple[int, int]] = []
    for _ in tag_tokens(data, hidden):
        pass
    starts = [low for low, _ in hidden]
    return max(
        (
            count
            for start, count in counts
            if not (index := bisect.bisect_right(starts, start)) or hidden[index - 1][1] <= start
        ),
        default=0,
    )


def count_attributes(document: str | bytes) -> int:
    """The attributes of all the page's tags (as `attribute_count` counts them; text read as a tag
    counts too, which errs on the safe side), in a few passes over the page (about 5 ms per MB).

    Each tag's attributes (what follows its name) go `_COUNT_TAGS` tags at a time, joined by ">" (no
    value runs across it), so the value substitution holds a bounded number of pieces (one call over a
    whole page of `a=""` attributes held hundreds of megabytes of them); names are counted as runs of
    name characters in a translated copy, which allocates nothing per name. A page holds no tag of
    more than `MAX_ATTRIBUTES` attributes when this runs.
    """
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    sections = _TAG_ATTRIBUTES.findall(data)
    return _names_in(sections)


def _names_in(sections: list[bytes]) -> int:
    """The attribute names in tags' attribute sections (what follows each name), `_COUNT_TAGS` at a
    time, joined by ">" (no value runs across it): the value substitution holds a bounded number of
    pieces, and names are counted as runs in a translated copy, which allocates nothing per name."""
    names = 0
    for first in range(0, len(sections), _COUNT_TAGS):
        joined = b">" + b">".join(sections[first : first + _COUNT_TAGS])
        names += ATTRIBUTE_VALUE.sub(b" ", joined).translate(_NAME_RUNS).count(b" a")
    return names


def _long_tags(data: bytes) -> list[tuple[int, bytes]]:
    """The tags of at least `_LONG_TAG_CHARS` characters that start in a long run without `>` or in the
    run before a quoted attribute value with a `>` in it (all of them, and some text read as tags)."""
    starts: list[int] = []
    step = _LONG_TAG_CHARS // 2
    size = len(data)
    point = step
    while point < size:  # a long run covers a multiple of `step`: look around those points only
        run_start = data.rfind(b">", 0, point) + 1
        run_end = data.find(b">", point)
        if run_end < 0:
            run_end = size
        if run_end - run_start >= _LONG_TAG_CHARS:
            # Every later "<" of the run is inside the tag that its first one starts.
            first = _TAG_START.search(data, run_start, run_end)
            if first is not None:
                starts.append(first.start())
        point = (run_end // step + 1) * step
    for value in _QUOTED_GT.finditer(data):
        # The tag holding the value starts in the run before it: an earlier quoted ">" of the same tag
        # was found first, and its tag reaches past this one (skipped below).
        first = _TAG_START.search(data, data.rfind(b">", 0, value.start()) + 1, value.start())
        if first is not None:
            starts.append(first.start())
    tags = []
    covered = 0  # the end of the last tag measured: starts before it are inside it
    for start in sorted(starts):
        if start < covered:
            continue
        tag = _TAG_EXTENT.match(data, start)
        if tag is None:  # never: a start comes from "<" and a letter
            continue
        covered = tag.end()
        if covered - start >= _LONG_TAG_CHARS:
            tags.append((start, tag.group()))
    return tags


def attribute_count(tag: bytes) -> int:
    """The attributes of one tag: its names once the values are blanked (`a="x"b` holds two).

    Counted between one value and the next, as runs of name characters in a translated copy of each
    stretch: nothing is held per attribute. (A list of the names, or `sub` blanking the values, held
    about 240 bytes per attribute at once: a tag of a million attributes, the 10 MB page that
    `max_attributes` exists to refuse, peaked 240 MB while being counted, over the page's memory bound.)
    """
    name = ATTRIBUTE_NAME.match(tag)
    position = name.end() if name is not None else 0
    names = 0
    for value in ATTRIBUTE_VALUE.finditer(tag, position):
        # (A blanked value separates the names around it: each stretch's runs are counted apart.)
        names += (b" " + tag[position : value.start()]).translate(_NAME_RUNS).count(b" a")
        position = value.end()
    return names + (b" " + tag[position:]).translate(_NAME_RUNS).count(b" a")


def tags_with_attributes(
    document: str | bytes, *, within: int | None = None, cap: bool = False
) -> tuple[int, bytes | None]:
    """(An upper bound of the bytes a reconstruction of the parser's list of active formatting elements
    takes: three of each element without attributes, every start tag of one with attributes with what
    its attributes take, and the one `<a>` the list can hold after its last marker, with the most
    attributes an `<a>` has; the lowercased page where it has more than a few `<html>`/`<body>` tags
    with attributes, else None), from one cheap scan. Where a bound from the attributes' lengths (each
    takes two bytes at least) is `within` bytes, that one, without counting them (most pages). With `cap`,
    no more entries than the page has formatting start tags (a clone replaces the entry it copies)."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    lowered = data.lower()
    found = _FORMATTING_WITH_ATTRIBUTES.findall(lowered)  # (root name or b"", b"a" or b"", attributes)
    sections = [attributes for root, link, attributes in found if not root and not link]
    links = [attributes for _, link, attributes in found if link]
    entries = NOAHS_ARK * len(FORMATTING_NAMES) + len(sections) + 1
    if cap:
        # None: nothing to re-create, and no replay (2 MB of table markup without one paid 0.9 s for it).
        entries = min(entries, sum(1 for _ in itertools.islice(_FORMATTING_START.finditer(lowered), entries)))
    roots = len(found) - len(sections) - len(links)
    if within is not None:
        # Each name counted (a run of name characters after a separator) takes two bytes at least.
        most = (sum(map(len, sections)) + len(sections) + max(map(len, links), default=0) + 1) // 2
        loose = entries * MEMORY_PER_CLONE + most * MEMORY_PER_ATTRIBUTE
        if loose <= within:
            return loose, lowered if roots > _FEW_ROOT_TAGS else None
    attributes = _names_in(sections)
    # The most attributes one <a> has (each counted as `_names_in` counts, the ">" between them kept).
    widest = 0
    for first in range(0, len(links), _COUNT_TAGS):
        joined = ATTRIBUTE_VALUE.sub(b" ", b">".join(links[first : first + _COUNT_TAGS]))
        runs = (b" " + joined).translate(_NAME_RUNS_BY_TAG).split(b">")
        widest = max(widest, *map(_COUNT_RUNS, runs))
    list_bytes = entries * MEMORY_PER_CLONE + (attributes + widest) * MEMORY_PER_ATTRIBUTE
    return list_bytes, lowered if roots > _FEW_ROOT_TAGS else None


def merged_root_attributes(lowered: bytes) -> int:
    """The attributes of all the `<html>` and `<body>` start tags of a lowercased page (those in text
    read as tags count too: the safe side), which the parser merges into one element each."""
    sections = _ROOT_ATTRIBUTES.findall(lowered)
    return _names_in(sections)
