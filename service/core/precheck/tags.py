"""Reading a page's tags as the HTML tokenizer does, for the pre-parse checks (`tag_tokens`).

The depth, attribute and formatting-element checks read the page's tags as the HTML tokenizer does
(`tag_tokens`: a `</b>` or `<!--` in an attribute value, a bogus comment or raw text is no tag,
comments end where the tokenizer ends them, raw text inside `<svg>` is markup), each in linear time;
where the parser's reading depends on the tree (an `<svg>` integration point holding HTML, a
`<frameset>`), they read every `<` and a letter as a tag and trust no end tag, erring long.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from service.core.precheck.elements import HEADINGS_B, SCOPE_BOUNDARIES, VOID_B

# Raw-text and RCDATA elements: the tokenizer reads no tags in them up to their end tag.
RAW_TEXT_NAMES = rb"script|style|textarea|title|xmp|iframe|noembed|noframes|noscript|plaintext"
_COMMENT_CLOSE = re.compile(rb"--!?>")
_RAW_TEXT_CLOSE = {name: re.compile(b"</" + name + rb"[\t\n\f\r />]") for name in RAW_TEXT_NAMES.split(b"|")}
# The rest of a tag as the HTML tokenizer reads it: attribute names, each maybe with "=" and a value; a
# ">" inside a quoted value does not end the tag (an unterminated one runs to the end). A value follows
# only a name: where a name may start (after the tag's name, a space, a "/" or a quoted value) "=" and
# quotes are the name's first character (`<br ="><div>">` is one tag `<br =">`: read as a value, it
# hid the `<div>`s of a page that took 16 s a megabyte to parse).
TAG_ATTRIBUTES_REST = (
    rb"""(?:[\t\n\f\r /]++|[^\t\n\f\r />][^\t\n\f\r />=]*+"""
    rb"""(?:[\t\n\f\r ]*+=[\t\n\f\r ]*+(?:"[^"]*+"?|'[^']*+'?|[^\t\n\f\r >]*+))?)*+"""
)
TAG_REST = rb"[^\t\n\f\r />]*+" + TAG_ATTRIBUTES_REST
# The unquoted attribute value a final "/" may belong to (`<g a=x/>` is no self-closing tag).
_UNQUOTED_TAIL = re.compile(rb"""=[\t\n\f\r ]*+[^\t\n\f\r >"'][^\t\n\f\r >]*+\Z""")
ATTRIBUTE_VALUE = re.compile(rb"""=[\t\n\f\r ]*+(?:"[^"]*+"?|'[^']*+'?|[^\t\n\f\r >]*+)""")
ATTRIBUTE_NAME = re.compile(rb"[^\t\n\f\r />]+")


# The tag scan (`tag_tokens`): what the HTML tokenizer reads as tags, for the pre-parse checks.
# The next markup: a tag (an end tag's "/", its name, its attributes, its ">": none where the page's end
# cuts it off), or (no name) "<!", "<?" or "</" and no letter: a comment or a bogus comment.
_NEXT_MARKUP = re.compile(rb"<(?:(/?)([a-z][^\t\n\f\r />]*+)(" + TAG_ATTRIBUTES_REST + rb")(>?)|[!?/])")
# A run of a table's structure as plain markup (`tag_tokens`' `skips`): text, and start and end tags of
# rows, cells, sections and column groups (no caption, no table), read as `_NEXT_MARKUP` reads them;
# `TABLE_RUN_TAG` gives each tag's name, "/" first for an end tag. (Match on the page as it is: re.I.)
_TABLE_RUN_NAME = rb"/?(?:tbody|thead|tfoot|colgroup|col|tr|td|th)(?=[\t\n\f\r />])"
_TABLE_RUN_REST = rb"(?:>|" + TAG_ATTRIBUTES_REST + rb">)"  # (no attributes first: a third faster)
TABLE_RUN = re.compile(rb"(?:[^<]++|<" + _TABLE_RUN_NAME + _TABLE_RUN_REST + rb")*+", re.I)
TABLE_RUN_TAG = re.compile(rb"[^<]*+<(" + _TABLE_RUN_NAME + rb")" + _TABLE_RUN_REST)
_ANY_TAG = re.compile(rb"<(/?)([a-z][^\t\n\f\r />]*+)([^<>]*+)")  # after a taint: no quote hides anything
_RAW_TEXT = frozenset(RAW_TEXT_NAMES.split(b"|")) - {b"plaintext"}
ZONES = {b"svg": b"foreignobject desc title".split(), b"math": b"mi mo mn ms mtext annotation-xml".split()}
# Start tags that end foreign content (the HTML Standard's list; `<font>` only with a color, face or size:
# `_breaks_out`).
BREAKOUT = frozenset(
    b"""b big blockquote body br center code dd div dl dt em embed font h1 h2 h3 h4 h5 h6 head hr i img li
    listing menu meta nobr ol p pre ruby s small span strong strike sub sup table tt u ul var""".split()
) - {b"font"}
HTML, FOREIGN, SELECT, TAINTED = 0, 1, 2, 3  # where a tag was read (`tag_tokens`)
# Integration points whose content the parser reads as HTML, start tags and text (`<annotation-xml>`
# only with an HTML encoding: not one), and the start tags an island of HTML there may not hold: raw
# text and what hides tags, what leaves an element open or opens one without a start tag (a table's
# parts), inserts a marker or a scope limit, changes the insertion mode or the form pointer, and
# foreign content (`<mglyph>` in `<mi>` is MathML).
ISLAND_POINTS = frozenset(b"foreignobject desc title mi mo mn ms mtext".split())
_NOT_IN_ISLANDS = _RAW_TEXT | frozenset(
    b"""plaintext svg math mglyph malignmark select template frameset frame html head body form isindex
    table caption colgroup col tbody thead tfoot tr td th applet marquee object""".split()
)

# Elements the parser makes without a start tag in a table: their end tags may close them.
_IMPLIED_BY_TABLES = frozenset((b"tbody", b"tr", b"colgroup"))
# Start tags that take this Lexbor out of a <select> (it closes it first; a <keygen> or <textarea> it
# builds inside), and the raw-text elements it builds in one (as in the document's head).
LEAVES_SELECT = frozenset((b"select", b"input"))
_SCRIPTING = frozenset((b"script", b"style"))
# Start tags whose end tag does not take the parser out of an <svg> right inside them: void elements
# (never open; `<image>` is an `<img>`), <html>, <head>, <body> and <form>, whose end tags pop nothing,
# and a table's parts, which the parser ignores outside a table (`<tr/><svg></tr>` x N: 20 s a
# megabyte). Nor is a self-closing `<svg/>` one (`<math/><svg></math>`: 34 s for 540 KB).
_NO_PARENTS = frozenset(
    b"""area base basefont bgsound br col embed frame hr img input keygen link meta param source track wbr
    html head body form caption colgroup tbody thead tfoot tr td th image""".split()
)


def tag_tokens(
    data: bytes,
    hidden: list[tuple[int, int]] | None = None,
    skips: list[tuple[int, frozenset[bytes]]] | None = None,
) -> Iterator[tuple[bool, bytes, int, int, int]]:
    """(end tag, lowercase name, start and end of the tag in `data`, where) for every tag the HTML
    tokenizer reads on the page, in order, in linear time; `hidden` collects the spans it reads as no
    markup (comments, bogus comments, raw text).

    Read as the tokenizer reads: a tag's quoted attribute values are part of it (`<br title="</b>">`
    closes nothing, `<br a="<!--">` opens no comment), comments end where it ends them, `<!x>`, `<?x>`
    and `</ x>` are bogus comments, and raw-text elements (`<script>`, `<style>`, `<title>`, ...) hold
    no tags up to their end tag. Inside `<svg>` and `<math>` (FOREIGN) raw-text names are ordinary
    elements and `<![CDATA[...]]>` is text; inside `<select>` (SELECT) nothing is read as raw text
    (counting more is the safe side). Either ends with its own end tag, read the same way; but an
    integration point (`<foreignObject>`, `<desc>`, `<title>`, `<mi>`, ...) that holds tags makes the
    parser's content model there HTML again, where a `</svg>` may close nothing: from there on
    (TAINTED) every `<` and a letter is a tag and nothing is hidden; so too after a `<frameset>`. But
    an island of plain HTML in one (a diagram's label: `<foreignObject><div><span>x</span></div>
    </foreignObject>`) whose every end tag closes the element on top of it, and whose integration
    point's own end tag comes when all is closed, leaves the parser in the zone again (those of its
    tags that may leave an element open, or hide tags, taint: raw text, tables, a <select>, ...): its
    tags are yielded as TAINTED (nothing there closes surely for the estimates), what follows as in the
    zone. In a `<template>` whose content starts with a `<col>` (a column group, where the
    parser ignores every other start tag) raw-text names hold no raw text, up to the `</template>`.

    `skips`: a caller that read a run of tags itself (`TABLE_RUN`, right after an HTML start tag of
    the run's kind) puts (where the run ends, the names of its start tags) there before asking for the
    next tag: the scan goes on from there as if it had read them (none hides markup, opens a zone or
    is a parent of one; `hidden` gets nothing from them).
    """
    lowered = data.lower()
    size = len(lowered)
    position = 0
    zone = HTML
    zone_name = b""
    opened: dict[bytes, int] = {}  # the foreign elements open in the zone, by name
    zone_open: list[bytes] = []  # the same, in the order they opened
    html_names: set[bytes] = set()  # the names of the HTML start tags read so far
    parent: bytes | None = None  # the HTML start tag just read; in a zone, the one just before it
    previous: bytes | None = None
    point: bytes | None = None  # an integration point of the zone, open, holding no tag or an island
    island: list[bytes] = []  # the island's HTML elements open in it (see above), in order
    template_first = False  # the last HTML start tag was a <template>
    # The <template>s open (read as HTML), innermost last: whether each one's content began with a <col>
    # (a column group, where the parser ignores every other start tag).
    column_groups: list[bool] = []
    # <template>s open (in a <select> too), and whether a <col> came in one: a template's content then
    # may be a column group the reader cannot follow (after an inner template, or in a select), where the
    # parser ignores a raw-text or zone start tag.
    templates = 0
    template_col = False
    select_limit = False  # the <select> being read holds a scope limit (an <object>, a <td>, ...)
    while position < size:
        if skips:
            position, names = skips.pop()
            html_names |= names
            previous = parent = None  # (each of the run's tags leaves no parent)
            if position >= size:
                return
        if zone == TAINTED:
            for any_tag in _ANY_TAG.finditer(lowered, position):
                yield bool(any_tag.group(1)), any_tag.group(2), any_tag.start(), any_tag.end(), TAINTED
            return
        found = _NEXT_MARKUP.search(lowered, position)
        if found is None:
            return
        start = found.start()
        slash, name, attributes, closed = found.groups()
        if name is None:
            if lowered.startswith(b"<!--", start):
                end = _comment_end(lowered, start + 4)
            elif zone == FOREIGN and lowered.startswith(b"<![cdata[", start):
                if island:  # in an HTML element a bogus comment, in the point text: either
                    zone = TAINTED
                    position = start
                    continue
                end = lowered.find(b"]]>", start + 9)
                end = -1 if end < 0 else end + 3
            elif lowered.startswith(b"</>", start):
                end = start + 3
            else:
                end = lowered.find(b">", start + 2)
                end = -1 if end < 0 else end + 1
            if hidden is not None:
                hidden.append((start, size if end < 0 else end))
            if end < 0:
                return
            position = end
            continue
        if not closed:
            return  # a tag the page's end cuts off is no tag
        end_tag = bool(slash)
        position = found.end()
        if point is not None:
            if end_tag and name == point and not island:
                point = None
            elif point in ISLAND_POINTS and (
                (end_tag and island and island[-1] == name) or (not end_tag and name not in _NOT_IN_ISLANDS)
            ):
                if end_tag:
                    island.pop()
                elif name not in VOID_B:  # (`<div/>` opens a <div> in HTML content)
                    island.append(name)
                yield end_tag, name, start, position, TAINTED
                continue
            else:
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
        if zone == FOREIGN:
            self_closing = not end_tag and is_self_closing(attributes)  # an end tag's "/" is nothing
            if (end_tag and name in (b"br", b"p")) or (not end_tag and _breaks_out(name, attributes)):
                zone = HTML  # the parser leaves foreign content for this tag and what follows
            elif end_tag and not opened.get(name):
                # Not a foreign element open here: the parser looks for it among the HTML elements
                # around the <svg>. The one just before the <svg> is surely open, and its end tag
                # takes the parser out (`<div><svg><use/></div>`); a name no HTML start tag had cannot
                # be open (`</path></path>`), and is ignored; any other may be either.
                if name == parent:
                    zone = HTML
                    yield end_tag, name, start, position, HTML
                    continue
                if name not in html_names and not (
                    (name in HEADINGS_B and html_names & HEADINGS_B)  # `</h1>` closes any heading
                    or (name in _IMPLIED_BY_TABLES and b"table" in html_names)  # or one the parser made
                ):
                    yield end_tag, name, start, position, FOREIGN
                    continue
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
            else:
                if end_tag:  # the parser pops its last element of the name and what is above it
                    while zone_open:
                        popped = zone_open.pop()
                        opened[popped] -= 1
                        if popped == name:
                            break
                elif not self_closing:
                    zone_open.append(name)
                    opened[name] = opened.get(name, 0) + 1
                if name == zone_name and not self_closing and not opened[name]:
                    zone = HTML  # the zone's own end tag: yielded as HTML, and read so after
                elif not end_tag and not self_closing and name in ZONES[zone_name]:
                    point = name
                if zone == FOREIGN:
                    yield end_tag, name, start, position, FOREIGN
                    continue
                yield end_tag, name, start, position, HTML
                continue
        elif zone == SELECT:
            if not end_tag and (name in ZONES or (name in _RAW_TEXT and name not in _SCRIPTING)):
                # The parser builds <svg> and <math> inside a <select>; an <xmp>, <title>, ... there
                # it may ignore (then what follows is markup) or not (raw text).
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
            if not end_tag and name in LEAVES_SELECT and select_limit:
                # Past a scope limit (an <object>, a <td>, ...) it may close nothing (Lexbor builds
                # what a <select> holds): where the parser is, the scan cannot tell.
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
            if not end_tag and name in LEAVES_SELECT:
                # It closes the <select> (yielded as in it: the estimate closes it); an <input> then
                # opens in the body.
                zone = HTML
                yield end_tag, name, start, position, SELECT
                previous, parent = parent, None
                html_names.add(name)
                continue
            if not (end_tag and name == b"select"):
                select_limit = select_limit or (not end_tag and name in SCOPE_BOUNDARIES)
                if name == b"template":
                    templates = max(0, templates - 1) if end_tag else templates + 1
                template_col = template_col or (templates > 0 and name == b"col")
                yield end_tag, name, start, position, SELECT
                if not end_tag and name in _SCRIPTING and template_col and templates:
                    zone = TAINTED  # (a template's column group may ignore it: see below)
                    continue
                if not end_tag and name in _SCRIPTING:  # in the <select> too, raw text
                    closer = _skip_raw_text(lowered, name, position, hidden)
                    if closer is None:
                        return
                    position = closer
                continue
            zone = HTML  # its own end tag, read as HTML (it closes the <select>)
        yield end_tag, name, start, position, zone
        previous, parent = parent, None
        if end_tag:
            if name == b"template":
                template_first = False  # (`<template></template><col>`: the <col> is in the body)
                if column_groups:
                    column_groups.pop()
                templates = max(0, templates - 1)
            continue
        html_names.add(name)
        parent = None if name in _NO_PARENTS or (name in ZONES and is_self_closing(attributes)) else name
        if template_first:  # a <template> whose content starts with a <col> holds a column group
            template_first = False
            if name == b"col" and column_groups:
                column_groups[-1] = True
        template_first = name == b"template"
        if template_first:
            column_groups.append(False)
        templates += name == b"template"
        template_col = template_col or (templates > 0 and name == b"col")
        ignorable = name in _RAW_TEXT or name in (b"plaintext", b"select") or name in ZONES
        if column_groups and column_groups[-1] and ignorable:
            continue  # there the parser ignores every other start tag: no raw text or zone follows
        if template_col and templates and ignorable:
            zone = TAINTED  # (ignored, or not: what follows may be markup or raw text)
            continue
        if name in _RAW_TEXT:
            closer = _skip_raw_text(lowered, name, position, hidden)
            if closer is None:
                return
            position = closer
        elif name == b"plaintext":
            if hidden is not None:
                hidden.append((position, size))
            return
        elif name in ZONES and not is_self_closing(attributes):  # `<svg/>` opens nothing
            zone, zone_name, opened, parent = FOREIGN, name, {name: 1}, previous
            zone_open = [name]
        elif name == b"select":
            zone, select_limit = SELECT, False
        elif name == b"frameset":
            # The parser then ignores tags but <frameset>, <frame> and <noframes> (a <title> holds
            # markup), unless text came first and it ignores the <frameset> instead: either way.
            zone = TAINTED


# Script data (HTML Standard 13.2.5.4 and on): "<!--" escapes it, a "<script" in the escaped text
# double-escapes it (there "</script>" does not end the script), "-->" ends either escape.
_SCRIPT_MARKS = re.compile(rb"<!--|-->|<(/?)script[\t\n\f\r />]")


def _skip_raw_text(
    lowered: bytes, name: bytes, position: int, hidden: list[tuple[int, int]] | None
) -> int | None:
    """`_raw_text_end`, noting the raw text in `hidden` (to the page's end when it has no end)."""
    closer = _raw_text_end(lowered, name, position)
    if hidden is not None:
        hidden.append((position, len(lowered) if closer is None else closer))
    return closer


def _raw_text_end(lowered: bytes, name: bytes, position: int) -> int | None:
    """Where the raw text of a `name` element opened before `position` ends (the start of its end tag;
    None: the page's end). A `<script>`'s follows the tokenizer's escapes: `<script><!--<script>
    </script></div>--></script>` is one script (read to the first `</script>`, its `</div>`s hid 4,000
    levels of nesting; 82 s for 2 MB)."""
    if name != b"script":
        closer = _RAW_TEXT_CLOSE[name].search(lowered, position)
        return None if closer is None else closer.start()
    escaped = double = False
    while (mark := _SCRIPT_MARKS.search(lowered, position)) is not None:
        token = mark.group()
        if token == b"<!--":
            escaped = escaped or not double  # in script data it escapes; escaped it changes nothing
            position = mark.start() + 2  # "<!-->" escapes and ends the escape at once
        elif token == b"-->":
            escaped = double = False
            position = mark.end()
        elif mark.group(1):  # "</script"
            if not double:
                return mark.start()
            double = False  # back to escaped
            position = mark.end() - 1
        else:  # "<script"
            double = double or escaped
            position = mark.end() - 1
    return None


def is_self_closing(attributes: bytes) -> bool:
    """Whether a start tag with these attributes (what follows its name) ends in "/>" (`<g a=x/>` does
    not: the "/" is its value's)."""
    return attributes.endswith(b"/") and _UNQUOTED_TAIL.search(attributes) is None


def _breaks_out(name: bytes, attributes: bytes) -> bool:
    """Whether this start tag takes the parser out of foreign content (`<font>` only with a color, face
    or size)."""
    if name != b"font":
        return name in BREAKOUT
    names = ATTRIBUTE_NAME.findall(ATTRIBUTE_VALUE.sub(b" ", attributes))
    return any(attribute in (b"color", b"face", b"size") for attribute in names)


def _comment_end(lowered: bytes, start: int) -> int:
    """Where the comment whose `<!--` ends at `start` ends (-1: at the end of the page)."""
    if lowered.startswith(b">", start):
        return start + 1
    if lowered.startswith(b"->", start):
        return start + 2
    # One search for the first of the two: looking for either one on its own up to the page's end at
    # every comment was quadratic (a megabyte of <!--x--> without "--!>", or of <!--x--!> without
    # "-->", took about a minute). The two cannot overlap, so the first to start is the first to end.
    end = _COMMENT_CLOSE.search(lowered, start)
    return -1 if end is None else end.end()
