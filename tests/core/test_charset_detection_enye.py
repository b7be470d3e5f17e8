"""service.core.charset_detection: undeclared Polish words with "ń" (windows-1250, iso-8859-2), which read
as windows-1252's "ñ" ("Gdañsk"), and the Spanish words that must keep windows-1252."""

from __future__ import annotations

import pytest

from service.core.decoding import decode_html

ENGLISH = "<html><body>" + (
    "<p>We spent the week walking around the old town and the river banks, looking at churches.</p>" * 8
)


@pytest.mark.parametrize("encoding", ["cp1250", "iso8859_2"])
@pytest.mark.parametrize(
    "word", ["Gdańsk", "Poznań", "Toruń", "Państwo", "Bezpieczeństwo", "mieszkań", "Smoleńsk"]
)
@pytest.mark.parametrize("head", ["", ENGLISH])
def test_a_polish_n_with_acute_before_a_consonant_or_a_word_end_keeps_its_reading(
    head: str, word: str, encoding: str
) -> None:
    """Windows-1252 reads "ń" as "ñ", a letter of Spanish as "ń" is of Polish, and won the tie; but the
    languages written with "ñ" (Spanish, Basque, Galician, Filipino, Guarani) put a vowel after it."""
    page = f"{head}<p>See {word} here.</p>"
    assert decode_html(page.encode(encoding)).text == page


@pytest.mark.parametrize(
    "text", ["España", "ESPAÑA", "Peñón", "Ñuble", "año", "la letra ñ", "Muñoz", "niño", "Señor Ibáñez"]
)
@pytest.mark.parametrize("head", ["", ENGLISH])
def test_spanish_n_with_tilde_keeps_windows_1252(head: str, text: str) -> None:
    """Before a vowel, accented or capital too, or standing alone."""
    page = f"{head}<p>See {text} here.</p>"
    decoded = decode_html(page.encode("cp1252"))
    assert (decoded.text, decoded.encoding) == (page, "cp1252")
