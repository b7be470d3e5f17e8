"""`htmllm extract --output out.jsonl.gz` wrote plain JSON under a gzip name (zcat refused it, while
`--input` reads a `.jsonl.gz` as gzip): a compressed file's name is a usage error before anything is
read or written."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from service.cli import main
from service.commands.options import COMPRESSED_SUFFIXES


def _args(source: Path, output: Path, *options: str) -> list[str]:
    return ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            *options]  # fmt: skip


def _error_rows(path: Path) -> Path:
    """A row with neither `html` nor `file`: an error row, so a run needs no extractor process."""
    path.write_text(json.dumps({"id": "r0"}) + "\n")
    return path


@pytest.mark.parametrize("name", ["out.jsonl.gz", "OUT.JSONL.GZ", "out.gz", "out.jsonl.zst", "out.jsonl.bz2"])
def test_an_output_named_as_a_compressed_file_is_a_usage_error_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    source = _error_rows(tmp_path / "in.jsonl")
    output = tmp_path / name
    for options in ([], ["--overwrite"]):
        assert main(_args(source, output, *options)) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"htmllm extract: validation_error: --output {output} names a compressed file")
        assert "plain JSONL" in err and err.count("\n") == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output, no parts, no lock


def test_the_refusal_comes_before_the_input_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing input is exit code 1 once the options are right; the output's name is a usage error first."""
    assert main(_args(tmp_path / "missing.jsonl", tmp_path / "out.jsonl.gz")) == 2
    assert "names a compressed file" in capsys.readouterr().err


def test_a_compressed_input_still_gives_a_plain_output(tmp_path: Path) -> None:
    """Only the output's name is checked: `--input x.jsonl.gz` is read as gzip, its rows written plain."""
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(gzip.compress(_error_rows(tmp_path / "rows.jsonl").read_bytes()))
    output = tmp_path / "out.jsonl"
    assert main(_args(source, output)) == 0
    (row,) = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert row["index"] == 0 and row["id"] == "r0" and "error" in row
    assert ".gz" in COMPRESSED_SUFFIXES and ".jsonl" not in COMPRESSED_SUFFIXES


def test_an_existing_file_is_refused_for_its_name_not_sent_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gzip file of the user's, or an earlier run's plain rows under a .gz name: --overwrite would not
    help, so the refusal is the name's, and the file is left as it was."""
    source = _error_rows(tmp_path / "in.jsonl")
    earlier = (
        json.dumps({"index": 0, "id": "old", "url": None, "error": {"code": "x", "message": "x"}}) + "\n"
    )
    for content in (gzip.compress(b'{"id": "mine"}\n'), earlier.encode()):
        output = tmp_path / "out.jsonl.gz"
        output.write_bytes(content)
        assert main(_args(source, output)) == 2
        err = capsys.readouterr().err
        assert "names a compressed file" in err and "--overwrite" not in err
        assert output.read_bytes() == content


def test_a_page_file_of_the_input_is_refused_as_that_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The more telling refusal wins: the run would have replaced a page of its own input."""
    site = tmp_path / "site"
    site.mkdir()
    page = site / "p1.html.gz"
    page.write_bytes(gzip.compress(b"<html><body><p>a page</p></body></html>"))
    assert main(_args(site, page)) == 2
    assert "is the input's page file" in capsys.readouterr().err
