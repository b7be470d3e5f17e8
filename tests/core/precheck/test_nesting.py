"""The nesting pre-check (`estimate_depth`) against the fifth review's pages: its own work, and depth
it did not see.

The model's walks were quadratic or cubic on pages made for it (each end tag rescanning what a template,
a table or a `<select>` left behind: minutes for 37 KB), so its work is checked here by counting, never
by timing: the Python lines it runs in `service/core/precheck/` (a tracer stops it as soon as the count
passes the bound, so the old walks fail fast). Depth cases are small pages that Lexbor nests more than
twice as deep as the cap they run under (`real_depth`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from service.core import precheck
from service.core.decoding import utf8_payload
from service.core.precheck import nesting, tags
from service.core.precheck.nesting import estimate_depth
from service.core.prune import NestingTooDeepError, prune_html, prune_text
from tests.core.test_prune_prechecks import DEPTH, NESTING_TRICKS, ORDINARY, real_depth

LINES_PER_TAG = 300  # ordinary pages run about 100 (`test_ordinary_pages_stay_under_the_work_bound`)


class TooMuchWork(Exception):
    pass


def python_work(function: Callable[[bytes], Any], page: str, *, bound: int) -> tuple[int, Any]:
    """(Line events run in the pre-check modules while `function(page)` runs, its result): the check's
    Python work, untimed. Past `bound` it stops with `TooMuchWork`."""
    count = 0
    targets = {str(path) for path in Path(precheck.__file__).parent.glob("*.py")}

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if frame.f_code.co_filename not in targets:
            return None
        if event == "line":
            count += 1
            if count > bound:
                raise TooMuchWork
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        result = function(page.encode())
    finally:
        sys.settrace(previous)
    return count, result


def model_work(page: str) -> int:
    """The whole model's work on `page` (a limit it never reaches), asserted within the bound."""
    tags = page.count("<")
    bound = LINES_PER_TAG * tags
    try:
        work, _ = python_work(lambda data: estimate_depth(data, limit=tags - 1), page, bound=bound)
    except TooMuchWork:
        pytest.fail(f"the depth model ran more than {LINES_PER_TAG} lines a tag")
    return work


# A-C: pages whose tags each made the model walk all it had left behind.
_WALKS = {
    # Cells in a template are unsure entries nothing pops; each end tag of the table's structure walked
    # them, and for each one the structure list again (cubic: 37 KB took minutes).
    "cells left in a template, then row end tags": "<template>" + "</tr><td>" * 600,
    "cells left in a template, then table end tags": "<template>" + "</table><td>" * 600,
    "header cells left in a template in a cell, then section end tags": (
        "<table><tr><td><template>" + "</tbody><th>" * 600
    ),
    # An <object> a table pops leaves its marker: each heading looked at every marker (89 s for 670 KB).
    "headings after markers a table left": "<table><object><tr></table>" * 1500 + "<h1>" * 8000,
    "headings after objects left open": "<object>" * 1000 + "<h1>" * 3000,
    # Options a <select> (after a stray `</td>`) left unsure: each `</span>` walked them all (37 s).
    "a select's options left open under spans": (
        "<span>" * 500 + "<select></td>" + "<option>" * 4000 + "</select>" + "</span>" * 500
    ),
}


@pytest.mark.parametrize("page", list(_WALKS.values()), ids=list(_WALKS))
def test_the_depth_model_walks_a_bounded_number_of_entries_per_tag(page: str) -> None:
    model_work(page)


def test_the_model_budget_bounds_walks_that_each_stay_within_reach() -> None:
    """Each end tag here walks as far as a walk may go (256 entries): bounded one by one, 2,000 of them
    still ran about 900 lines a tag. Past its budget (8 entries a `<` in all) every walk stops sooner:
    about 130."""
    model_work("<template>" + "<td>" * 300 + "</tr><td>" * 2000)


def test_past_its_budget_the_model_still_errs_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that spends the budget first, then nests for real: what the walks then give up on keeps
    entries counted, so the estimate stays above the parser's depth."""
    spent: list[int] = []
    spend = nesting._OpenElements.spend

    def recording(self: nesting._OpenElements, steps: int) -> None:
        spend(self, steps)
        spent.append(self.steps_left)

    monkeypatch.setattr(nesting._OpenElements, "spend", recording)
    spender = "<table><template>" + "<td>" * 300 + "</tr><td>" * 1000 + "</template></table>"
    checked = 0
    for trick in NESTING_TRICKS.values():
        page = spender + trick
        if page.count("<") > 4 * spender.count("<") or real_depth(page) <= 2 * DEPTH:
            continue  # its own tags fund the walks again, or it nests only at the page's start
        spent.clear()
        assert model_work(page) and min(spent) < 0  # the budget ran out
        assert estimate_depth(page, limit=DEPTH) > DEPTH
        checked += 1
    assert checked >= 40


# Long runs of plain table markup: tag by tag the model ran about 100 lines a tag on them (2 s for a 2 MB
# data table that Lexbor parses in 30 ms); `_table_run` reads such a run in chunks.
_TABLE_RUNS = {
    "a data table": "<table>" + "<tr><td>123</td><td class=x>abc</td><th>4.5</th></tr>" * 2000,
    "columns and cells": "<table>" + "<col><td>" * 5000,
    "sections, rows and cells": (
        "<table>" + "<thead><tr><th>h</th></tr></thead>" * 1000 + "<tbody>" + "<tr><td>1<td>2" * 2000
    ),
}


@pytest.mark.parametrize("page", list(_TABLE_RUNS.values()), ids=list(_TABLE_RUNS))
def test_runs_of_table_markup_cost_the_model_a_line_a_tag_at_most(page: str) -> None:
    tags = page.count("<")
    try:
        _, depth = python_work(lambda data: estimate_depth(data, limit=tags - 1), page, bound=tags)
    except TooMuchWork:
        pytest.fail("the depth model ran more than a line a tag on a run of table markup")
    assert depth == 4  # the <table>, a section, a row and a cell


_REFUSED_RUNS = {
    "stray cells": "<td>x</td>" * 3000,
    "cells outside any table": "<div>" + "<td>x</td>" * 3000,
    "a row template before a data table": "<template><tr><td>{{name}}</td></tr></template><table>"
    + "<tr><td>a</td><td>b</td></tr>" * 1500,
    "a cell in a select": "<table><tr><td><select><td></select>" + "<td>x</td>" * 3000,
}


@pytest.mark.parametrize("page", list(_REFUSED_RUNS.values()), ids=list(_REFUSED_RUNS))
def test_a_run_the_fast_path_refuses_is_not_scanned_again_from_each_cell(
    page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's scan came before the stack's conditions: a run then refused was scanned again from
    each of its cells (quadratic: a stray `<td>` x 20,000, 80 KB, took 17 s in the checks)."""
    scanned = 0
    real = nesting.TABLE_RUN

    class Counting:
        def match(self, data: bytes, position: int) -> re.Match[bytes] | None:
            nonlocal scanned
            found = real.match(data, position)
            scanned += 0 if found is None else found.end() - position
            return found

    monkeypatch.setattr(nesting, "TABLE_RUN", Counting())
    estimate_depth(page, limit=DEPTH)
    assert scanned <= 2 * len(page)


_RUN_EDGES = {
    "a run cut by other markup": "<table><tr><td>" + "<td>x</td><b>y</b><tr><td><!--c--><th>" * 800,
    "a run in a cell's table": "<table><tr><td><table>"
    + "<tr><td>1</td></tr>" * 800
    + "</table></td></tr>" * 9,
    "a run after formatting elements": "<a><b><table><tr><td><a>" + "<tr><td>x<td>y" * 800 + "</table>x" * 9,
    "tags hidden in attributes": "<table><tr>" + '<td title="</tr><tr>">x<TD\n>y</Td >' * 800 + "<svg></td>",
    "a template's table": "<template><table><tbody>" + "<tr><td>" * 800 + "</template>" + "<td>" * 800,
    "column groups": "<table>" + "<colgroup><col></colgroup><col><tr><td>" * 800 + "<caption><td>",
    "an object in a cell": "<table>" + "<tr><td><object>" + "<tr><td>x" * 800 + "<b></table><i>" * 9,
}


@pytest.mark.parametrize("page", list(_RUN_EDGES.values()), ids=list(_RUN_EDGES))
def test_a_table_run_read_at_once_gives_the_estimate_of_reading_it_tag_by_tag(
    page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tags = page.count("<")
    at_once = [estimate_depth(page, limit=limit) for limit in (tags - 1, 64)]
    monkeypatch.setattr(nesting, "_table_run", lambda *args: args[3])  # `most`: no run read at once
    assert at_once == [estimate_depth(page, limit=limit) for limit in (tags - 1, 64)]


# E: after a taint, a void HTML name may be a foreign element, which nests.
@pytest.mark.parametrize(
    "lead", ["<math><mi><math>", "<svg><desc><i></i><svg>", "<select><svg>"], ids=["mi", "desc", "select"]
)
@pytest.mark.parametrize("void", ["<col>", "<source>", "<link>", "<input>", "<image>"])
def test_void_names_nest_in_foreign_content_after_a_taint(lead: str, void: str) -> None:
    page = lead + void * 1300
    assert real_depth(page) > 2 * DEPTH
    assert estimate_depth(page, limit=DEPTH) > DEPTH


@pytest.mark.parametrize("void", ["<br>", "<img>", "<hr>", "<col/>", "<input/>"])
def test_void_names_that_leave_foreign_content_or_close_themselves_do_not_count(void: str) -> None:
    page = "<math><mi><math>" + void * 1300
    assert real_depth(page) < 10
    assert estimate_depth(page, limit=DEPTH) < 10


# F: the standards-mode doctype as the parser sees it.
def test_a_second_byte_order_mark_leaves_the_parser_in_quirks_mode() -> None:
    """`utf8_payload` strips one BOM; Lexbor reads a second as text, so the doctype does not count: a
    `<table>` leaves the `<p>` open with all it holds (the estimate took the doctype, popped it all)."""
    page = b"\xef\xbb\xbf\xef\xbb\xbf<!doctype html>" + (b"<p>" + b"<q>" * 50 + b"<table><td>") * 30
    payload = utf8_payload(page)
    assert isinstance(payload, bytes)
    assert real_depth(payload.decode("utf-8")) > 2 * DEPTH
    with pytest.raises(NestingTooDeepError):
        prune_html(page, max_depth=DEPTH)


def test_text_starting_with_a_byte_order_mark_is_in_quirks_mode() -> None:
    page = "\ufeff<!doctype html>" + ("<p>" + "<q>" * 50 + "<table><td>") * 30
    assert real_depth(page) > 2 * DEPTH
    with pytest.raises(NestingTooDeepError):
        prune_text(page, max_depth=DEPTH)


# G: elements the model popped right but did not count nest behind scope boundaries.
def test_items_cells_and_buttons_count_where_they_nest() -> None:
    page = "<table><tr><td><li><button><li><p><option>" * 500
    assert real_depth(page) > 2 * DEPTH  # 4,502 (the estimate was 500)
    assert estimate_depth(page, limit=DEPTH) > DEPTH


def test_an_html_element_named_as_a_mathml_one_is_no_boundary() -> None:
    """Outside <math> an `<mi>` is an ordinary HTML element: an `<li>` walks past it to the last one and
    closes it (counting every item made the unit below a false refusal)."""
    page = "<mi><li><option>" * 2000
    assert real_depth(page) < 10
    assert estimate_depth(page, limit=DEPTH) < 10


# I: an island of HTML in a diagram's label returns to the <svg>.
MERMAID = (
    '<svg id="mermaid-1" width="100%"><g class="nodes"><g class="node"><rect/>'
    '<foreignObject width="80" height="24"><div xmlns="http://www.w3.org/1999/xhtml">'
    '<span class="nodeLabel">Start<br></span></div></foreignObject></g></g></svg>'
)


@pytest.mark.parametrize(
    "body",
    [
        "<ul>" + '<li><i class="icon"></i> <a href=/x>item</a> <b>x</b></li>' * 300 + "</ul>",
        "<p>x</p>" * 9000,
    ],
    ids=["a list of icons and links", "many paragraphs"],
)
def test_a_diagram_with_html_labels_does_not_refuse_the_page(body: str) -> None:
    page = "<!doctype html><html><body>" + MERMAID + body + "</body></html>"
    assert prune_html(page)


def test_a_diagram_of_many_labelled_nodes_nests_as_shallow_as_it_is() -> None:
    node = '<g><foreignObject><div><span class="label"><p>x</p></span></div></foreignObject><rect/></g>'
    page = "<div><svg>" + node * 2000 + "</svg></div>" + "<div>y</div>" * 100
    assert real_depth(page) < 12
    assert estimate_depth(page, limit=DEPTH) < 12


_TAINTING_ISLANDS = {
    "an element left open": "<foreignObject><div><span></div></foreignObject>",
    "an end tag of nothing open": "<foreignObject><div></p></div></foreignObject>",
    "raw text": "<foreignObject><style></foreignObject></style></foreignObject>",
    "a table": "<foreignObject><table><tr><td>x</td></tr></table></foreignObject>",
    "character data in an element": "<foreignObject><div><![CDATA[x]]></div></foreignObject>",
}


@pytest.mark.parametrize("island", list(_TAINTING_ISLANDS.values()), ids=list(_TAINTING_ISLANDS))
def test_an_island_the_scan_cannot_follow_taints_the_rest(island: str) -> None:
    """Where the parser may stay in the label's HTML (or read its tags otherwise), what follows is read
    as after any taint: every `<` a tag, and nested."""
    page = "<svg>" + island + "</svg>" + "<div>" * 1300
    tokens = list(tags.tag_tokens(page.lower().encode()))
    assert tokens[-1][4] == tags.TAINTED
    assert estimate_depth(page, limit=DEPTH) > DEPTH


# Controls: ordinary pages stay well within the work bound.
@pytest.mark.parametrize("page", list(ORDINARY.values()), ids=list(ORDINARY))
def test_ordinary_pages_stay_under_the_work_bound(page: str) -> None:
    assert model_work(page) <= LINES_PER_TAG * page.count("<")


def test_foster_parented_a_and_nobr_re_created_after_a_table_nest() -> None:
    """`</table>` pops the <a> and <nobr> foster-parented above the table; the <q> re-creates both, and
    the next unit's <a>/<nobr> (read in the inner table, the old clones out of scope behind it) closes
    neither: Lexbor nests 3 levels a unit, the estimate released both (1 a unit; sixth review)."""
    page = "<a><nobr></table><td><q><table>" * 300
    assert real_depth(page) > 600
    assert estimate_depth(page.encode(), limit=500) > 500


def test_a_diagrams_labels_do_not_add_up_in_depth() -> None:
    """Each label's island is closed when its integration point's end tag comes: its formatting elements
    left the parser's list at their own end tags (2,100 labels were held as 2,107 levels, against 10)."""
    label = '<g><foreignObject><div><div><font color="#000">x</font></div></div></foreignObject></g>'
    page = "<!DOCTYPE html><body><svg>" + label * 2100 + "</svg>"
    assert real_depth(page) < 20
    assert estimate_depth(page.encode(), limit=100) < 20


# The seventh review's bypasses: units whose real depth grows with the page while the estimate stayed flat
# (then `</dd>` x N walks the deep stack: quadratic parse). Each nests a level a unit at least.
_GROWING = {
    # 1. A formatting element foster-parented right above a table: a table's tag pops it, the parser keeps
    # it on its list, text after the table re-creates it and the next table opens in the clone.
    "a <b> above a table, then a cell": "<b><td></table>x<table>",
    "a <b> above a table, then a row": "<b><tr></table>x<table>",
    "a <b> above a table, then a column": "<b><col></table>x<table>",
    "a <b> above a table, then a caption": "<b><caption></table>x<table>",
    "a <nobr> above a table, then a cell": "<nobr><td></nobr></table>x<table>",
    "text after the table": "<table><font size=2><tr><td>x<td>y</tr></table>x",
    "a newline after the table": "<table><font size=2><tr><td>x<td>y</tr></table>\n",
    # 2. Three island `<b>`s drop the `<b>` around the zone from the parser's list (Noah's Ark): its end
    # tag is ignored, and the `<q>`s stay open.
    "island formatting elements": (
        "<b><svg><desc><b><b><b></b></b></b></desc></svg><div>" + "<q>" * 60 + "</b>"
    ),
    # 3. An island `<a>` takes the `<a>` around the zone off the stack: the next `<a>` pops nothing.
    "an island <a> in an svg": "<a><svg><desc><a></a></desc></svg><q>",
    "an island <a> in a math": "<a><math><mi><a></a></mi></math><q>",
    # 4. An end tag of a formatting element re-created before a table: out of scope, ignored.
    "an end tag behind a table": "</table><a><table></em><em>",
    # 5. `<form>` and `</form>` in a `<select>` clear this Lexbor's form pointer: the forms nest.
    "a form pointer a select cleared": "<select></form></select><form>",
}


@pytest.mark.parametrize("unit", list(_GROWING.values()), ids=list(_GROWING))
def test_units_the_seventh_review_found_nest_in_the_estimate(unit: str) -> None:
    page = unit * ((2 * DEPTH + 100) // max(1, unit.count("<q>")))
    assert real_depth(page) > 2 * DEPTH
    assert estimate_depth(page.encode(), limit=DEPTH) > DEPTH


def test_fonts_of_other_attributes_re_created_above_tables_each_count() -> None:
    """The parser's list keeps three of one name and attributes: of other attributes each stays, and the
    next `<font>` in a table re-creates them all, nested."""
    page = "".join(f"<table><font size={size}><tr><td>x<td>y</tr></table>" for size in range(1300))
    assert real_depth(page) > 2 * DEPTH
    assert estimate_depth(page.encode(), limit=DEPTH) > DEPTH


@pytest.mark.parametrize("inner", ["", "<i>"], ids=["a font", "a font and an italic"])
def test_formatting_elements_above_tables_count_as_many_as_the_list_keeps(inner: str) -> None:
    """Those of one name and attributes a table's tag pops, never re-created outside the table, count
    three at most (each `<tr>` popped more, and they were held: 21,004 levels for a 1 MB page)."""
    page = f"<table><font size=2>{inner}<tr><td>x<td>y</tr></table>" * 2000
    assert real_depth(page) < 12
    assert estimate_depth(page.encode(), limit=DEPTH) < 16


# The eighth review's: a `<select>` in a cell, a table in the select. Lexbor opens the table in the select
# and the next cell in it, with the section and row it needs: six levels a unit; the cell, read in the
# select, after the taint that follows or in the table left unsure, counted alone or not at all (four a
# unit, three).
@pytest.mark.parametrize(
    "unit", ["<td><select><em><table>", "<th><select><table>", "<td><select><em><table></select><td>"]
)
def test_cells_read_in_a_select_count_the_section_and_row_the_parser_opens(unit: str) -> None:
    page = unit * 300 + "<!---->" * 2000  # (more tags than levels: the estimate runs to the end)
    # (The estimate leaves out <html> and <body>, and the first cell read in a <select>: one closes it.)
    assert estimate_depth(page.encode(), limit=page.count("<") - 1) >= real_depth(page) - 3


# Old markup leaves `<b>` and `<font>` open in blocks: the block's end tag pops them, the parser keeps them
# on its list and re-creates them in the next block, but keeps three of one name and attributes at most
# (Noah's Ark). Held, each counted again in every block: 8,193 blocks refused a page Lexbor nests 7 deep.
_BLOCKS_LEFT_FORMATTED = {
    "bold in divs": "<div><b>x</div>",
    "fonts in divs": "<div><font face=a>x</div>",
    "fonts in paragraphs": "<p><font face=a>x</p>",
    "classed bold in divs, no text": "<div><b class=x></div>",
    "two bolds in divs": "<div><b><b>x</div>",
    "bold and italic in divs": "<div><b><i>x</div>",
    "font and bold in paragraphs": "<p><font face=a><b>x</p>",
    "bold in items": "<li><b>x</li>",
    "bold in headings": "<h3><b>x</h3>",
    "fonts in divs, then a paragraph": "<div><font face=a>x</div><p>y</p>",
}


@pytest.mark.parametrize("unit", list(_BLOCKS_LEFT_FORMATTED.values()), ids=list(_BLOCKS_LEFT_FORMATTED))
def test_formatting_elements_left_open_in_blocks_count_as_many_as_the_list_keeps(unit: str) -> None:
    page = unit * (nesting.DEFAULT_MAX_DEPTH + 1)
    assert real_depth(page) < 12
    assert estimate_depth(page.encode(), limit=DEPTH) < 12
    prune_html(page)  # (not refused)


# Where the parser does nest them: attributes that differ (the list keeps each), text between the blocks
# (it re-creates them outside the next block, which opens in them), a block that is no special element
# (its end tag leaves them open), or a cell outside any table (ignored, as its end tag).
_BLOCKS_NESTING = {
    "bold of other ids in divs": "".join(f"<div><b id={index}>x</div>" for index in range(1300)),
    "bold in divs, text between": "<div><b>x</div>x" * 1300,
    "bold in divs, a newline between": "<div><b>x</div>\n" * 1300,
    "bold in spans": "<span><b>x</span>" * 1300,
    "bold in divs, then an italic": "<div><b>x</div><i>" * 1300,
    "bold in divs, text and bold between": "<div><b>x</div>x<div><b>" * 1300,
    "fonts in stray cells": "<td><font face=a>x</td>" * 1300,
    "bold in divs, then one of other attributes": (
        "<div><b>x</div>" * 3 + "".join(f"<div><b>x</div><b id={index}>" for index in range(1300))
    ),
}


@pytest.mark.parametrize("page", list(_BLOCKS_NESTING.values()), ids=list(_BLOCKS_NESTING))
def test_formatting_elements_the_parser_nests_still_count(page: str) -> None:
    assert real_depth(page) > 2 * DEPTH
    assert estimate_depth(page.encode(), limit=DEPTH) > DEPTH
