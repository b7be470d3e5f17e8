"""Text nodes the parser grows in many pieces: the bytes Lexbor copies to grow them (`text_copies`), and
what it keeps of them (`text_growth_kept`; `text_growth_memory` tries cheap bounds first).

The tree builder appends text to the text node just before where it inserts (the HTML Standard:
"if there is a Text node immediately before the adjusted insertion location"). Lexbor grows that node
by copying it whenever anything was allocated in its text arena since the node's last piece (a
comment's data, attribute values, another node's text; an element without attributes allocates
nothing there), and the arena keeps the old copies: a node grown in N pieces costs the sum of its N
lengths, quadratic in the page. Ways a page keeps one node growing while allocating between its
pieces (docs/preprocessing.md, "Text grown in pieces", has the measurements):

- Foster parenting. Text in a table's rows (not in a cell or caption) goes before the table, onto
  the node there, while the comments and cells between the pieces stay in the table (880 KB of
  `<table><tr>` + `<td>1</td>y`: 509 MiB); whitespace there grows the table's own node; rows in a
  template's content send their text to the end of the content. An element foster-parented between
  pieces (`y<b></b>y`) ends the node before the table.
- Tags that make no node but carry attributes: an end tag (`y</x a=b>`, 720 KB: 437 MiB), a table's
  part outside a table, `<html a=b>`, `<body a=b>`, a foster-parented `<image a=b>`.
- Comments or the head's elements put elsewhere than the text: after `</body>` or `</html>`, after
  `</head>`, after a `<frameset>`.
- A doctype in the page (its ids), the adoption agency's clones of a formatting element past eight
  special elements (the text stays where it was).

What Lexbor keeps of a copy grows with the allocations before it: each counts
`TEXT_COPY_KEPT_PER_ALLOCATION` of the copy, `TEXT_COPY_KEPT` at most. A node foster-parented text grows
sees every allocation in the page since its last piece (`_Scan.allocations`: each piece of text, comment,
tag with attributes, ...). A piece in a table is as long as its decoded text (`&nbsp;`: 2 bytes);
elsewhere its bytes, longer but where a page has an `&nGt;` or `&nLt;` (6 bytes decoded, 5 written).

The estimate reads the page's tags as the tokenizer does (`tag_tokens`: its spans of comments, raw text
and CDATA split the text), follows where the text goes (`_Scan.mode`) and each table and template
(`_Table`), and sums a node's length at every piece that may copy it. It errs long where it cannot
follow the parser: every foster-parented piece after a node's first copies it; in doubt a piece grows
both nodes it may go to (and copies the longer); a start tag or comment ends the text's node only
where the parser surely puts it where the text goes, an end tag only where it closes the element the
last start tag opened (`x</b>y` may be one node); after a taint every `<` in text may be a comment.
"""

from __future__ import annotations

import re
from html.entities import html5

from service.core.precheck.elements import FORMATTING, TABLE_STARTS, VOID_B
from service.core.precheck.memory import TEXT_COPY_KEPT, TEXT_COPY_KEPT_PER_ALLOCATION
from service.core.precheck.tags import (
    FOREIGN,
    HTML,
    RAW_TEXT_NAMES,
    SELECT,
    TAG_ATTRIBUTES_REST,
    TAINTED,
    is_self_closing,
    tag_tokens,
)

# Start tags the parser does not foster-parent out of a table's rows: its structure (and a new table,
# which closes the one open), what the rules "in table" insert into it (hidden inputs, forms, scripts,
# styles, templates: any <input> counts, the safe side), and what merges into an element or is ignored
# (Lexbor drops a foster-parented <image>, attributes allocated).
_STAY_IN_TABLE = TABLE_STARTS | frozenset(
    b"table input form script style template html head body frameset frame image".split()
)
# Start tags the parser surely inserts into a table's rows (where its whitespace goes).
_INSERTED_IN_ROWS = TABLE_STARTS | frozenset(b"table script style template".split())
# Start tags the parser may ignore in the body (a table's parts outside a table, a second <form>) or
# merge into an element it has (<html>, <body>): they make no node, and the text on both sides may be
# one node.
_MAY_MAKE_NO_NODE = TABLE_STARTS | frozenset(b"html head body frameset frame form".split())
# Where the text goes that is not foster-parented (`_Scan.mode`): where the start tags and comments go too
# (the body, the head before its end tag), to <html> while the head's elements and raw text go into the
# head (after `</head>`), to the body while comments go to <html> or the document (after `</body>` or
# `</html>`), or after a <frameset> (nothing is sure: the parser may have ignored it).
_BODY, _AFTER_HEAD, _AFTER_BODY, _FRAMESET = 0, 1, 2, 3
# Start tags that go into the head while the text between them goes to <html> (after </head>).
_HEAD = frozenset(b"base basefont bgsound link meta noframes script style template title noscript".split())
_ROW_GROUPS = frozenset((b"tbody", b"thead", b"tfoot"))
# A table's parts the parser ignores after a row or cell in a template's content (no row group in scope).
_NOT_AFTER_TEMPLATE_ROWS = _ROW_GROUPS | frozenset((b"caption", b"colgroup", b"col"))
_TABLE_ENDS = frozenset(b"table caption td th tr tbody thead tfoot".split())
# Tags after which a run of plain rows may follow (`_PLAIN_ROWS`), read as the tokenizer reads them: a
# row's tags, cells of text only (their end tags without attributes), whitespace between.
_ROW_TAGS = frozenset((b"tr", b"td", b"th", b"tbody", b"thead", b"tfoot", b"table"))
_OPEN = rb"(?=[\t\n\f\r />])(?:>|" + TAG_ATTRIBUTES_REST + rb">)"
_PLAIN_ROWS = re.compile(
    rb"(?:[\t\n\f\r ]*+(?:<tr" + _OPEN + rb"|</tr>|<t([dh])" + _OPEN + rb"[^<]*+</t\1>))*+", re.I
)
_PLAIN_ROW_NAMES = frozenset((b"tr", b"td", b"th"))
# Start tags that make the text after them a cell's or a caption's.
_INTO_CELL = frozenset((b"td", b"th", b"caption"))
_NOT_SPACE = re.compile(rb"[^\t\n\f\r ]")
_SPACE_BYTES = frozenset((b" ", b"\t", b"\n", b"\f", b"\r"))
_RAW_TEXT = frozenset(RAW_TEXT_NAMES.split(b"|"))
# For the cheap bound (`text_growth_memory`), in one pass: what may take the text out of the body's rules (a
# table, a template's rows, a frameset, the end of the head, of the body, of <html>), CDATA, and what may
# allocate and make no node where the text goes: a tag of `_MAY_MAKE_NO_NODE` or an end tag with more
# than its name, a formatting element's end tag (the adoption agency's clones), a doctype (its ids).
_STRUCTURE = re.compile(
    rb"<(?=[/!bcfhtBCFHT])(?:(?P<tables>(?i:table|frameset|template)(?=[\t\n\f\r />]))"
    rb"|(?P<cdata>!\[)"
    rb"|(?P<formatting>/(?i:" + b"|".join(sorted(FORMATTING)) + rb")(?=[\t\n\f\r />]))"
    rb"|(?P<doctype>!(?i:doctype))"
    rb"|(?P<head>/(?i:head)(?=[\t\n\f\r />]))"
    rb"|(?P<after>/(?i:body|html)(?=[\t\n\f\r />]))"
    rb"|(?P<nodeless>(?:/[a-zA-Z][^\t\n\f\r />]*+[\t\n\f\r /]|(?i:"
    + b"|".join(sorted(_MAY_MAKE_NO_NODE))
    + rb")[\t\n\f\r /])"
    + TAG_ATTRIBUTES_REST
    + rb"))"
)
# A `</head>` with only whitespace before a `<body>` (nothing between them goes into the head while the
# text goes to <html>).
_HEAD_THEN_BODY = re.compile(
    rb"</(?i:head)(" + TAG_ATTRIBUTES_REST + rb")>[\t\n\f\r ]*+<(?i:body)[\t\n\f\r />]"
)
# Where a run of text that is not only whitespace may start: after a ">" (a tag's, a comment's) and any
# whitespace, a character that starts no tag, comment or bogus comment ("</>" starts nothing).
_RUNS = re.compile(rb">[\t\n\f\r ]*+(?:[^<\t\n\f\r ]|<(?![a-zA-Z!?/])|</>)")
# What may allocate between two pieces of a node: a tag with more than its name, a comment, a bogus
# comment (a doctype's ids), a raw-text element's text, a template's content (its end tag after the head),
# a formatting element's end tag (the adoption agency's clones); and a "<" that
# starts no tag, comment or bogus comment (after a taint the scan takes one for a possible comment).
_ALLOCATING = re.compile(
    rb"<(?:[!?]|/(?![a-zA-Z])|/?[a-zA-Z][^\t\n\f\r />]*+[\t\n\f\r /]"
    rb"|/(?i:" + b"|".join(sorted(FORMATTING)) + rb")>"
    rb"|(?i:script|style|title|textarea|xmp|iframe|noembed|noframes|noscript|plaintext|template)>"
    rb"|(?![a-zA-Z!?/]))"
)
# Character references in text (the parser decodes them before it appends the text): a named one with its
# ";" is in the table and decodes to exactly its value, so a piece of `&nbsp;` grows its node by 2 bytes,
# not 6; a numeric one to 4 bytes at most (3 for U+FFFD and the windows-1252 remaps). Only two grow: `&nGt;`
# and `&nLt;` (5 bytes, 6 decoded), each counted one byte longer wherever raw sizes are the bound.
_REFERENCE = re.compile(rb"&(?:([A-Za-z][A-Za-z0-9]{1,31};)|#[0-9]{1,8};|#[xX][0-9a-fA-F]{1,6};)")
_REFERENCE_SAVES = {
    name.encode(): len(name) + 1 - len(value.encode("utf-8"))
    for name, value in html5.items()
    if name.endswith(";")
}
_GROWING_REFERENCES = (b"&nGt;", b"&nLt;")
# A start or end tag as far as its first ">": what is left holds all the text the scan may read, comments
# and bogus comments included (after a taint it reads them as text, and each tag's ">").
_TAG = re.compile(rb"</?[a-zA-Z][^>]*+>?")


def text_growth_memory(document: str | bytes, *, tags: int, within: int, respelled: bool = False) -> int:
    """What Lexbor keeps of the copies of text nodes grown in pieces (`text_growth_kept`), or, where cheap
    bounds show it stays `within`, the least of them. `respelled`: the page has no `&nGt;` or `&nLt;`
    (`service.core.prune.respell_longer_references`), which it then need not count.

    A piece copies at most the page's text (a NUL may become 3 bytes, a `&nGt;` 6), and only a foster-parented
    one or one after something allocated that did not end its node; in doubt a piece grows two nodes, but the
    parser copies only one. The bounds, cheapest first: at most one piece a `<` and one more (and one a CDATA
    section, counted in the pass that follows), each kept whole; without a table, a template or a frameset,
    where every `</head>` is followed by `<body>`, only the allocations of a tag that may make no node and has
    attributes (a value each, three at most), of a formatting element's end tag (three), a doctype (two),
    CDATA, or anything after the first `</body` or `</html` (three) come before a copying piece, each kept
    `TEXT_COPY_KEPT_PER_ALLOCATION` of it (`_STRUCTURE`, one pass); else the allocations and runs of text,
    counted by regex, times the page's text, kept whole. The tag scan reads 136 of the 1,033 corpus pages
    (docs/benchmarks.md)."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    # What the decoded text may add: each NUL may be U+FFFD (3 bytes), each `&nGt;` or `&nLt;` one byte.
    longer = 2 * data.count(b"\0") if b"\0" in data else 0
    if not respelled and b"&n" in data:  # (`respelled`: none, `prune.respell_longer_references`)
        longer += sum(data.count(reference) for reference in _GROWING_REFERENCES)
    size = len(data) + longer
    # (A CDATA section is one more piece, at most one a "<": counted below where it may matter.)
    bound = int(((2 * tags if b"<![" in data else tags) + 1) * size * TEXT_COPY_KEPT)
    if bound <= within:
        return bound
    copying = cdata = head_end = 0
    after_body = -1
    plain = True  # no table, template or frameset, every </head> followed by <body>
    for found in _STRUCTURE.finditer(data):
        kind = found.lastgroup
        if kind == "nodeless":
            copying += _tag_allocations(found.group().count(b"="))
        elif kind in ("formatting", "doctype"):
            copying += 3 if kind == "formatting" else 2  # (the clones' attributes; the two ids)
        elif kind == "cdata":
            cdata += 1
        elif kind == "after":
            if after_body < 0:
                after_body = found.start()
        elif kind == "head":
            if found.start() < head_end:
                continue  # (in the attributes of the `</head>` read before: no tag)
            head = _HEAD_THEN_BODY.match(data, found.start())
            if head is None:
                plain = False
                break
            head_end = head.end()
            if head.group(1).strip():  # (its attributes: allocated, no node)
                copying += _tag_allocations(head.group(1).count(b"="))
        else:
            plain = False  # a table, a frameset, a template (CDATA uncounted: as many as the "<"s)
            cdata = tags
            break
    bound = int((tags + 1 + cdata) * size * TEXT_COPY_KEPT)
    if bound <= within:
        return bound
    if plain:
        if after_body >= 0:
            copying += 3 * _ALLOCATING.subn(b"", data[after_body:])[1]  # (each: three allocations at most)
        # (No foster parenting: each allocation counted is ahead of one piece's copy at most.)
        bound = int((copying + cdata) * size * TEXT_COPY_KEPT_PER_ALLOCATION)
        if bound <= within:
            return bound
    # A run of text that is not only whitespace may be foster-parented: a copy, and an allocation before
    # the next piece. After a taint the scan reads a comment as text (and a bare `<` as a possible
    # comment: `_ALLOCATING` counts it); `_TAG` leaves comments in the text, `tags` is the safe side.
    pieces = _ALLOCATING.subn(b"", data)[1] + 2 * len(_RUNS.findall(data))
    bound = int(pieces * (len(_TAG.sub(b"", data)) + tags + longer) * TEXT_COPY_KEPT)
    if bound <= within:
        return bound
    return text_growth_kept(data, respelled=respelled)


def _tag_allocations(values: int) -> int:
    """The allocations a tag with attributes counts, from the `=` in it (a value each, one at least):
    three or more between two pieces and Lexbor keeps the whole copy, so three at most."""
    return min(3, max(1, values))


class _Node:
    """A text node the parser may grow: its length, and how many allocations came since its last piece
    (then the next piece copies it; what Lexbor keeps of the copy grows with them: `TEXT_COPY_KEPT`). A
    node foster-parented text grows counts them from the scan's count at its last piece (`mark`)."""

    __slots__ = ("allocations", "length", "mark")

    def __init__(self, length: int = 0, mark: int = 0) -> None:
        self.length = length
        self.allocations = 0
        self.mark = mark

    def allocated(self, count: int = 1) -> None:
        self.allocations += count

    def grow(self, piece: int, *, copying: bool = False) -> tuple[int, float]:
        """Append a piece; what it copies (a foster-parented piece, `copying`: counted whatever came
        between), and what of that the parser keeps (with nothing allocated between, nothing: 8,000
        pieces foster-parented between `<tr></tr>`s peaked 2 MiB over the parse, 7 bytes each)."""
        copied = self.length + piece if self.length and (copying or self.allocations) else 0
        share = min(TEXT_COPY_KEPT, TEXT_COPY_KEPT_PER_ALLOCATION * self.allocations)
        self.length += piece
        self.allocations = 0
        return copied, copied * share


class _Table:
    """An open table as the parser reads it: the cell or caption open in it (None: its rows, where text
    is foster-parented), its row group, the node before it that foster-parented text grows, whether an
    element foster-parented out of its rows may be open (text then goes into it), and whether the scan
    lost track (a table tag after a taint or in a `<select>`: text may go either way)."""

    __slots__ = (
        "cell",
        "colgroup",
        "fostered",
        "in_template",
        "maybe_closed",
        "open_fostered",
        "rows_node",
        "section",
        "unsure",
    )

    def __init__(self, before: _Node, *, unsure: bool = False, in_template: bool = False) -> None:
        self.cell: bytes | None = None
        self.section: bytes | None = None
        self.fostered = before
        self.open_fostered = False
        # A column group may be open: whitespace leading text in its rows goes into it (an allocation),
        # the rest is foster-parented.
        self.colgroup = False
        # While an element foster-parented out of its rows may be open: the node the table's whitespace
        # grows once it has closed (the text in it is `_Scan.node`).
        self.rows_node: _Node | None = None
        self.unsure = unsure
        # A `</table>` the scan could not follow, or a start tag it could not: whether the parser has the
        # table is unsure for good.
        self.maybe_closed = False
        # Rows in a template's content, no table: the parser foster-parents their text to the end of
        # the template's content (the HTML Standard's "last template" after the last table).
        self.in_template = in_template


class _Scan:
    """`text_copies`' state over the page's tokens (see the module docstring)."""

    def __init__(self, data: bytes, *, respelled: bool = False) -> None:
        self.data = data
        self.copies = 0  # the bytes copied
        self.kept = 0.0  # what Lexbor keeps of them
        self.node = _Node()  # where the parser appends text that is not foster-parented
        self.allocations = 0  # in the text arena so far, anywhere (a piece of text, a comment, ...)
        self.frames: list[_Table | None] = []  # open tables and templates (None), innermost last
        self.templates = 0
        self.mode = _BODY
        self.last_open: bytes | None = None  # the element the text since the last start tag is in
        self.tainted = False  # the scan has lost track of comments (`tag_tokens` after a taint)
        self.nuls = b"\0" in data
        self.references = b"&" in data
        self.longer_references = (
            not respelled and self.references and any(found in data for found in _GROWING_REFERENCES)
        )
        self.raw_text_at = -1  # where the raw text of the last start tag would start

    def _add(self, grown: tuple[int, float]) -> None:
        self.copies += grown[0]
        self.kept += grown[1]

    def allocated(self, count: int = 1) -> None:
        """Something allocated in the text arena: the node the text goes to sees it, and so does each
        node foster-parented text grows (from its `mark`)."""
        self.node.allocated(count)
        self.allocations += count

    def may_be_closed(self, table: _Table) -> None:
        """The parser may have closed `table`, the innermost (the scan keeps it, in doubt for good): text
        foster-parented in it from here may go before the table around it, so its node is as long as that
        one's too."""
        table.maybe_closed = True
        around = self.frames[-2] if len(self.frames) > 1 else None
        if around is not None:
            _join(table.fostered, around.fostered)

    def marked(self) -> _Node:
        """The node the text goes to, as one that counts the allocations from the scan's count: the node
        before a table the scan opens, the table's own whitespace node."""
        return _Node(self.node.length, self.allocations - self.node.allocations)

    def grow_marked(self, node: _Node, size: int, *, copying: bool = False) -> tuple[int, float]:
        """A piece onto a node that counts from its mark (a foster-parented one, `copying`, onto the
        node before the table): kept for what was allocated anywhere since that node's last piece."""
        node.allocations = self.allocations - node.mark
        grown = node.grow(size, copying=copying)
        node.mark = self.allocations + 1  # (after this piece's own)
        return grown

    def table(self) -> _Table | None:
        return self.frames[-1] if self.frames else None

    def split(self) -> None:
        if self.mode != _FRAMESET:  # (after a <frameset> the parser may have ignored any tag)
            self.node = _Node()

    def piece(self, start: int, end: int, *, decoded: bool = True) -> None:
        """Text between two tokens: foster-parented (a table's rows, not only whitespace) onto the node
        before the table, else where the parser inserts (in doubt, both). Its size is the decoded text's
        (`_REFERENCE`; not `decoded`: CDATA, where the references stay)."""
        size = end - start
        if self.nuls:
            size += 2 * self.data.count(b"\0", start, end)  # (U+FFFD in foreign content: 3 bytes)
        table = self.table()
        # (Decoded where it may matter: in a table, or where a reference decodes longer than it is; the
        # bytes are the safe side elsewhere, and cheaper.)
        if (
            decoded
            and (table is not None or self.longer_references)
            and self.references
            and self.data.find(b"&", start, end) >= 0
        ):
            for found in _REFERENCE.finditer(self.data, start, end):
                name = found.group(1)
                size -= _REFERENCE_SAVES.get(name, 0) if name else found.end() - found.start() - 4
        spaces = _NOT_SPACE.search(self.data, start, end) is None
        if table is not None and not spaces and (table.cell is None or table.unsure):
            if (table.colgroup or table.unsure) and self.data[start : start + 1] in _SPACE_BYTES:
                # (Its leading whitespace went into the column group open: a node of its own, allocated;
                # the rest, foster-parented, closed the group.)
                self.allocations += 1
            table.colgroup = False
            fostered = self.grow_marked(table.fostered, size, copying=True)
            if table.cell is None and not (table.open_fostered or table.unsure):
                self._add(fostered)
                self.node.allocated()
                self.allocations += 1  # (any piece writes text to the arena)
                return
            # In doubt the piece grows both nodes; the parser copies one of them (the longer copy, and
            # the larger share kept, may be either's).
            self._add(_larger(fostered, self.node.grow(size)))
            self.node.allocated()  # (and where it went elsewhere, it allocated)
        else:
            grown = self.node.grow(size)
            rows_node = table.rows_node if table is not None and table.cell is None else None
            if rows_node is not None and table is not None and table.open_fostered:
                # (Whitespace: into the element foster-parented, or, if it has closed, the table's node.)
                grown = _larger(grown, self.grow_marked(rows_node, size))
            self._add(grown)
            if self.mode == _FRAMESET or (
                table is not None and table.cell is None and (table.open_fostered or table.unsure)
            ):
                # It may have gone into an element open elsewhere (one foster-parented out of the
                # table's rows; after a <frameset>, the text of an element the parser ignored):
                # then it allocated, and the next piece grows this node by a copy.
                self.node.allocated()
        self.allocations += 1
        if not spaces and self.mode in (_AFTER_HEAD, _AFTER_BODY) and not self.templates:
            self.mode = _BODY  # (text in a template in the head stays there)

    def hidden(self, start: int, end: int) -> None:
        """A comment, raw text or CDATA span."""
        if end - start == 3 and self.data.startswith(b"</>", start):
            return  # (the tokenizer drops it: no node, nothing allocated, the text on both sides one piece)
        if start == self.raw_text_at:
            self.allocated()  # an element's raw text (its start tag ended the node if it goes here)
        elif self.data[start : start + 9].lower() == b"<!doctype":
            self.allocated(2)  # ignored in the page, no node, its two ids allocated
        elif self.data.startswith(b"<![", start):
            # CDATA in foreign content is text; elsewhere a bogus comment: a piece, then an allocation
            # (and, as it may be no text, where the text goes stays as it was).
            mode = self.mode
            self.piece(start, end, decoded=False)
            self.mode = mode
            self.allocated()
        elif self.mode == _BODY:
            self.split()  # a comment where the text goes (in a table's rows, in the table)
            self.allocations += 1
        else:
            self.allocated()  # (after the head: a head element's raw text; after the body: a comment)

    def tag(self, end_tag: bool, name: bytes, start: int, end: int, where: int) -> None:
        attributes = end - start > len(name) + 2 + end_tag
        self.raw_text_at = end if not end_tag and name in _RAW_TEXT else -1
        if where == TAINTED or self.mode == _FRAMESET:
            self.tainted = True  # (from here the scan may read a comment as text: `_gap`)
        table = self.table()
        unsure_place = where in (TAINTED, SELECT) or self.mode == _FRAMESET
        if end_tag:
            self._end_tag(name, where, table, unsure_place)
        else:
            self._start_tag(name, where, table, unsure_place, start, end)
            if self.mode == _FRAMESET:
                self.tainted = True  # (the text right after a <frameset> too: `tag_tokens` reads no comments)
        if attributes:
            # (A new node has nothing to copy.) `allocated`, inline: most tags have attributes.
            count = _tag_allocations(self.data.count(b"=", start, end))
            self.node.allocations += count
            self.allocations += count

    def _start_tag(
        self, name: bytes, where: int, table: _Table | None, unsure_place: bool, start: int, end: int
    ) -> None:
        rows = table is not None and table.cell is None and not table.unsure
        if where == FOREIGN:
            if name in _MAY_MAKE_NO_NODE:
                # (No foreign element has such a name; the parser may have left the zone before it, at an
                # end tag that closed an HTML element around it, and in the body it may make no node.)
                self.last_open = None
                return
            self.split()
            self.last_open = None if is_self_closing(self.data[start:end].rstrip(b">")) else name
            return
        if name == b"frameset":
            self.mode = _FRAMESET  # (ignored after text: the text goes on)
            return
        # What it does to the tables the scan follows.
        if name == b"template" and (not unsure_place or (where == SELECT and self.mode != _FRAMESET)):
            # (In a <select> too: the parser takes a template there by the head's rules.)
            self.frames.append(None)
            self.templates += 1
        elif name == b"table":
            before = self.marked()
            if table is not None and unsure_place:
                self.may_be_closed(table)  # (it may have closed that one, in whose cell it was read)
            if table is not None and (unsure_place or table.unsure or table.maybe_closed):
                # It may close that table (read in its rows) or not: text foster-parented from here may
                # go before either, so the node before this one is as long as the longer of the two.
                _join(before, table.fostered)
            if unsure_place:
                self.frames.append(opened := _Table(before, unsure=True))
                opened.maybe_closed = True  # (the parser may have made no table: unsure for good)
            elif table is not None and table.in_template and table.cell is None:
                table.unsure = True  # (the parser ignores it: no table in scope)
            else:
                if table is not None and table.cell is None and not table.unsure:
                    self.frames.pop()  # a table in a table's rows closes that table first
                elif table is not None and (table.unsure or table.maybe_closed):
                    self.may_be_closed(table)  # (in a cell or in its rows: nested, or closing it)
                self.frames.append(_Table(before))
        elif name in TABLE_STARTS and table is None and self.frames:
            # A table's part in a template's content: its rows foster-parent text too.
            self.frames.append(table := _Table(self.marked(), unsure=unsure_place, in_template=True))
            if not unsure_place:
                table.cell = name if name in _INTO_CELL else None
                # (No row group implied: in a template's content a row or cell is put in the template.)
                table.section = name if name in _ROW_GROUPS else None
                table.colgroup = name in (b"colgroup", b"col")
        elif table is not None and name in TABLE_STARTS:
            if unsure_place or table.maybe_closed:
                table.unsure = True
            elif table.in_template and table.section is None and name in _NOT_AFTER_TEMPLATE_ROWS:
                # After a row or cell in a template's content no row group is in scope, and the parser
                # ignores it (having closed the row): no node, the text on both sides may be one.
                table.unsure = True
                self.last_open = None
                return
            else:
                table.colgroup = name in (b"colgroup", b"col")  # (a <col> implies a column group)
                table.cell = name if name in _INTO_CELL else None
                table.open_fostered = table.unsure = False
                table.rows_node = None
                if name in _ROW_GROUPS:
                    table.section = name
                elif name in (b"caption", b"colgroup", b"col"):
                    table.section = None  # (it closes the row group open)
                elif table.section is None and name in (b"tr", b"td", b"th"):
                    table.section = b"tbody"  # the one the parser implies
        elif table is not None and (table.cell is None or table.unsure) and name not in _INSERTED_IN_ROWS:
            if rows and name not in _STAY_IN_TABLE:
                # Foster-parented before the table: the next piece there starts a new node; text goes
                # into it while it is open. (In doubt, after a <frameset>, the node goes on.)
                if not unsure_place:
                    table.fostered = _Node()
                if name not in VOID_B:
                    if not unsure_place:
                        # Surely open (or in one open there: the parser nests it): the text after it is
                        # a node of its own; the table's whitespace goes on in its node once it closes.
                        if table.rows_node is None:
                            table.rows_node = self.marked()
                        self.split()
                    table.open_fostered = True
            self.last_open = None
            # Nothing goes where the table's own whitespace goes (an <input> but a hidden one is
            # foster-parented, an <image> dropped, ...): that node goes on.
            return
        # Whether it ends the node the text goes into.
        if self.mode == _AFTER_HEAD and (name in _HEAD or name in _MAY_MAKE_NO_NODE):
            if name == b"body" and not unsure_place:
                self.mode = _BODY
            self.last_open = None
            return  # into the head (or nowhere): the text goes on after it
        if self.mode in (_AFTER_HEAD, _AFTER_BODY) and name != b"html":
            self.mode = _BODY  # (after the body, any start tag but <html>, merged, goes back into it)
        if name in _MAY_MAKE_NO_NODE and not (
            name in TABLE_STARTS and table is not None and not (unsure_place or table.maybe_closed)
        ):
            self.last_open = None
            return
        self.split()
        if (
            name in VOID_B
            or (name == b"select" and where in (SELECT, TAINTED))  # (it may close a select: no element)
            or (name in (b"svg", b"math") and is_self_closing(self.data[start:end].rstrip(b">")))
        ):
            self.last_open = None
        else:
            self.last_open = name

    def _end_tag(self, name: bytes, where: int, table: _Table | None, unsure_place: bool) -> None:
        opened, self.last_open = self.last_open, None
        if name in FORMATTING and name != opened:
            # The adoption agency: past eight special elements it clones the element, attributes and
            # all, eight times and leaves the text where it was (`<i a=b>` + 17 `<div>`s + `x</i>y`).
            self.allocated(3)
        if where == FOREIGN:
            if name == opened:
                self.split()
            elif table is not None and (name in _TABLE_ENDS or name == b"template"):
                # (No foreign element open of its name: the parser may take it by the HTML rules, closing
                # a row, a cell, a template, the table around the zone.)
                table.unsure = True
                self.may_be_closed(table)
            return
        if (
            name in (b"body", b"html", b"head")
            and (not unsure_place or name != b"head")
            and self.mode != _FRAMESET
        ):
            # (The text after it still goes where it went; after `</head>` the parser may be in the
            # body already, where the head's elements go where the text goes: the safe side. A `</body>`
            # read in a select may end the body or not: as if it did, comments then end no node.)
            self.mode = _AFTER_HEAD if name == b"head" else _AFTER_BODY
            return
        if name == b"template" and self.templates:
            self.templates -= 1
            while self.frames.pop() is not None:
                pass  # a template's end tag closes what it holds
            if unsure_place:  # (or not: the text may go into the template or out of the table's rows)
                if (below := self.table()) is not None:
                    below.unsure = True
            elif self.mode == _BODY:
                self.split()
            else:
                self.allocated(3)  # a template in the head: its content allocated
            return
        if table is not None and name == b"colgroup":
            table.colgroup = False
        if table is not None and name in _TABLE_ENDS:
            if unsure_place or table.maybe_closed:
                table.unsure = True
                if name == b"table":
                    # It may have closed the table, or not: the scan goes on with the table around it,
                    # in doubt for good, its nodes as long as the longer of the two.
                    self.frames.pop()
                    below = self.table()
                    if below is not None:
                        below.unsure = True
                        self.may_be_closed(below)
                        _join(below.fostered, table.fostered)
                        below.open_fostered = below.open_fostered or table.open_fostered
                        self.node.length = max(self.node.length, table.fostered.length)
                    else:  # (no table around: this one stays, in doubt)
                        self.frames.append(table)
                        table.maybe_closed = True
                return  # (nothing sure: no node ends)
            if name == b"table":
                if not table.in_template:  # (there the parser has no table to close)
                    self.frames.pop()
                    if not table.unsure:  # (in doubt there may have been no table to close)
                        self.split()
                return
            cell = table.cell
            if cell is not None and (
                name == cell
                or (cell != b"caption" and (name == b"tr" or (name in _ROW_GROUPS and name == table.section)))
            ):
                table.cell = None  # the cell or caption closes (a row or row group closes it too)
                if name in _ROW_GROUPS:
                    table.section = None
                if not table.unsure:
                    self.split()
                return
            if cell is None and name == table.section:
                table.section = None  # the row group closes
            if cell in (b"td", b"th") and name in _ROW_GROUPS and table.section is None:
                table.unsure = True  # (a row group the scan did not see may be open)
        if name == opened:
            self.split()  # it closes the element the text since its start tag is in


def _join(node: _Node, other: _Node) -> None:
    """`node` may be `other` too: as long as the longer, its allocations counted from the earlier mark."""
    node.length = max(node.length, other.length)
    node.mark = min(node.mark, other.mark)


def _larger(one: tuple[int, float], other: tuple[int, float]) -> tuple[int, float]:
    """What a piece that grows one of two nodes copies and keeps, at most."""
    return max(one[0], other[0]), max(one[1], other[1])


def text_copies(document: str | bytes) -> int:
    """An upper estimate of the bytes Lexbor copies to grow text nodes in pieces (see the module
    docstring). Linear in the page; a run of plain table rows costs one regex match (`_PLAIN_ROWS`)."""
    return _scan(document).copies


def text_growth_kept(document: str | bytes, *, respelled: bool = False) -> int:
    """What Lexbor keeps of those copies, estimated: each copy `TEXT_COPY_KEPT_PER_ALLOCATION` times the
    allocations before it (anywhere in the page for a foster-parented piece), at most `TEXT_COPY_KEPT`.
    `respelled`: as `text_growth_memory`'s."""
    return int(_scan(document, respelled=respelled).kept)


def _scan(document: str | bytes, *, respelled: bool = False) -> _Scan:
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    scan = _Scan(data, respelled=respelled)
    hidden: list[tuple[int, int]] = []
    skips: list[tuple[int, frozenset[bytes]]] = []
    seen = 0  # the spans of `hidden` read so far
    last_end = 0
    for end_tag, name, start, end, where in tag_tokens(data, hidden, skips):
        if start > last_end or len(hidden) > seen:
            _gap(scan, last_end, start, hidden[seen:])
            seen = len(hidden)
        scan.tag(end_tag, name, start, end, where)
        # (After a taint the scan's tags end before their ">": it is the tag's, no text.)
        last_end = end + 1 if where == TAINTED and data.startswith(b">", end) else end
        if (
            name in _ROW_TAGS
            and where == HTML
            and scan.mode == _BODY
            and (table := scan.table()) is not None
            and table.cell is None
            and not (table.open_fostered or table.unsure)
        ):
            # Rows of cells holding only text, whitespace between: each piece is a node of its own.
            found = _PLAIN_ROWS.match(data, end)
            run_end = end if found is None else found.end()
            if run_end > end:
                skips.append((run_end, _PLAIN_ROW_NAMES))
                if table.section is None:
                    table.section = b"tbody"
                # Its text (cells', whitespace between) and attribute values allocated: a ">" (this
                # tag's too) before anything but a tag, in the run, each "=" (three: the most a copy keeps).
                texts = data.count(b">", end - 1, run_end - 1) - data.count(b"><", end - 1, run_end)
                scan.allocations += min(3, texts + data.count(b"=", end, run_end))
                scan.split()
                scan.last_open = None
                last_end = run_end
    _gap(scan, last_end, len(data), hidden[seen:])
    return scan


def _gap(scan: _Scan, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    """The text between two tags: its pieces between the comments, raw text and CDATA hidden there."""
    position = start
    for a, b in spans:
        if b <= start or a >= end:
            continue
        if a > position:
            _pieces(scan, position, a)
        scan.hidden(a, b)
        position = max(position, b)
    if end > position:
        _pieces(scan, position, end)


def _pieces(scan: _Scan, start: int, end: int) -> None:
    """Text the scan read between two tokens; after a taint, where it reads no comments, every `<` in it
    may start one (allocated, between two pieces)."""
    if scan.tainted:
        bracket = scan.data.find(b"<", start, end)
        while bracket >= 0:
            if bracket > start:
                scan.piece(start, bracket)
            scan.allocated()
            start = bracket
            bracket = scan.data.find(b"<", start + 1, end)
    if end > start:
        scan.piece(start, end)
