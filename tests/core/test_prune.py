"""service.core.prune: one test per rule of the paper and per documented decision."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from service.core.errors import ErrorCode
from service.core.prune import (
    KEEP_TAGS,
    PRUNE_VERSION,
    InputTooLargeError,
    InvalidInputError,
    NestingTooDeepError,
    PruneError,
    TooManyAttributesError,
    prune_html,
)


def body(html: str) -> str:
    """Prune a fragment placed in a page's body."""
    return prune_html(f"<html><head></head><body>{html}</body></html>")


# Rule 2: scripts, styles, comments and subtrees without text go.


def test_scripts_styles_and_comments_are_removed() -> None:
    out = body("<div><p>keep</p><script>var a = '<p>x</p>';</script><style>p{}</style><!-- note --></div>")
    assert out == "<p>keep</p>"


def test_subtrees_without_text_are_removed() -> None:
    assert body("<div><p>text</p><div><span> </span><b></b></div></div>") == "<p>text</p>"


# Rule 3: text and the tags around it stay; the keep list stays without text.


def test_text_keeps_its_ancestors() -> None:
    assert body("<div><p>a <b>b</b> c</p><p>d</p></div>") == "<div><p>a <b>b</b> c</p><p>d</p></div>"


BODY_KEEP_TAGS = sorted(KEEP_TAGS - {"td", "th", "tr", "col", "option", "frame", "svg", "iframe"})


@pytest.mark.parametrize("tag", BODY_KEEP_TAGS)
def test_keep_list_tags_survive_without_text(tag: str) -> None:
    out = body(f"<div><p>x</p><{tag}></{tag}></div>")
    assert f"<{tag}>" in out


def test_keep_list_tags_that_need_context() -> None:
    assert body("<table><tr><td></td><th></th></tr></table>") == (
        "<table><tbody><tr><td></td><th></th></tr></tbody></table>"
    )
    assert "<col>" in body("<table><colgroup><col><col></colgroup><tr><td>x</td></tr></table>")
    assert body("<select><option></option><option></option></select>") == (
        "<select><option></option><option></option></select>"
    )
    assert "<frame>" in prune_html("<html><frameset><frame src='a.html'></frameset></html>")


def test_a_kept_tag_keeps_its_ancestors() -> None:
    assert body("<div><p>x</p><div><img src='a.png'></div></div>") == "<div><p>x</p><img></div>"


# Rule 4: no attributes.


def test_attributes_are_stripped() -> None:
    out = body('<div class="a" id=b data-x=\'1\'><a href="/x" title="t">link</a> <p style="c">x</p></div>')
    assert out == "<div><a>link</a><p>x</p></div>"


# Rule 5: an element with one element child and no text of its own is replaced by it.


def test_single_child_chains_collapse() -> None:
    assert body("<div><section><article><p>deep</p></article></section></div>") == "<p>deep</p>"


def test_element_with_own_text_is_not_collapsed() -> None:
    assert body("<div>own <span>child</span></div>") == "<div>own <span>child</span></div>"


def test_element_with_two_children_is_not_collapsed() -> None:
    assert body("<div><p>a</p><p>b</p></div>") == "<div><p>a</p><p>b</p></div>"


def test_whitespace_of_a_collapsed_element_stays_between_words() -> None:
    assert body("<p><b>one</b><span> <i>two</i> </span></p>") == "<p><b>one</b> <i>two</i></p>"


def test_collapse_exceptions_keep_the_tree_reparseable() -> None:
    # Table structure is never replaced nor moved up.
    assert body("<table><tr><td>x</td></tr></table>") == "<table><tbody><tr><td>x</td></tr></tbody></table>"
    # A list item does not take its list's place (an <li> in an <li> would close it).
    assert (
        body("<ul><li>Menu<ul><li>Sub</li></ul></li></ul>") == "<ul><li>Menu<ul><li>Sub</li></ul></li></ul>"
    )
    # A heading is never replaced by its only child.
    assert body("<h2><a href='/'>Title</a></h2>") == "<h2><a>Title</a></h2>"


# Rule 6: whitespace.


def test_whitespace_runs_collapse_to_one_space() -> None:
    assert body("<p>a \n\t b&nbsp;&nbsp;c\u3000d</p>") == "<p>a b c d</p>"


def test_whitespace_next_to_block_tags_is_dropped() -> None:
    assert body("<div>\n  <p> a </p>\n  <p>b <b>c</b> <i>d</i></p>\n</div>") == (
        "<div><p>a</p><p>b <b>c</b> <i>d</i></p></div>"
    )


def test_nbsp_only_text_is_whitespace() -> None:
    assert body("<div><p>&nbsp;</p><p>x</p></div>") == "<p>x</p>"


# Decisions.


def test_title_is_kept_and_head_metadata_dropped() -> None:
    page = (
        "<html><head><title>The &amp; Title</title><meta name=x content=y><link rel=stylesheet>"
        "</head><body><p>a</p><p>b</p></body></html>"
    )
    assert prune_html(page) == "<html><title>The &amp; Title</title><body><p>a</p><p>b</p></body></html>"


def test_noscript_is_removed_with_its_content() -> None:
    assert body("<p>x</p><noscript><p>Please enable JavaScript</p><img src=t.gif></noscript>") == "<p>x</p>"
    assert prune_html("<html><head><noscript><img src=p.gif></noscript></head><body>t</body></html>") == (
        "<body>t</body>"
    )


def test_template_is_removed_with_its_content() -> None:
    assert body("<p>x</p><template><p>row <template>inner</template></p></template>") == "<p>x</p>"


def test_iframe_is_kept_empty() -> None:
    assert body("<p>x<iframe src=a><p>fallback</p></iframe></p>") == "<p>x<iframe></iframe></p>"


def test_svg_is_kept_empty() -> None:
    out = body("<p>x <svg viewBox='0 0 1 1'><g><text>label</text></g><svg><path/></svg>t</svg> y</p>")
    assert out == "<p>x <svg></svg> y</p>"


def test_entities_are_decoded_once_and_lt_gt_amp_escaped() -> None:
    assert body("<p>&amp;lt; &lt;b&gt; &quot;q&quot; &eacute; &#x263A; a&amp;b</p>") == (
        '<p>&amp;lt; &lt;b&gt; "q" é ☺ a&amp;b</p>'
    )


def test_tag_names_are_lowercase() -> None:
    assert body("<DIV><P>a</P><P>b</P></DIV>") == "<div><p>a</p><p>b</p></div>"


def test_hidden_elements_are_removed() -> None:
    out = body(
        "<p>shown</p><p hidden>h1</p><div style='color:red; DISPLAY: none'>h2</div>"
        "<span style='visibility:hidden'>h3</span><form><input type=hidden value=1></form>"
    )
    assert out == "<body><p>shown</p><form></form></body>"


def test_xmp_and_plaintext_become_pre() -> None:
    assert body("<xmp><b>x</b></xmp>") == "<pre>&lt;b&gt;x&lt;/b&gt;</pre>"
    # <plaintext> swallows the rest of the page, end tags included.
    assert (
        prune_html("<p>a</p><plaintext><i>y</body>")
        == "<body><p>a</p><pre>&lt;i&gt;y&lt;/body&gt;</pre></body>"
    )


def test_processing_instructions_are_removed() -> None:
    assert body("<p>a<?php echo 1; ?>b</p>") == "<p>ab</p>"


def test_empty_and_textless_pages_give_an_empty_string() -> None:
    assert prune_html("") == ""
    assert prune_html(b"") == ""
    assert prune_html("<html><head><meta charset=utf-8></head><body><div></div></body></html>") == ""


def test_a_text_file_is_its_text() -> None:
    assert prune_html(b"just some\nplain text & more\n") == "<body>just some plain text &amp; more</body>"


def test_bytes_in_a_legacy_encoding_are_decoded() -> None:
    page = '<meta charset="windows-1250"><p>Žluťoučký kůň</p>'.encode("cp1250")
    assert prune_html(page) == "<p>Žluťoučký kůň</p>"
    assert prune_html("<p>Žluťoučký kůň</p>".encode("iso-8859-2"), encoding="iso-8859-2") == (
        "<p>Žluťoučký kůň</p>"
    )


def test_output_is_deterministic_and_version_is_set() -> None:
    page = "<div><p>a</p><p>b <i>c</i></p></div>"
    assert prune_html(page) == prune_html(page) == prune_html(page.encode())
    assert PRUNE_VERSION


# Typed errors.


def test_input_over_the_byte_cap() -> None:
    with pytest.raises(InputTooLargeError) as exc:
        prune_html(b"<p>" + b"x" * 2000, max_bytes=1000)
    assert exc.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    with pytest.raises(InputTooLargeError):
        prune_html("<p>" + "é" * 600, max_bytes=1000)  # 1,203 UTF-8 bytes
    assert prune_html("<p>" + "é" * 400 + "</p>", max_bytes=1000)


def test_page_too_dense_for_the_memory_bound() -> None:
    with pytest.raises(InputTooLargeError):
        prune_html(b"<p>x" * 600_000)  # 2.4 MB of nothing but tags


def test_nesting_too_deep() -> None:
    with pytest.raises(NestingTooDeepError) as exc:
        prune_html("<div>" * 300 + "x", max_depth=200)
    assert exc.value.code is ErrorCode.PREPROCESS_FAILED
    assert prune_html("<div>" * 150 + "x", max_depth=200) == "<div>x</div>"


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nesting_estimate_ignores_raw_text_and_comments(as_bytes: bool) -> None:
    """`i<n` in an inline script or a `<div` in a comment is no start tag: such pages are not refused."""
    script = "<script>" + "if(i<n.length){x[i]=a<b}" * 200 + "</script>"
    page = "<div>" * 20 + script + "<!--" + "<div>" * 300 + "--><style>a<b{}</style>" + "<p>text</p>"
    data: str | bytes = page.encode() if as_bytes else page
    assert prune_html(data, max_depth=100) == "<p>text</p>"
    with pytest.raises(NestingTooDeepError):  # real nesting still counts, also after raw text
        prune_html(page + "<div>" * 300 + "x", max_depth=100)
    # An unclosed script runs to the end of the page, as the parser reads it.
    assert prune_html("<div>" * 20 + "<script>" + "<b" * 500, max_depth=100) == ""


def test_too_many_attributes() -> None:
    tag = "<div " + " ".join(f"a{i}" for i in range(5000)) + ">x</div>"
    with pytest.raises(TooManyAttributesError):
        prune_html(tag)
    # A long attribute value is one attribute.
    assert prune_html("<div data-json='" + "x" * 20000 + "'>y</div>") == "<div>y</div>"


def test_wrong_input_type() -> None:
    with pytest.raises(InvalidInputError) as exc:
        prune_html(42)  # type: ignore[arg-type]
    assert exc.value.code is ErrorCode.VALIDATION
    assert isinstance(exc.value, PruneError)
    assert prune_html(bytearray(b"<p>x</p>")) == "<p>x</p>"


def test_chunked_whitespace_collapse_equals_split_join(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from service.core import prune

    monkeypatch.setattr(prune, "_COLLAPSE_CHUNK", 7)
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(
            rng.choice(["a", "b", " ", "\n", "\u3000", "cc", "  "]) for _ in range(rng.randint(1, 40))
        )
        assert prune._collapse_in_chunks(text) == " ".join(text.split())


def test_cli_prints_the_pruned_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main

    page = tmp_path / "page.html"
    page.write_bytes('<meta charset="windows-1250"><div class=x><p>Žluťoučký kůň</p></div>'.encode("cp1250"))
    assert main(["prune", str(page)]) == 0
    assert capsys.readouterr().out == "<p>Žluťoučký kůň</p>\n"
    zipped = tmp_path / "page.html.gz"
    zipped.write_bytes(gzip.compress(page.read_bytes()))
    assert main(["prune", str(zipped)]) == 0
    assert capsys.readouterr().out == "<p>Žluťoučký kůň</p>\n"
    assert main(["prune", str(tmp_path / "missing.html")]) == 1
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "cut.html.gz").write_bytes(gzip.compress(page.read_bytes())[:-6])
    assert main(["prune", str(tmp_path / "cut.html.gz")]) == 1
    assert "cannot read" in capsys.readouterr().err
