"""jusText on a page whose language is unknown (none detected, or detected past the rank cutoff) runs in
its language-independent mode, as for a language it has no stoplist for, and reports no language: the
English stoplist that stood in kept 0 words of a Korean page, and an empty page was reported as "en"
where the documentation says null."""

from __future__ import annotations

import pytest
from resiliparse.parse.lang import detect_fast

from service.core.extract import InlineRunner, detect_language, extract
from service.core.extract.extractors import MAX_LANGUAGE_RANK, language_sample, stoplist_name

INLINE = InlineRunner()
# Korean prose the detector places as Korean, but past the cutoff: "unknown".
KOREAN = (
    "대한민국은 동아시아의 한반도 남부에 위치한 민주공화국이다. 수도는 서울특별시이며 국기는 태극기, "
    "국가는 애국가이다. 문단 {i}에서 우리는 역사와 문화를 이야기합니다."
)


def korean_page() -> str:
    """Paragraphs of three times the text above (about 260 characters: over jusText's 200, good alone)."""
    paragraphs = "".join(f"<p>{' '.join([KOREAN.format(i=i)] * 3)}</p>" for i in range(6))
    return f"<html><head><title>한국</title></head><body><article>{paragraphs}</article></body></html>"


def test_a_korean_page_ranked_past_the_cutoff_keeps_its_text() -> None:
    html = korean_page()
    language, rank = detect_fast(language_sample(html)[:4000])
    assert language == "ko" and rank > MAX_LANGUAGE_RANK  # what makes it unknown
    assert detect_language(language_sample(html)) is None
    out = extract(html, "justext", runner=INLINE)
    assert out.language is None and stoplist_name(out.language) is None
    assert out.words > 150 and "서울특별시이며" in out.text and out.passed
    # The English stoplist, which stood in for the unknown language, finds no stopword: nothing kept.
    assert extract(html, "justext", language="en", runner=INLINE).words == 0


@pytest.mark.parametrize(
    "html",
    [
        "<html><body></body></html>",
        "<html><body><div></div></body></html>",
        "<html><body><p> </p></body></html>",
        '<html><body><img src="a.png"></body></html>',
        "<html><head><title></title><script>var x = 1;</script></head><body></body></html>",
    ],
)
def test_a_page_without_text_reports_no_language(html: str) -> None:
    """`language` is null where no language is known (docs/extraction.md); it said "en"."""
    for result in (extract(html, "justext", runner=INLINE), extract(html, "union", runner=INLINE)):
        assert result.text == "" and result.words == 0
        assert result.language is None


def test_a_given_language_is_still_the_one_used() -> None:
    """Only an unknown language changed: a given one keeps its stoplist and is reported."""
    out = extract(korean_page(), "justext", language="ko", runner=INLINE)
    assert out.language == "ko" and out.words > 0
