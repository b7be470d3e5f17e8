"""Content-Type values (`service.core.media_types`): one value as HTTP sends it, a list as Fetch reads it."""

from __future__ import annotations

import pytest

from service.core.media_types import essences, extract_media_type, parse_content_type, split_values


@pytest.mark.parametrize(
    "value, expected",
    [
        ("text/html; charset=koi8-r", ("text/html", "koi8-r")),
        ('TEXT/HTML; Charset="Windows-1250"', ("text/html", "Windows-1250")),
        ("text/html", ("text/html", None)),
        ("nonsense", ("text/plain", None)),  # the email parser's reading of what it cannot parse
    ],
)
def test_one_value_is_read_as_http_sends_it(value: str, expected: tuple[str, str | None]) -> None:
    assert parse_content_type(value) == expected == extract_media_type(value)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("text/html, text/html; charset=koi8-r", ("text/html", "koi8-r")),  # the last one's own
        ("text/html; charset=koi8-r, text/html", ("text/html", "koi8-r")),  # carried from the run's first
        ("text/html; charset=a, text/html; charset=b, text/html", ("text/html", "a")),  # Fetch's quirk
        ("text/html; charset=koi8-r, application/xhtml+xml", ("application/xhtml+xml", None)),  # a new run
        ("text/html; charset=a, text/plain, text/html", ("text/html", None)),  # the run starts over
        ('text/html; foo="a, b"; charset=koi8-r', ("text/html", "koi8-r")),  # a quoted comma
        ("*/*, nonsense, , TEXT/HTML;charset=koi8-r", ("text/html", "koi8-r")),  # skipped values
        ("nonsense, more", ("text/plain", None)),  # no valid value: as one value
    ],
)
def test_a_list_is_read_as_fetch_extracts_a_mime_type(value: str, expected: tuple[str, str | None]) -> None:
    assert extract_media_type(value) == expected


def test_values_split_at_commas_outside_quotes() -> None:
    assert split_values('a/b; x="1,\\"2", c/d ,e/f') == ['a/b; x="1,\\"2"', "c/d", "e/f"]
    assert essences(split_values("Text/HTML, */*, x, text/html; a=b, application/json")) == [
        "text/html",
        "application/json",
    ]
