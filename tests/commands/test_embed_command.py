"""`htmllm embed` and the page cap: a row over it is that row's error, payload_too_large, as the Engine
would have answered for the page (the rest of the command is tested in tests/engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.core import pages
from tests.factories.checkpoint import build_tiny_checkpoint


def test_a_row_over_the_cap_is_a_payload_too_large_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 1024)  # rows up to 4 KiB
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    lines = [
        json.dumps({"id": "a", "html": "<p>a few words</p>"}),
        json.dumps({"id": "long", "html": "x" * 10_000}),  # a row over the bound: read no further
        json.dumps({"id": "big", "html": "x" * 2000}),  # a page over the cap
        json.dumps({"id": "no-html"}),
    ]
    source = tmp_path / "pages.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(out)]
    assert main([*args, "--no-progress"]) == 0
    assert "(3 failed this run)" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["id"].to_pylist() == ["a", "1", "big", "no-html"]
    assert table["error"].to_pylist() == [None, "payload_too_large", "payload_too_large", "validation_error"]
    assert "line 2 has more than 4096 bytes" in table["error_message"][1].as_py()
