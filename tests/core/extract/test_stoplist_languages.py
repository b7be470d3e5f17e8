"""Every stoplist jusText ships whose language has an ISO 639-1 code can be chosen: `language="nn"`,
`"nb"`, `"bs"`, `"ms"`, ... were refused as languages "jusText has no stoplist for", though it has. The
codes added are ones the detector never returns, so no detected page gets another stoplist."""

from __future__ import annotations

import json
from pathlib import Path

import justext
import pytest
from resiliparse.parse.lang import supported_langs

from service.cli import main
from service.core.extract import InlineRunner, extract, normalize_language
from service.core.extract.extractors import JUSTEXT_STOPLISTS, run_justext, stoplist_name
from tests.core.test_extract import page

INLINE = InlineRunner()
# The codes only a caller can give, and the stoplists no ISO 639-1 code names (Simple_English and
# Belarusian_Taraskievica are variants of en and be; Western_Panjabi is Shahmukhi, the detector's "pa"
# Gurmukhi).
GIVEN_ONLY = {
    "an": "Aragonese",
    "bs": "Bosnian",
    "ht": "Haitian",
    "ig": "Igbo",
    "ms": "Malay",
    "nb": "Norwegian_Bokmal",
    "nn": "Norwegian_Nynorsk",
    "oc": "Occitan",
    "qu": "Quechua",
    "sh": "Serbo_Croatian",
    "su": "Sundanese",
    "wa": "Walloon",
    "yo": "Yoruba",
}
WITHOUT_ISO_639_1 = {
    "Aromanian",
    "Asturian",
    "Belarusian_Taraskievica",
    "Bishnupriya_Manipuri",
    "Cebuano",
    "Lombard",
    "Low_Saxon",
    "Neapolitan",
    "Newar",
    "Piedmontese",
    "Samogitian",
    "Sicilian",
    "Simple_English",
    "Waray_Waray",
    "Western_Panjabi",
}
NYNORSK = [
    "Kommunestyret i bygda har vedteke eit nytt budsjett for dei offentlege biblioteka i heile kommunen.",
    "Det er ikkje lenge sidan dei fleste av husa i sentrum vart bygde opp att etter den store brannen.",
    "Om sommaren kjem det mange turistar hit for å sjå fjorden og dei gamle husa ved kaia.",
    "Skulen i bygda har fått nye datamaskiner, og elevane lærer no å skrive program sjølve.",
]


def test_every_stoplist_with_an_iso_639_1_code_is_mapped_and_named_as_jusText_ships_it() -> None:
    shipped = set(justext.get_stoplists())
    assert set(JUSTEXT_STOPLISTS.values()) <= shipped
    assert shipped - set(JUSTEXT_STOPLISTS.values()) == WITHOUT_ISO_639_1
    assert {code: JUSTEXT_STOPLISTS.get(code) for code in GIVEN_ONLY} == GIVEN_ONLY


def test_the_codes_added_are_none_the_detector_returns_so_detection_keeps_its_stoplists() -> None:
    detected = {str(code) for code in supported_langs()}
    assert not set(GIVEN_ONLY) & detected
    assert "pa" in detected and stoplist_name("pa") is None  # Gurmukhi: not Western_Panjabi (Shahmukhi)
    assert any("\u0600" <= c <= "\u06ff" for word in justext.get_stoplist("Western_Panjabi") for c in word)


@pytest.mark.parametrize("code", sorted(GIVEN_ONLY))
def test_a_code_with_a_stoplist_is_taken(code: str) -> None:
    assert normalize_language(code) == code
    assert normalize_language(f"{code.upper()}-XX") == code
    assert stoplist_name(code) == GIVEN_ONLY[code]


def test_nynorsk_is_judged_with_the_nynorsk_stoplist() -> None:
    html = page("".join(f"<p>{' '.join(NYNORSK[i:] + NYNORSK[:i])}</p>" for i in range(4)))
    out = run_justext(html, "nn")
    assert out.language == "nn" and NYNORSK[0] in out.text
    result = extract(html, "justext", language="NN", runner=INLINE)
    assert result.passed and result.language == "nn"


def test_cli_language_option_takes_a_code_with_a_stoplist(tmp_path: Path) -> None:
    html = page("".join(f"<p>{' '.join(NYNORSK[i:] + NYNORSK[:i])}</p>" for i in range(4)))
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "nn", "html": html}) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["extract", "--input", str(source), "--output", str(out), "--workers", "1", "--no-progress"]
    assert main([*argv, "--extractor", "justext", "--language", "nn"]) == 0
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert row["language"] == "nn" and NYNORSK[0] in row["text"]
