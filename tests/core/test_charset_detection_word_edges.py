"""service.core.charset_detection: undeclared windows-1252 symbols that touch a word ("£££Expensive",
"¡¡Hola", "«Leben"), which other Latin readings made a letter of it ("ŁŁŁExpensive", "ĄĄHola",
"ŤLeben"), and the Central European and Cyrillic words at a word's edge that must keep their reading."""

from __future__ import annotations

import pytest

from service.core import charset_detection
from service.core.decoding import decode_html
from service.core.prune import prune_html

ENGLISH = "<html><body>" + (
    "<p>We spent the week walking around the old town and the river banks, looking at churches.</p>" * 8
)


@pytest.mark.parametrize(
    "text",
    [
        "£££Expensive", "££Price", "Price: £££Expensive, ££Cheap", "¡¡Hola", "¡¡Hola!!", "¡Hola",
        "««Title»»", "«Leben", "«Du bist nicht»", "«Tagblatt»",
    ],
)  # fmt: skip
@pytest.mark.parametrize("head", ["", ENGLISH])
def test_a_symbol_touching_a_word_is_windows_1252(head: str, text: str) -> None:
    """Read as windows-1250 or iso-8859-2 ("ŁŁŁExpensive", "ĄĄHola", "ŤLeben", "ŤŤTitleťť") before: a
    doubled letter at a word's edge, or a capital before a capitalised word, is no language's."""
    page = f"{head}<p>See {text} here.</p>"
    decoded = decode_html(page.encode("cp1252"))
    assert (decoded.text, decoded.encoding) == (page, "cp1252")


def test_the_pruned_page_keeps_the_symbols() -> None:
    """What `htmllm prune -` printed: "ŁŁŁExpensive"."""
    pruned = prune_html("<p>The Old Bell: price range £££Expensive, open daily.</p>".encode("cp1252"))
    assert "price range £££Expensive, open daily." in pruned


@pytest.mark.parametrize(
    ("encoding", "text"),
    [
        ("cp1250", "ŁKS Łódź"), ("cp1250", "ŠKODA"), ("cp1250", "Żywiec"), ("iso8859_2", "Ťažký"),
        ("cp1250", "Łza"), ("cp1251", "ООО Ромашка"), ("cp1251", "її пісні"), ("cp1252", "¿¿Qué??"),
        ("cp1252", "Öö"), ("cp1252", "ÄÄ"), ("cp1254", "10:30 ÖÖ"), ("cp1257", "Šī lapa"),
    ],
)  # fmt: skip
def test_capitals_and_doubled_letters_of_real_words_keep_their_reading(encoding: str, text: str) -> None:
    """A non-ASCII capital that starts a word, in capitals or not, and doubled letters (bytes 0xC0-0xFF,
    letters in windows-1252 too, which are never collapsed)."""
    page = f"{ENGLISH}<p>See {text} here.</p>"
    assert decode_html(page.encode(encoding)).text == page


def test_a_run_touching_a_word_is_judged_as_the_symbol_alone() -> None:
    """The single-byte readings see the run once, between spaces: neither a letter beside a word
    ("ŁExpensive") nor a doubled one."""
    sample = "a ££Price, Price»» x££y".encode("cp1252")
    assert charset_detection._symbol_runs_once(sample) == "a  £ Price, Price »  x££y".encode("cp1252")
