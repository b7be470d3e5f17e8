"""The memory pre-check for text nodes grown in pieces (`text_copies`, `text_growth_memory`).

Lexbor grows a text node by copying it when anything was allocated since its last piece, and keeps the
old copies: a node grown in N pieces costs the sum of its N lengths. The soundness oracle here parses
small random tag soups whose every text piece is a unique marker and between two of whose markers
something always allocates (a comment, a tag with attributes) just before the second one: every piece
of a node after its first is then a copy, so the sum over the tree's nodes of their lengths at each
later piece is an under-bound of what the estimate promises to charge. Two generators feed it: tables,
templates, selects and foreign content (`random_page`), and the head, the body's and the page's end tags,
framesets, CDATA and nested tables (`random_page_2`). The refusals are sized from the estimate (not from
memory measurements): pages that big would parse to gigabytes, so only `prune_html`, which refuses them
before parsing, ever sees them. The check's own work is counted in line events of the pre-check modules,
never timed.
"""

from __future__ import annotations

import random
import re

import pytest
from selectolax.lexbor import LexborHTMLParser

from service.core import prune
from service.core.precheck import memory
from service.core.precheck.text_growth import text_copies, text_growth_kept, text_growth_memory
from service.core.prune import InputTooLargeError, PruneError, prune_html
from tests.core.precheck.test_nesting import TooMuchWork, python_work

# Tags that allocate in the tokenizer or tree (a comment's data, attributes): the piece after one of
# them copies the node it joins. Some make no node (an end tag with attributes, a cell's start tag
# outside a table, a root tag whose attributes are merged, a frame in the body).
_ALLOCATING = (
    "<!>",
    "<!--c-->",
    "</x a=b>",
    "</b a=b>",
    "<td a=b>",
    "<th a=b>",
    "<caption a=b>",
    "<tr class=r>",
    "<html a=b>",
    "<body a=b>",
    "<frame a=b>",
    "</td a=b>",
    "</table a=b>",
)
# Markup between a marker and the allocating tag after it: tables and their parts, nested tables,
# elements foster-parented out of a table's rows, templates, selects, foreign content, whitespace.
_MARKUP = (
    "<table>",
    "<table>",
    "</table>",
    "<tr>",
    "</tr>",
    "<td>",
    "<td>",
    "</td>",
    "<th>",
    "<caption>",
    "</caption>",
    "<tbody>",
    "</tbody>",
    "<thead>",
    "<colgroup>",
    "<col>",
    "<b>",
    "</b>",
    "<i>",
    "<span>",
    "<template>",
    "</template>",
    "<select>",
    "</select>",
    "<option>",
    "<svg>",
    "</svg>",
    "<desc>",
    "</desc>",
    "<math>",
    "<mi>",
    "<p>",
    "</p>",
    "</x>",
    "<div>",
    "</div>",
    "<li>",
    "<br>",
    "<input type=hidden>",
    "<form>",
    "</form>",
    "<html>",
    "<body>",
    "<frameset>",
    " ",
    "\n",
)
# The second generator's (`random_page_2`): the head and what goes into it, the body's and the page's end
# tags (the comments after them go to <html> or the document while the text goes on in the body), framesets,
# elements foster-parented out of a table's rows, nested tables in cells, captions, a cell end tag in a
# header cell, foreign content (where CDATA is text).
_ALLOCATING_2 = (
    *_ALLOCATING,
    "<!---->",
    "<meta a=b>",
    "<link a=b>",
    "<script a=b></script>",
    "<head a=b>",
    "<form a=b>",
    "<img a=b>",
    "<br a=b>",
    "<input a=b>",
    "<b a=b>",
    "</body a=b>",
    "</html a=b>",
)
_MARKUP_2 = (
    *_MARKUP,
    "</body>",
    "</html>",
    "<head>",
    "</head>",
    "<title>t</title>",
    "<frameset>",
    "</frameset>",
    "<table><b>",
    "<table><tr><b>",
    "<td><table>",
    "<td><table><tr><td>",
    "<caption>",
    "<th></td>",
    "<svg>",
    "<math><mi>",
    "<tfoot>",
    "<select><option>",
)
_CDATA = "<![CDATA["
_MARKER = re.compile(r"Q\d+x*")
_TAG = re.compile(r"<[^>]*>")
_ALLOCATING_TAG = re.compile(r"<![^>]*>|<[^>]*=[^>]*>")


def random_page(seed: int) -> str:
    """A small tag soup: each unit a unique marker (a tenth of them long), some markup, and an allocating
    tag, so that the next marker comes right after an allocation."""
    rng = random.Random(seed)
    out: list[str] = []
    for n in range(rng.randrange(5, 60)):
        out.append(f"Q{n}" + ("x" * rng.randrange(1, 400) if rng.random() < 0.1 else ""))
        out.extend(rng.choice(_MARKUP) for _ in range(rng.randrange(3)))
        out.append(rng.choice(_ALLOCATING))
    return "".join(out)


def random_page_2(seed: int) -> str:
    """As `random_page`, from `_MARKUP_2` and `_ALLOCATING_2`; a fifth of the markers in CDATA (in an
    `<svg>` it opens, or wherever the page is: outside foreign content a bogus comment, no text). The
    CDATA's text is a piece of its own, so the allocating tag comes before its `<![CDATA[`."""
    rng = random.Random(100_000 + seed)
    out: list[str] = []
    for n in range(rng.randrange(5, 60)):
        marker = f"Q{n}" + ("x" * rng.randrange(1, 400) if rng.random() < 0.1 else "")
        kind = rng.random()
        if kind < 0.1:
            marker = f"<svg>{_CDATA}{marker}]]>"
        elif kind < 0.2:
            marker = f"{_CDATA}{marker}]]>"
        out.append(marker)
        out.extend(rng.choice(_MARKUP_2) for _ in range(rng.randrange(4)))
        out.append(rng.choice(_ALLOCATING_2))
    return "".join(out)


def every_piece_follows_an_allocation(page: str) -> bool:
    """Whether an allocating tag comes between every two markers of `page`, with no text after it (a
    whitespace piece there would take the copy, and the marker grow in place); a CDATA's `<![CDATA[`
    right before its marker is no text."""
    for between in _MARKER.split(page)[1:-1]:
        between = between.removesuffix(_CDATA)
        found = list(_ALLOCATING_TAG.finditer(between))
        if not found or _TAG.sub("", between[found[-1].end() :]):
            return False
    return True


# Markup the parser read as text (after an unclosed <textarea>, <title>, <plaintext>, ...): the allocating
# tag before a marker was no tag, so the marker need not have copied its node.
_READ_AS_TEXT = re.compile(r"=|<!|<\?|</?[a-zA-Z]")


def oracle(page: str) -> int:
    """The bytes copied to grow the text nodes of Lexbor's tree for `page` where each piece after a
    node's first copies it: the node's length at each of those pieces, counting its markers only (not
    one with markup read as text since the marker before it). The tree is walked without recursion; a
    template's content is not reachable from it and is skipped."""
    root = LexborHTMLParser(page, scripting=True, options=prune._PARSER_OPTIONS).root
    copied = 0
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node.tag == "-text":
            text = node.text_content or ""
            length = position = 0
            for index, marker in enumerate(_MARKER.finditer(text)):
                length += len(marker.group())
                if index and not _READ_AS_TEXT.search(text, position, marker.start()):
                    copied += length
                position = marker.end()
        child = node.child
        while child is not None:
            stack.append(child)
            child = child.next
    return copied


_SEEDS = range(400)
_SEEDS_2 = range(300)


def test_the_generated_pages_allocate_before_every_marker() -> None:
    """The oracle's premise: what it counts are copies the estimate promises to charge."""
    for generator, seeds in ((random_page, _SEEDS), (random_page_2, _SEEDS_2)):
        for seed in seeds:
            page = generator(seed)
            assert every_piece_follows_an_allocation(page), page


def test_the_second_generator_grows_nodes_and_reads_cdata() -> None:
    """It tests something: most of its pages grow a node in pieces, some with a CDATA piece among them."""
    grown = [page for page in map(random_page_2, _SEEDS_2) if oracle(page) > 0]
    assert len(grown) > len(_SEEDS_2) // 2
    assert sum(f"<svg>{_CDATA}" in page for page in grown) > len(_SEEDS_2) // 4


def test_the_estimate_is_above_the_copies_of_every_grown_node() -> None:
    under = [
        (generator.__name__, seed, text_copies(page), oracle(page))
        for generator, seeds in ((random_page, _SEEDS), (random_page_2, _SEEDS_2))
        for seed in seeds
        for page in [generator(seed)]
        if text_copies(page) < oracle(page)
    ]
    assert not under, f"(generator, seed, estimate, oracle) under the oracle: {under}"


# Under-estimates the first version of the estimate made (the oracle found them among `_SEEDS`: 1, 46, 60,
# 72, 213, 278, 335), shrunk; their three kinds at scale in `_FORMERLY_UNDER_ESTIMATED`.
_MINIMAL = {
    # A start tag that may make no node before a `<table>` ended the text it took for the node before it.
    "a cell's start tag with attributes outside a table, then a table": "Q1<td a=b><table>Q4",
    "a row's start tag outside a table, then a table": "Q1<tr class=r><table>Q7",
    "a column group's start tag outside a table, then a table": "Q4</b a=b><colgroup><table>Q8",
    "an html start tag with attributes, then a table": "Q2<html a=b><table>Q7",
    # An end tag of a cell the parser does not have open is ignored; it took the table back to its rows.
    "a cell end tag in a header cell": "<table><th>Q12</td a=b>Q17",
}


# Under-estimates the oracle found past the seeds tested (`random_page_2`, seeds 8524, 14248 and 14674 of
# 20,000), shrunk. After a taint (`tag_tokens` reads no comment there: an <svg> zone's end tag that may
# close an HTML element, a <frameset>) a comment or bogus comment was read as text, so nothing allocated
# before the text after it; nor did a tainted `</template>` or a `</td>` after a `<frameset>` (which the
# parser ignores in a cell) leave the table's template or cell, so the text after it was not fostered.
_AFTER_A_TAINT = {
    "comments after a taint (estimate 0, oracle 10)": "<head><math></head><div>Q1</html><!>Q2</html><!>Q3",
    "a cell end tag after an ignored frameset (estimate 0, oracle 4)": "Q1<table><td><frameset></td a=b>Q8",
    "a tainted template end tag in a table (estimate 0, oracle 4)": (
        "Q0<table><template><caption a=b><svg></template>Q6"
    ),
    # (`random_page` seed 7903, shrunk.) A `</table>` in a <select> may close the table: a sure table tag
    # after it took the table as open, and its caption as ending the text's node.
    "a table tag after a table end tag in a select (estimate 0, oracle 6)": (
        "<table><select></table><select>Q30<caption a=b>Q33"
    ),
    # (`random_page_2` seed 133522, shrunk.) A bogus comment `<![CDATA[...]]>` after `</body>` was taken
    # for text that brings the parser back into the body, where the comment after it ends the node.
    # (`random_page` seeds 23957 and 24690, shrunk.) A `</table>` in doubt whether a table was open (its
    # start tag was read in a <select>) ended the text's node; a caption closed the row group, so the
    # header cell after it was in a new <tbody>, which `</tbody>` closed, not the one before it.
    "a table end tag after a table in a select (estimate 0, oracle 6)": (
        "<select><table></select><math></table a=b><b>Q43</table></x a=b>Q45"
    ),
    "a row group end tag after a caption (estimate 0, oracle 259)": (
        "<table><thead><caption a=b><table></table a=b><th a=b></tbody>Q34<!--c-->Q37" + "x" * 200
    ),
    # (`random_page_2` seed 139076, shrunk.) After `</body>` an `<html>` start tag (its attributes merged)
    # leaves the parser after the body, where a comment goes to <html>, not where the text goes.
    "an html start tag after the body (estimate 0, oracle 5)": "Q1</body><html a=b><!>Q25",
    # (`random_page_2` seed 146992, shrunk.) A `</table>` read after a taint may close the inner table:
    # the text after it may be foster-parented out of the outer one, onto the text before that.
    "a table end tag in doubt in a cell (estimate 0, oracle 305)": (
        "<table>Q4" + "x" * 300 + "<td><table><body a=b><svg></table><col>Q10"
    ),
    "a bogus CDATA comment after the body (estimate 58, oracle 216)": (
        "Q3</body a=b><![CDATA[Q4" + "x" * 42 + "]]><!>Q7" + "x" * 200
    ),
}


# The first two at scale (refused: `_REFUSED`; never parsed, that would take gigabytes).
_AFTER_A_TAINT_AT_SCALE = {
    "comments after a taint": "<head><math></head><div>" + "x" * 1_000_000 + "</html><!>y" * 3000,
    "a tainted template end tag": (
        "x" * 1_000_000 + "<table><template><caption a=b><svg></template>" + "y<!>" * 3000
    ),
}


def budget_left(page: str) -> int:
    """What is left of the page's memory budget after the per-tag charge, as `_prune_document` computes it
    before the text growth check (end tags and attributes aside: the page's budget left is no more)."""
    return 10 * len(page) + prune._MEMORY_HEADROOM - page.count("<") * memory.MEMORY_PER_TAG


def charge(page: str) -> int:
    """The text growth charge `prune_html` compares with the budget left (the precise one: `within=0`)."""
    return text_growth_memory(page, tags=page.count("<"), within=0)


def assert_refused(page: str) -> None:
    """`page` is refused for its text growth, and not by luck: the charge is at least twice the budget
    left. The charge is checked first, so that a page the estimate misses is never parsed."""
    assert charge(page) > 2 * budget_left(page)
    with pytest.raises(InputTooLargeError, match="grows text nodes"):
        prune_html(page)


# Each sized from the estimate, here and in every page `assert_refused` takes (`_REFUSED`): its charge is
# at least twice the budget left (the quadratic cases are about 1.4 times the smallest size refused).
_ADVERSARIAL = {
    # 160 KB, 305 MiB charged (the 320 KB of the review peaked at 441 MiB).
    "text split by comments in a table's rows": "<table>" + "y<!>" * 40_000,
    # 440 KB, 305 MiB charged (880 KB peaked at 509 MiB).
    "text between cells": "<table><tr>" + "<td>1</td>y" * 40_000,
    # 1 MB, 381 MiB charged (4 MB before 3,000 pieces peaked at 1.5 GB).
    "a long text before a table, then fostered pieces": "x" * 1_000_000 + "<table>" + "y<!>" * 1000,
    # 360 KB, 305 MiB charged (720 KB peaked at 437 MiB).
    "text split by end tags with attributes": "y</x a=b>" * 40_000,
    "text split by cells with attributes outside a table": "y<td a=b>" * 40_000,
    # Under the cap of merged root attributes (1,000 of them, all "a").
    "a long text grown after html tags with attributes": "x" * 1_000_000 + "<html a=b>y" * 1000,
    "a long text grown after body tags with attributes": "x" * 1_000_000 + "<body a=b>y" * 1000,
}


# The review's findings, each accepted by the first version of the estimate and parsed to 3.7-6.5 GB at
# a larger size; here sized from the estimate (twice the budget left, or a little more). Whitespace or
# text grown in place between tags that allocate and make no node where the text goes: comments after
# the body or the page (they go to <html> or the document), end tags with attributes (in a table's rows
# too: whitespace is not foster-parented), a second <form> in a table, the head's elements after it, the
# tags of a frameset (or after it); a long text in an element foster-parented out of a table's rows,
# grown by the whitespace after it; CDATA pieces in foreign content.
_REVIEW_FINDINGS = {
    "text and comments after the body's end tag": "y</body><!>" * 40_000,
    "whitespace and comments after the body": "</body>" + " <!---->" * 40_000,
    "whitespace and bogus comments after the page": "</html>" + " <!>" * 40_000,
    "whitespace and end tags with attributes in a table's rows": "<table>" + " </x a=b>" * 40_000,
    "whitespace and end tags with attributes in a row": "<table><tr>" + " </x a=b>" * 40_000,
    "whitespace and ignored forms in a table": "<form><table>" + " <form a=b>" * 40_000,
    "whitespace and metas after the head": "<head></head>" + " <meta a=b>" * 40_000,
    "whitespace and scripts after the head": "<head></head>" + " <script a=b></script>" * 40_000,
    "whitespace and images in a frameset": "<frameset>" + " <img a=b>" * 40_000,
    "whitespace and line breaks after a frameset": "<frameset></frameset></html>" + " <br a=b>" * 40_000,
    "whitespace and end tags with attributes after text": "x" + " </x a=b>" * 40_000,
    "a long text in a foster-parented element grown by whitespace": (
        "<table><b>" + "X" * 100_000 + " </x a=b>" * 10_000
    ),
    "CDATA pieces in foreign content": "<svg>" + "<![CDATA[y]]></x a=b>" * 20_000,
    # The second review's: rows in a template's content foster-parent their text to its end (no table);
    # Lexbor drops a foster-parented <image> (attributes allocated); a <frameset> the parser ignored (after
    # text) hid the table after it; a template's content in the head allocates; a bogus comment `<![x]>`
    # (CDATA only in foreign content) after </body>; a NUL in foreign content is U+FFFD, 3 bytes. Each was
    # accepted and peaked at 670-970 MiB (2-4.6 times the bound).
    "rows and comments in a template": "<template><tr>" + "y<!---->" * 40_000,
    "rows and cells in a template": "<template><tr>" + "<td>1</td>y" * 40_000,
    "foster-parented images": "<table><tr>" + "y<image a=b>" * 40_000,
    "a table after an ignored frameset": "x<frameset><table><tr>" + ("<td>1</td>" + "y" * 250) * 2_000,
    "templates after the head": "<head></head>" + " <template>x</template>" * 40_000,
    "bogus comments after the body": "<body>" + "y</body><![x]>" * 40_000,
    "NULs in an svg": "<svg>" + ("\0" * 200 + "</x a=b>") * 2_000,
}


# The former under-estimates (`_MINIMAL`) at scale: each peaked at 1.47 GB parsed with 4 MB of "x" and
# 3,000 pieces (a 188 MiB budget; the first estimate said 4 MiB, and prune_html parsed it). Never parsed
# here: `assert_refused` checks the charge before `prune_html` refuses them.
_FORMERLY_UNDER_ESTIMATED = {
    "a row's start tag between a long text and a table": "x" * 1_000_000 + "<tr><table>" + "y<!>" * 1000,
    "a cell's start tag between a long text and a table": "x" * 1_000_000 + "<td><table>" + "y<!>" * 1000,
    "a long text in a header cell grown after ignored cell end tags": (
        "<table><th>" + "x" * 1_000_000 + "</td a=b>y" * 1000
    ),
}


# Text before a table but closed in its element is not the node foster-parented text grows (the review's
# F6: a megabyte in a <span> before 600 fostered pieces was refused); bare, the same text is.
_CLOSED_BEFORE_A_TABLE = {
    name: f"<{name}>" + "x" * 1_000_000 + f"</{name}><table>" + "<tr><td>1</td></tr>y" * 600
    for name in ("span", "p")
}


@pytest.mark.parametrize("page", list(_CLOSED_BEFORE_A_TABLE.values()), ids=list(_CLOSED_BEFORE_A_TABLE))
def test_text_closed_in_its_element_before_a_table_is_not_charged(page: str) -> None:
    assert charge(page) < 1 << 20
    assert prune_html(page)
    bare = "x" * 1_000_000 + page[page.index("<table>") :]
    assert charge(bare) > budget_left(bare)  # (checked first: refused before parsing)
    with pytest.raises(InputTooLargeError, match="grows text nodes"):
        prune_html(bare)


# A foster-parented piece is charged for what was allocated anywhere since the node's last piece, as any
# other: nothing between two pieces, nothing kept (8,000 pieces between `<tr></tr>`s peaked 2 MiB over the
# parse); a cell of text between them, one allocation; two, two; three or more, the most.
_ROWS_BETWEEN = {0: "<tr></tr>", 1: "<tr><td>c</td></tr>", 2: "<tr><td>c</td><td>d</td></tr>"}


@pytest.mark.parametrize("allocations", [0, 1, 2, 3])
def test_a_foster_parented_piece_is_kept_for_the_allocations_before_it(allocations: int) -> None:
    rows = _ROWS_BETWEEN.get(allocations, "<tr><td>c</td><td>d</td><td>e</td></tr>")
    page = "<table>" + (rows + "yyyyyyy") * 2000 + "</table>"
    share = min(memory.TEXT_COPY_KEPT, memory.TEXT_COPY_KEPT_PER_ALLOCATION * allocations)
    copies = text_copies(page)
    assert copies == 7 * sum(range(2, 2001))  # (each piece after the first copies the node: 7 bytes longer)
    assert text_growth_kept(page) == pytest.approx(share * copies, rel=1e-6)


# A piece is as long as its decoded text: an `&nbsp;` is U+00A0, two bytes, as an "é" is (an `&nbsp;` after
# each of 17,000 rows, 430 KB, peaked at 120 MiB; it had been charged its six bytes and refused from 8,000
# rows); an `&nGt;` decodes to six bytes, one more than it has.
_DECODED = {
    "&nbsp;": "\u00e9",
    "&amp;&lt;": "xx",
    "&#160;&#x263A;": "\u00e9\u263a\u0000",  # (a numeric one counts four bytes at most)
    "&nGt;": "\u226b\u20d2",
}


@pytest.mark.parametrize("reference", list(_DECODED))
def test_a_piece_counts_its_character_references_decoded(reference: str) -> None:
    def page(text: str) -> str:
        return "<table>" + ("<tr><td>c</td></tr>" + text + "\n") * 3000 + "</table>"

    assert text_growth_kept(page(reference)) == text_growth_kept(page(_DECODED[reference])) > 0


def test_a_table_with_an_nbsp_after_each_row_prunes() -> None:
    """(It was refused: charged 235 MiB, its six bytes a piece and the most kept, against 155 left.)"""
    row = "<tr><td>cell text 1234567890123456789</td></tr>&nbsp;&nbsp;&nbsp;\n"
    page = "<table>" + row * 8000 + "</table>"
    assert charge(page) < budget_left(page)
    assert prune_html(page).count("<tr>") == 8000


# Text after an element foster-parented out of a table's rows goes into that element, a node of its own
# (each `<li>` or `<p>` closes the one before and is foster-parented anew): these had been charged as one
# node grown in every piece (300 MiB for 150 KB, refused); parsed, they peak 6-8 MiB over the interpreter.
_INTO_FOSTERED = {
    "a list item of attributes after each text": "<table>" + "yyyyyyy<li a=b>" * 10_000,
    "a paragraph of attributes after each text": "<table>" + "yyyyyyy<p class=x>" * 10_000,
    "list items without attributes": "<table><tr><td>1</td></tr>" + "y<li>" * 10_000,
}


@pytest.mark.parametrize("page", list(_INTO_FOSTERED.values()), ids=list(_INTO_FOSTERED))
def test_text_in_an_element_foster_parented_is_a_node_of_its_own(page: str) -> None:
    assert text_growth_kept(page) < len(page)
    assert prune_html(page)


def test_references_in_cdata_stay_undecoded() -> None:
    """CDATA in foreign content is text as written: its references count their bytes."""

    def page(text: str) -> str:
        return "<svg>" + ("<![CDATA[" + text + "]]></x a=b>") * 2000

    assert text_copies(page("&nbsp;")) == text_copies(page("xxxxxx")) > 0


def test_the_cheap_bounds_count_the_references_that_decode_longer() -> None:
    page = "<p>" + "&nGt;</x a=b>" * 20_000
    assert text_growth_memory(page, tags=page.count("<"), within=1 << 40) >= charge(page)
    longer = "<p>" + "\u226b\u20d2</x a=b>" * 20_000
    assert charge(page) == charge(longer)


_ORDINARY = {
    "a data table with classes on every row and cell": "<table>"
    + "".join(
        f'<tr class="row"><td class="c">{i}</td><td class="c">name {i}</td></tr>\n' for i in range(20_000)
    )
    + "</table>",
    "paragraphs with inline end tags": "<p>Some <b>bold</b> text and <i>more</i> words</p>\n" * 5000,
    "root tags with attributes": "<!DOCTYPE html><html lang=en><head><title>t</title></head><body class=x>"
    + "<div class=a>text <span>x</span> more</div>" * 5000,
    "a table with whitespace between rows": "<table>\n"
    + "  <tr>\n    <td>a</td>\n    <td>b</td>\n  </tr>\n" * 5000
    + "</table>",
    "an svg icon in every cell": "<table>"
    + '<tr><td><svg viewBox="0 0 1 1"><path d="M0 0"/></svg> item</td></tr>' * 5000
    + "</table>",
}


@pytest.mark.parametrize("page", list(_ORDINARY.values()), ids=list(_ORDINARY))
def test_ordinary_pages_are_not_charged(page: str) -> None:
    assert text_copies(page) <= len(page)
    assert prune_html(page)


# The most line events a tag may cost `text_copies`: ordinary markup takes 30-60 (a walk per tag, or over
# every comment of the page at each tag, takes hundreds).
_LINES_PER_TAG = 100

_WORK = {
    "template end tags under open tables": "<template>" + "<table><tr><td>" * 600 + "</template>" * 3000,
    "templates each closing open tables": "<template><table><tr><td><table>x" * 2000 + "</template>" * 2000,
    "deeply nested tables": "<table><tr><td>" * 3000 + "x</td a=b>y" * 1000,
    "tables nested in rows": "<table>" * 5000 + "y<!>" * 1000,
    "comments in a table's rows": "<table><tr>" + "y<!--c-->" * 5000 + "<td>x</td>" * 100,
    "long text runs split by many comments": "<table>" + ("y<!>" * 50 + "<b>") * 200,
    # 200 KB data tables: cells holding links (each tag read by the scan), and plain rows (`_PLAIN_ROWS`).
    "a data table of links": "<table>"
    + "<tr><td><a href=x>y</a></td><td><a href=x>y</a></td></tr>" * 3600
    + "</table>",
    "a data table of plain rows": "<table>" + "<tr><td>1</td><td>name</td></tr>\n" * 6000 + "</table>",
}


@pytest.mark.parametrize(
    "page", [*_WORK.values(), *_ORDINARY.values()], ids=[*_WORK, *(f"ordinary: {k}" for k in _ORDINARY)]
)
def test_the_estimate_does_a_bounded_work_per_tag(page: str) -> None:
    bound = _LINES_PER_TAG * page.count("<")
    try:
        python_work(text_copies, page, bound=bound)
    except TooMuchWork:
        pytest.fail(f"text_copies ran more than {bound} lines of the pre-checks")


# Pages a review found each cheap bound under the charge on (CDATA in the bound without a table; a
# template's content after the head; comments read as text after a taint).
_UNDER_THE_CHEAP_BOUNDS = {
    "CDATA sections": "<svg>" + "x<![CDATA[y]]>" * 3000,
    "templates after the head": "</head>" + " <template></template>" * 3000,
    "comments after a frameset": "<frameset></frameset>" + " <!---->" * 3000,
}
_BOUNDED = {**_ADVERSARIAL, **_REVIEW_FINDINGS, **_UNDER_THE_CHEAP_BOUNDS}


@pytest.mark.parametrize("page", list(_BOUNDED.values()), ids=list(_BOUNDED))
def test_the_cheap_bounds_are_never_under_the_charge_they_replace(page: str) -> None:
    """A cheap bound is returned only where it is within the budget left: wherever the precise charge is
    over it, so is what comes back (the page is refused as the precise charge would refuse it)."""
    charge = text_growth_kept(page)
    tags = page.count("<")
    for within in (0, 1 << 20, charge - 1, charge, 2 * charge, tags * len(page)):
        returned = text_growth_memory(page, tags=tags, within=within)
        assert returned >= charge or returned <= within, within
        if charge > within:
            assert returned > within, within
    assert text_growth_memory(page.encode(), tags=tags, within=charge - 1) >= charge


# The third review's: an end tag `</head>` with attributes before `<body>` (the parser ignores it in the
# body, its attributes allocated: 1 MB peaked at 1,380 MiB) and a quoted ">" that made a `</head>` seem
# followed by `<body>` (after it the head's elements go into the head: 990 KB, 604 MiB); each was let
# through by the bound for pages without tables.
_THIRD_REVIEW = {
    "end tags of the head with attributes": "yyyy</head a=b><body>" * 50_000,
    "a body tag in the head's end tag's attributes": '<head></head a=">  <body>">' + " <meta a=b>" * 90_000,
}


class _CountingMatch:
    """A regex whose `match` adds up how far each match reads (C-level work no line event sees)."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.read = 0

    def match(self, data: bytes, position: int) -> re.Match[bytes] | None:
        found = self.pattern.match(data, position)
        self.read += len(data) - position if found is None else found.end() - position
        return found


def test_the_head_check_reads_each_end_tag_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`</head/` x N then `><body>`: each `</head` is in the attributes of the first, whose match reads to
    the end; matching from every one was quadratic (560 KB: 5.7 s, 16 MB: about 80 minutes)."""
    from service.core.precheck import text_growth

    counting = _CountingMatch(text_growth._HEAD_THEN_BODY)
    monkeypatch.setattr(text_growth, "_HEAD_THEN_BODY", counting)
    page = b"</head/" * 80_000 + b"><body>"
    text_growth_memory(page, tags=page.count(b"<"), within=0)
    assert counting.read <= 2 * len(page)


# The fourth review's: the adoption agency, past eight special elements, clones the formatting element
# (attributes and all) eight times and leaves the text where it was (1 MB peaked at 506 MiB); a doctype
# in the page makes no node but allocates its ids (615 KB: 423 MiB; 1.3 MB: 2.4 GB). Both were let
# through by every bound and by the scan.
_FOURTH_REVIEW = {
    "formatting end tags past eight special elements": (
        "<i a=b>" + "<div>" * (8 * 1000 + 1) + "x" + ("</i>" + "y" * 2000) * 1000
    ),
    "doctypes with a system id": "<p>" + ("y" * 100 + '<!DOCTYPE x SYSTEM "a">') * 5000,
    "doctypes with a public id": "<p>" + ("y" * 100 + '<!DOCTYPE html PUBLIC "a" "b">') * 10_000,
}


def test_the_adoption_agency_grows_one_node_past_eight_special_elements() -> None:
    """What the estimate charges it for: the text on both sides of `</i>` is one node."""
    page = "<i a=b>" + "<div>" * 17 + "x</i>y</i>z</i>w"
    root = LexborHTMLParser(page, scripting=True, options=prune._PARSER_OPTIONS).root
    assert root is not None and "xyz" in [node.text_content for node in root.traverse(include_text=True)]
    assert text_copies(page) > 0


# The fifth review's: with two allocations between pieces Lexbor keeps 0.53 of the copies, with three or
# more 1.05 (0.35 with one): pages of each peaked at 1.8 times the bound under a charge of 0.45
# (`TEXT_COPY_KEPT` is 1.1 since); whitespace in a table's rows around a foster-parented element that
# holds text (`<span>t</span>`, `<title>t</title>`: its text allocates, the table's node goes on; 1.14 MB
# peaked at 1,633 MiB); an element's text after a <frameset> (928 KB: 1,146 MiB).
_FIFTH_REVIEW = {
    "six attributes between pieces": "<p>" + ("y" * 100 + "</x a=1 b=2 c=3 d=4 e=5 f=6>") * 2661,
    "three comments between pieces in a table": "<table>" + ("y" * 100 + "<!--a--><!--b--><!--c-->") * 2637,
    "three cells between pieces": "<table><tr>" + ("y" * 100 + "<td>1</td><td>2</td><td>3</td>") * 2612,
    "whitespace around foster-parented spans": "<table>" + (" " * 100 + "<span>t</span>") * 5000,
    "whitespace around foster-parented titles": "<table><tr>" + (" " * 100 + "<title>t</title>") * 8000,
    "titles after a frameset": "<frameset>" + (" " * 100 + "<title>t</title>") * 8000,
}


# Found in the last read of the change: in a table's rows, a start tag the parser does not insert into
# the table (an <input> but a hidden one is foster-parented, an <image> dropped, a second <form> or a
# <frame> ignored) did end the node the table's whitespace grows; 555 KB of 100 spaces and `<image a=b>`
# peaked at 422 MiB, charged nothing.
_NOT_IN_THE_TABLE = {
    "images": "<table>" + (" " * 100 + "<image a=b>") * 5000,
    "inputs": "<table>" + (" " * 100 + "<input a=b>") * 5000,
    "forms": "<table>" + (" " * 100 + "<form a=b>") * 5000,
    "frames": "<table><tr>" + (" " * 100 + "<frame a=b>") * 5000,
}


# Session 25's fuzzing (1.1 million seeds of each generator, and a third mixing nested tables, selects,
# foreign content, templates and framesets), shrunk; each was under the oracle by a whole node.
_SIXTH_FUZZ = {
    # The tokenizer drops a `</>`: no comment, the text on both sides one node.
    "an empty end tag": "Q2</></x a=b>Q3",
    # The text right after a <frameset> may hold comments the scan does not see (a taint from there).
    "text right after a frameset": "Q1<frameset><!DOCTYPE x>Q2",
    "a frameset in a table": "<table><frameset>Q2<!>Q3",
    # A template in a <select> is taken by the head's rules: the table opened in it closes with it.
    "a template in a select": "<select><template></select><table></template>Q5<td a=b>Q7",
    # A <table> read in doubt may close the table whose cell or rows it is in: text foster-parented after
    # it may go before that one.
    "a table in a select in a cell": "<table>Q1<th><select><table><table></table><tr class=r>Q8",
    "a table in a foreign zone's island": "<math><mi>Q7<table><td><table><table a=b></table></td>Q0",
    "a table after a frameset in a cell": "Q1<table><th><frameset><table><table></table a=b><thead>Q6",
    "a table after a cell in doubt": (
        "<table><td><select><tr class=r></select><table></table><td a=b>Q9</tr></x a=b>Q0"
    ),
    "a table after a row group closed in doubt": (
        "<table><th a=b><select></tbody><input type=hidden><table></table>Q3<th a=b>Q4"
    ),
    "a table in a foreign zone's island, then a row group's end": (
        "<table>Q2<td><table><math><mi><table></table a=b></tbody>Q7"
    ),
    "a table in a foreignObject": "Q0<table><td><table><svg><foreignObject><table><svg a=b></table></td>Q5",
    # After a <frameset> a start tag may go anywhere (here into a template): the node goes on.
    "a start tag after a frameset in a table's rows": (
        "<table a=b>Q7<frameset><template><desc></template a=b>Q8"
    ),
    # An end tag in foreign content with no foreign element of its name open is taken by the HTML rules:
    # it may leave the zone (a `<b>` rebuilt from a select closes the svg), and a table's part or a
    # `<frame>` read as foreign after it may make no node; a `</table>` or `</template>` there may close
    # the row or the template around the zone.
    "a formatting end tag in an svg": "<select><b></select><svg></b>Q0<caption a=b>Q1",
    "a formatting end tag in a math": "<select><b></select><math></b a=b>Q8<td a=b>Q9",
    "a template's end tag in a math": "<select><template></select><math></template>Q0<frame a=b>Q2",
    "a table's end tag in a template's row": (
        "<template><tr class=r><math><template></table a=b></template>Q0<body a=b><th a=b>Q4"
    ),
    # A <select> in a select closes it and makes no element: the `</select>` after it closes nothing.
    "a select in a select": "<select><select a=b>Q9</select a=b>Q0",
    "a select in a select, then a doctype": "<select><select>Q1</select><!DOCTYPE x>Q2",
    # A self-closing <math/> or <svg/> is closed at once: its end tag closes nothing.
    "a self-closing math": "<math/>Q1</math><!DOCTYPE x>Q2",
    "a self-closing svg": "<svg/>Q4</svg></td a=b>Q5",
    # A piece in doubt copies the longer node, whichever keeps the larger share.
    "a row after a frameset in a table": "Q0<table><frameset><tr class=r>Q1<tr class=r>Q2",
    "rows in a select in a table": "<select>Q3<table><tr class=r>Q6<tr class=r>Q7",
    "a caption's svg": "<table>6<caption><svg a=b>Q8</tr a=b>Q9",
}


# Three of them at scale: charged nothing, they parsed to 133 MiB (480 KB), 677 MiB (320 KB) and 131 MiB
# (360 KB), quadratic in the page.
_SIXTH_FUZZ_AT_SCALE = {
    "empty end tags between pieces": "y</></x a=b>" * 40_000,
    "comments after a frameset in a table": "<table><frameset>" + "y<!>" * 80_000,
    "a template in a select, then cells outside a table": (
        "<select><template></select><table></template>" + "y<td a=b>" * 40_000
    ),
}


# Session 25's review, each charged nothing and parsed far past the bound: whitespace leading text in a
# column group's rows goes into the group (a node of its own, allocated) before the rest is foster-parented
# (570 KB: 1,242 MiB, 205 allowed); after a row in a template's content the parser ignores a caption (no
# row group in scope), so the text after it grows the node at the template's end (720 KB: 618 MiB).
_SEVENTH_REVIEW = {
    "text after a column group": "<table>" + "yyyyyyyy<colgroup> " * 30_000,
    "references after a column group": "<table><caption>x</caption>" + "&nbsp;<colgroup> " * 23_529,
    "captions in a template's rows": "<template><tr>" + "&#128;y</x a=b><caption>" * 30_000,
}


# Session 25's second review (its own generators, 4 million seeds), shrunk: a template's content may be a
# column group the tag reader cannot follow (a <col> after an inner template, or in a select), where the
# parser ignores a raw-text start tag (the reader had hidden the rest of the page as raw text); a <table>
# read in doubt may close the table whose cell it is in; a <select> read after a taint may close one.
_SECOND_REVIEW = {
    "a style after an inner template in a column group": (
        "<template><col><template></template><style></template>Q1<tr class=r>Q2"
    ),
    "a noscript after an inner template in a column group": (
        "<template><col><template></template><noscript></template>Q1<td a=b>Q2"
    ),
    "a script in a template's column group in a select": (
        "<select><template><col a=b><script></template>Q1<caption a=b>Q2"
    ),
    "a textarea after a column after an inner template": (
        "<template><template a=b><b></template><col><textarea></template>Q1<colgroup a=b>Q2"
    ),
    "a textarea after a style and a column": (
        "<template><style></style><col><textarea></template>Q7<body a=b>Q8"
    ),
    "tables in an island of a cell's table": (
        "<table>Q1<td><table><math><mi><table><table></table></td a=b>Q2"
    ),
    "tables after a frameset in a cell's table": (
        "Q1<table><td><table><frameset><table><table></table></td a=b>Q2"
    ),
    "tables in a select in a caption's table": (
        "Q1<table><caption a=b><table><select><table><table></table a=b><col a=b>Q2"
    ),
    "a select in a select after a taint": "<select><th><select a=b>Q1</select></table a=b>Q2",
    # A <col> after a template's end tag is in the body: the svg after it is read, its template foreign.
    "a column after an empty template": "<template></template><col>Q1<table><td><svg><template></td a=b>Q2",
    # An end tag the template ignores leaves its content's first tag to come: a <col> there still makes it
    # a column group.
    "a column after an ignored end tag in a template": (
        "<template></x><col><style></template>Q1<tr class=r>Q2"
    ),
    # (A last fuzzing.) A template's end tag closes a select left open in it: the `</body>` after it, read
    # in the select, may end the body (the comment after it then ends no node).
    "a body's end after a select closed with its template": "<template><select></template>Q1</body><!>Q2",
    # A column group is the innermost template's only: an svg in a template in it opens a zone.
    "an svg in a template in a template's column group": (
        "<template><col><template><svg><template><table></template></template>Q1<td a=b>Q2"
    ),
}


def test_a_raw_text_tag_a_templates_column_group_ignores_hides_nothing_at_scale() -> None:
    """The first at scale: charged nothing, 880 KB parsed to 663 MB (the promise: 219). Read after a
    taint now, the page is charged (and its nesting, every tag counted, is refused first)."""
    page = "<template><col><template></template><style></template><table><tr>" + "<td>1</td>y" * 80_000
    assert charge(page) > 2 * budget_left(page)
    with pytest.raises(PruneError):
        prune_html(page)


def _each_once(*pages: dict[str, str]) -> dict[str, str]:
    """The pages of several tables of them, none of whose names may repeat (one would hide the other)."""
    joined = {name: page for table in pages for name, page in table.items()}
    assert len(joined) == sum(map(len, pages)), "a page's name repeats"
    return joined


# Pages the estimate was once under the oracle on, shrunk from fuzzing and reviews (each table says how).
_FORMERLY_UNDER_THE_ORACLE = _each_once(_MINIMAL, _AFTER_A_TAINT, _SIXTH_FUZZ, _SECOND_REVIEW)


@pytest.mark.parametrize(
    "page", list(_FORMERLY_UNDER_THE_ORACLE.values()), ids=list(_FORMERLY_UNDER_THE_ORACLE)
)
def test_former_under_estimates_stay_at_or_above_the_oracle(page: str) -> None:
    assert every_piece_follows_an_allocation(page)
    assert text_copies(page) >= oracle(page) > 0


_REFUSED = _each_once(
    _ADVERSARIAL,
    _REVIEW_FINDINGS,
    _FORMERLY_UNDER_ESTIMATED,
    _AFTER_A_TAINT_AT_SCALE,
    _THIRD_REVIEW,
    _FOURTH_REVIEW,
    _FIFTH_REVIEW,
    _NOT_IN_THE_TABLE,
    _SIXTH_FUZZ_AT_SCALE,
    _SEVENTH_REVIEW,
)


@pytest.mark.parametrize("page", list(_REFUSED.values()), ids=list(_REFUSED))
def test_pages_growing_a_node_in_many_pieces_are_refused(page: str) -> None:
    assert_refused(page)
