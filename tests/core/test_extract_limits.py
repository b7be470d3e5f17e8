"""Pathological pages: structural limits refuse them before any extractor runs, and jusText's context
stage is linear with jusText's own results. Nothing here is timed: the refused pages never reach a
runner (a spy records what does), and the linear stage never calls jusText's quadratic one."""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass

import justext
import justext.core
import pytest
import trafilatura
import trafilatura.external

from service.core.errors import ErrorCode
from service.core.extract import (
    EXTRACTORS,
    LIMITS,
    Extraction,
    ExtractionError,
    ExtractorPool,
    PageTooComplexError,
    extract,
    extract_all,
)
from service.core.extract.extractors import RawOutput, run_justext, run_trafilatura
from service.core.extract.justext_revise import revise_paragraph_classification
from service.core.extract.limits import PageShape, check_page
from tests.core.test_extract import (
    GERMAN,
    SENTENCES,
    article,
    boilerplate_page,
    code_page,
    deep_page,
    page,
    pathological_page,
    table_page,
)
from tests.memory import traced_peak

# ---------------------------------------------------------------------------------------------------
# Generated pathological pages (each names the limit it crosses)


def br_page(lines: int = 60_000) -> str:
    """60,000 `<br>`-separated words (300 KB): over trafilatura's and jusText's 50,000 tags, which
    would take trafilatura over a second per 50,000 (1 MB of them took it 4 s)."""
    return "<html><body>" + "word<br>" * lines + "</body></html>" + article(4)


def libxml2_nesting_page(depth: int = 250, paragraphs: int = 10_000) -> str:
    """250 unclosed `<button>`s, then short paragraphs: an HTML5 parser (resiliparse) closes each button
    at the next, libxml2 (trafilatura, jusText) nests them, and each paragraph's work grows with the
    250 elements around it (100 KB of this took trafilatura 2.4 s, `<nobr>` took jusText 3 s)."""
    return "<html><body>" + "<button>" * depth + "<p>x\n" * paragraphs + "</body></html>"


def wide_row_page(cells: int = 6_000, per_row: int | None = None) -> str:
    """A table with `cells` cells in one row (or `per_row` to a row): trafilatura's table code is
    quadratic in the cells of one row (20,000 took it 1.3 s)."""
    per_row = per_row or cells
    rows = "".join("<tr>" + "<td>x" * per_row for _ in range(cells // per_row))
    return f"<html><body><table>{rows}</table></body></html>"


def nested_table_row_page(cells: int = 5_100) -> str:
    """One outer row of `cells` cells, each holding a table of its own rows: the inner `<tr>`s start
    rows of the inner tables, not of the outer one."""
    cell = "<td><table><tr><td>y</td></tr></table></td>"
    return f"<html><body><table><tr>{cell * cells}</tr></table></body></html>"


@dataclass
class SpyRunner:
    """A runner that records which extractors reached it and answers 60 words without running them."""

    ran: list[str]

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput:
        self.ran.append(name)
        return RawOutput("word " * 60, "en" if name == "justext" else None)


def spy() -> SpyRunner:
    return SpyRunner([])


# ---------------------------------------------------------------------------------------------------
# The limits


@pytest.mark.parametrize(
    ("html", "refused_by", "message"),
    [
        (br_page(), {"trafilatura", "justext"}, "tags, over the 50,000"),
        (libxml2_nesting_page(), {"trafilatura", "justext"}, "work grows with depth x tags"),
        (wide_row_page(), {"trafilatura"}, "a table row has over 5,000 cells"),
        (nested_table_row_page(), {"trafilatura"}, "a table row has over 5,000 cells"),
        (deep_page(4_000), set(EXTRACTORS), "nests over"),
    ],
    ids=["br", "libxml2-nesting", "wide-row", "nested-tables-row", "deep"],
)
def test_pathological_pages_are_refused_before_any_runner_sees_them(
    html: str, refused_by: set[str], message: str
) -> None:
    runner = spy()
    results = extract_all(html, runner=runner)
    assert set(runner.ran) == set(EXTRACTORS) - refused_by
    for name, result in results.items():
        if name in refused_by:
            assert isinstance(result, PageTooComplexError), (name, result)
            assert isinstance(result, ExtractionError) and result.code == ErrorCode.EXTRACTION_FAILED
            assert result.message.startswith(f"{name} refused the page: ") and message in result.message
        else:
            assert isinstance(result, Extraction) and result.passed


def test_rows_of_a_few_cells_and_ordinary_pages_pass_every_limit() -> None:
    big_article = page("<main>" + "".join(f"<div><p>{SENTENCES[i % 12]}</p></div>" for i in range(9_000)))
    for html in (
        wide_row_page(6_000, per_row=10),
        table_page(),
        code_page(),
        boilerplate_page(),
        big_article,
        pathological_page(),
    ):
        runner = spy()
        extract_all(html, runner=runner)
        assert runner.ran == list(EXTRACTORS)


def test_a_refusal_is_an_attempt_the_union_skips_like_any_failure() -> None:
    runner = spy()
    result = extract(br_page(), order=["trafilatura", "resiliparse"], runner=runner)
    assert runner.ran == ["resiliparse"]
    assert result.extractor == "resiliparse" and result.passed
    refused = result.attempts[0]
    assert (refused.extractor, refused.words, refused.passed, refused.timed_out) == (
        "trafilatura",
        0,
        False,
        False,
    )
    assert refused.error is not None
    assert re.fullmatch(
        r"trafilatura refused the page: it has 60,0\d\d tags, over the 50,000 .*", refused.error
    )
    with pytest.raises(PageTooComplexError, match=r"^trafilatura refused the page"):
        extract(br_page(), "trafilatura", runner=runner)


def test_a_page_every_extractor_refuses_costs_no_worker() -> None:
    with ExtractorPool(1) as pool:
        with pytest.raises(PageTooComplexError, match=r"^every extractor refused the page: resiliparse"):
            extract(deep_page(4_000), runner=pool)
        assert pool.live_workers == 0  # no worker was even started


def test_libxml2_only_nesting_counts_open_elements_of_those_names() -> None:
    assert PageShape("<button><nobr><wbr><embed>x").libxml2_extra_depth == 4
    assert PageShape("<button>a</button><BUTTON>b</button>" * 50).libxml2_extra_depth == 1
    assert PageShape("</caption>" * 10 + "<caption>x").libxml2_extra_depth == 1  # stray end tags
    assert PageShape("<buttons><nobreak>").libxml2_extra_depth == 0  # other names


def test_row_cells_follow_rows_and_nested_tables() -> None:
    assert PageShape("<table><td>a<td>b<tr><td>c</table>").row_cells(100) == 2  # cells before a <tr>
    assert PageShape("<TABLE><TR><TD>a<TH>b<TD>c</TABLE>").row_cells(100) == 3
    inner = "<table><tr><td>1<td>2<td>3<td>4</table>"
    assert PageShape(f"<table><tr><td>{inner}<td>x</table>").row_cells(100) == 4
    assert PageShape(f"<table><tr>{'<td>x' * 50}</table>").row_cells(10) == 11  # stops past the limit


# The scans as they were (a list of every matching tag, end tags included): the reference for the counts.
_ALL_LIBXML2_TAGS = re.compile(r"<(/?)(thead|tfoot|caption|nobr|button|embed|wbr)(?=[\t\n\f\r />])", re.I)
_ALL_TABLE_TAGS = re.compile(r"<(/?)(table|tr|td|th)(?=[\t\n\f\r />])", re.IGNORECASE)


def listed_libxml2_depth(text: str) -> int:
    open_elements: dict[str, int] = {}
    depth = most = 0
    for slash, name in _ALL_LIBXML2_TAGS.findall(text):
        name = name.lower()
        if slash:
            if open_elements.get(name):
                open_elements[name] -= 1
                depth -= 1
        else:
            open_elements[name] = open_elements.get(name, 0) + 1
            depth += 1
            most = max(most, depth)
    return most


def listed_row_cells(text: str, limit: int) -> int:
    rows, most = [0], 0
    for slash, name in _ALL_TABLE_TAGS.findall(text):
        name = name.lower()
        if name == "table":
            if not slash:
                rows.append(0)
            elif len(rows) > 1:
                rows.pop()
        elif name == "tr":
            if not slash:
                rows[-1] = 0
        elif not slash:
            rows[-1] += 1
            if rows[-1] > most:
                most = rows[-1]
                if most > limit:
                    break
    return most


def test_structure_scans_count_as_a_scan_of_every_tag_on_random_tag_soup() -> None:
    # Case-folded names ("captıon" matches caption under re.IGNORECASE) and stray end tags included.
    names = ["thead", "tfoot", "caption", "captıon", "CAPTİON", "Nobr", "BUTTON", "embed", "wbr"]
    names += ["table", "TR", "td", "th", "div", "tablex"]
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(
            rng.choice(["<", "</"]) + rng.choice(names) + rng.choice([">", " ", "/", "x", "\t"])
            for _ in range(rng.randint(0, 30))
        )
        limit = rng.randint(0, 6)
        assert PageShape(text).libxml2_extra_depth == listed_libxml2_depth(text), text
        assert PageShape(text).row_cells(limit) == listed_row_cells(text, limit), (text, limit)


@pytest.mark.parametrize(
    ("scan", "page", "expected"),
    [
        ("libxml2", "<p>x" * 2000 + "</wbr>" * 400_000, 0),
        ("libxml2", "<wbr>" + "</nobr>" * 400_000, 1),  # end tags of a name that is not open
        ("cells", "<table><tr>" + "<td>x" * 6000 + "</td>" * 400_000, 5001),
        ("cells", "<td>x" * 100 + "</table>" * 400_000, 100),  # </table> outside any table
    ],
)
def test_structure_scans_hold_no_match_per_end_tag(scan: str, page: str, expected: int) -> None:
    # End tags that change nothing were each a match kept in a list: 364 MB for a 16 MiB page of
    # `</wbr>`, in the server process. 400,000 of them made about 40 MB.
    shape = PageShape(page)
    found, peak = traced_peak(
        lambda: shape.libxml2_extra_depth if scan == "libxml2" else shape.row_cells(5000)
    )
    assert found == expected
    assert peak < 4 * 1024 * 1024


def test_limits_name_every_extractor() -> None:
    assert set(LIMITS) == set(EXTRACTORS)
    for name in EXTRACTORS:
        check_page(name, PageShape(table_page()))  # raises nothing


# ---------------------------------------------------------------------------------------------------
# jusText's context-sensitive stage in linear time


class _Paragraph:
    def __init__(self, text: str, cf_class: str, class_type: str, heading: bool) -> None:
        self.text, self.cf_class, self.class_type, self.heading = text, cf_class, class_type, heading


def test_linear_revision_gives_justexts_classes_on_random_paragraph_sequences() -> None:
    rng = random.Random(20261205)
    classes = ["short", "good", "bad", "neargood"]
    for _ in range(4_000):
        weights = [rng.random() for _ in classes]
        paragraphs = [
            _Paragraph(
                "x" * rng.choice([1, 3, 10, 50, 120, 250]),
                rng.choices(classes, weights)[0],
                # jusText's first stage reads class_type before it is set: any prior value matters
                rng.choice(["", "", "good", "short", "bad", "neargood", "other"]),
                rng.random() < 0.3,
            )
            for _ in range(rng.randint(0, 30))
        ]
        distance = rng.choice([0, 5, 60, 200])
        theirs, ours = copy.deepcopy(paragraphs), copy.deepcopy(paragraphs)
        justext.core.revise_paragraph_classification(theirs, distance)
        revise_paragraph_classification(ours, distance)
        assert [p.class_type for p in ours] == [p.class_type for p in theirs]


def _justext_text(html: str, stoplist: str) -> str:
    paragraphs = justext.justext(html, justext.get_stoplist(stoplist))
    return "\n".join(p.text for p in paragraphs if not p.is_boilerplate).strip()


def test_justext_runs_its_pipeline_with_the_linear_stage_and_keeps_its_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    headings = page(
        "".join(f"<h2>Part {i}</h2><p>{SENTENCES[i % 12]}</p><p>Short.</p>{article(1, i)}" for i in range(8))
        + "<h3>Links</h3>"
        + "".join(f'<p><a href="/{i}">link {i}</a></p>' for i in range(5))
    )
    short_run = "<html><body>" + "<p>x\n" * 1_000 + article(3) + "<p>y\n" * 1_000 + "</body></html>"
    german = page(f"<article><h1>Die Stadt</h1>{article(5, sentences=GERMAN)}</article>")
    pages = [(table_page(), "English"), (boilerplate_page(), "English"), (headings, "English")]
    pages += [(short_run, "English"), (german, "German")]
    expected = [_justext_text(html, stoplist) for html, stoplist in pages]
    assert any(expected) and all(len(text.split()) > 0 for text in expected[:3])

    def quadratic(*_: object, **__: object) -> None:
        raise AssertionError("jusText's quadratic revise_paragraph_classification was called")

    monkeypatch.setattr(justext.core, "revise_paragraph_classification", quadratic)
    language = {"English": "en", "German": "de"}
    for (html, stoplist), text in zip(pages, expected, strict=True):
        assert run_justext(html, language[stoplist]).text == text
    # The page the audit found quadratic (20,000 `<p>x`, 31 s before): no quadratic stage runs now.
    assert run_justext("<html><body>" + "<p>x\n" * 20_000 + "</body></html>", "en").text == ""


def test_trafilatura_falls_back_on_the_linear_stage_with_the_same_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """trafilatura runs jusText's classification when its own text is short: on 10,000 one-item lists
    (190 KB, 20,000 tags) the quadratic stage took it 7.3 s."""
    html = "<html><body>" + "<ul><li>x</li></ul>" * 1_500 + "</body></html>"
    calls: list[int] = []

    def library(paragraphs: list[object], *args: object) -> None:
        calls.append(len(paragraphs))
        justext.core.revise_paragraph_classification(paragraphs, *args)

    monkeypatch.setattr(trafilatura.external, "revise_paragraph_classification", library)
    expected = (trafilatura.extract(html, include_tables=True) or "").strip()
    assert calls == [1_500] and expected.split() == ["x"] * 1_500  # the fallback ran and decided
    assert run_trafilatura(html).text == expected
    assert calls == [1_500]  # not again: trafilatura now calls the linear stage
    assert trafilatura.external.revise_paragraph_classification is revise_paragraph_classification
