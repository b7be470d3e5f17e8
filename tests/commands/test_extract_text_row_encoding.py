"""`htmllm extract`: a JSONL row's `html` text reports the encoding /v1/extract's JSON route reports."""

from __future__ import annotations

import json
from pathlib import Path

from service.cli import main
from service.core.extract import extract


def test_a_row_given_as_text_reports_utf8_as_the_json_route_does(tmp_path: Path) -> None:
    """An ASCII page whose <meta> names windows-1252 reads the same either way, so the reader kept its
    UTF-8 bytes and the parser, following the <meta>, reported cp1252; the route, given the same JSON
    string, reports utf-8 (`decode_html` of a str)."""
    html = (
        '<html><head><meta charset="windows-1252"></head><body><p>'
        + "caf&eacute; word " * 40
        + "</p></body></html>"
    )
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "html": html}) + "\n")
    out = tmp_path / "out.jsonl"
    assert (
        main(
            [
                "extract",
                "--input",
                str(tmp_path / "in.jsonl"),
                "--output",
                str(out),
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["encoding"] == "utf-8" == extract(html, "resiliparse").encoding
