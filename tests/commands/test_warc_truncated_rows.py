"""`warc_truncated` in `htmllm extract`'s and `htmllm embed`'s rows (row formats 10 and 6): the record's
WARC-Truncated (`length`, `time`, `disconnect`...), null for a whole record and any other page, so a
curator can tell a page the crawler cut short from a whole one; an output or run of the format before is
never taken for one of this format. And --memory-limit-mb, which decides whether an extraction fails, is
pinned in `htmllm extract`'s run.json as --timeout-s is: a resume under another limit had mixed two
runs' failures in one output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.commands import embed as embed_command
from service.commands import extract as extract_command
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.cli import stop_before_merge
from tests.factories.pages import make_pages
from tests.factories.warc import HttpResponse, response, warc_gz, warc_record


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("truncated") / "tiny")


def _crawl(path: Path) -> Path:
    """A whole page, one cut at its length, one cut in time whose gzip body is corrupt (an error row),
    and an HTML resource record cut by a disconnect."""
    page = make_pages(1, seed=7, min_words=20, max_words=40)[0].encode()
    records = [
        response("whole", HttpResponse(page, "text/html; charset=utf-8")),
        warc_record("length", HttpResponse(page).block(), extra={"WARC-Truncated": "length"}),
        warc_record(
            "time",
            HttpResponse(b"not gzip", headers={"Content-Encoding": "gzip"}).block(),
            extra={"WARC-Truncated": "time"},
        ),
        warc_record(
            "res",
            page,
            record_type="resource",
            content_type="text/html",
            extra={"WARC-Truncated": "disconnect"},
        ),
    ]
    path.write_bytes(warc_gz(records))
    return path


TRUNCATED = [None, "length", "time", "disconnect"]


def _embed_args(checkpoint: Path, source: Path, output: Path, *options: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1", *options]  # fmt: skip


def _extract_args(source: Path, output: Path, *options: str) -> list[str]:
    return ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            *options]  # fmt: skip


def test_extract_rows_end_with_warc_truncated(tmp_path: Path) -> None:
    output = tmp_path / "texts.jsonl"
    assert main(_extract_args(_crawl(tmp_path / "crawl.warc.gz"), output)) == 0
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    names = ("whole", "length", "time", "res")
    assert [row["id"] for row in rows] == [f"<urn:uuid:{name}>" for name in names]
    assert [row["warc_truncated"] for row in rows] == TRUNCATED
    assert "error" in rows[2] and "error" not in rows[1]  # an error row of a cut record says it too
    assert all(list(row)[-1] == "warc_truncated" for row in rows)  # last: `_ROW_START` still matches
    assert extract_command._ROW_START.match(output.read_bytes())


def test_extract_rows_of_other_pages_have_a_null_warc_truncated(tmp_path: Path) -> None:
    """A JSONL row's own `warc_truncated` is its writer's word, never a record this run read."""
    source = tmp_path / "pages.jsonl"
    html = make_pages(1, seed=9, min_words=20, max_words=40)[0]
    row = {"id": "a", "html": html, "warc_file": "c.warc.gz", "warc_truncated": "length"}
    source.write_text(json.dumps(row) + "\n", encoding="utf-8")
    output = tmp_path / "texts.jsonl"
    assert main(_extract_args(source, output)) == 0
    assert json.loads(output.read_text(encoding="utf-8"))["warc_truncated"] is None


def test_embed_rows_carry_warc_truncated(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    assert main(_embed_args(checkpoint, _crawl(tmp_path / "crawl.warc.gz"), out)) == 0
    table = pq.read_table(out)
    assert table.column_names[:6] == ["index", "id", "url", "http_status", "content_type", "warc_truncated"]
    assert str(table.schema.field("warc_truncated").type) == "string"
    assert table["warc_truncated"].to_pylist() == TRUNCATED
    assert table["error"].to_pylist() == [None, None, "validation_error", None]


def test_a_head_named_warc_truncated_is_refused() -> None:
    from service.commands.options import OptionError
    from service.core.modeling import HeadSpec

    with pytest.raises(OptionError, match="would write a column 'warc_truncated'"):
        embed_command._check_columns([HeadSpec(name="warc_truncated", kind="regression", hidden=16)])


def _set_pin(path: Path, **values: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **values}))


def test_an_embed_output_or_run_without_warc_truncated_is_refused(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output or interrupted run of format 5 has no `warc_truncated`: never complete, nor resumed."""
    source = _crawl(tmp_path / "crawl.warc.gz")
    out = tmp_path / "out.parquet"
    args = _embed_args(checkpoint, source, out)
    assert main(args) == 0
    table = pq.read_table(out)
    metadata = dict(table.schema.metadata)
    metadata[b"htmllm.run"] = json.dumps({**json.loads(metadata[b"htmllm.run"]), "row_format": 5}).encode()
    pq.write_table(table.replace_schema_metadata(metadata), out)
    capsys.readouterr()
    assert main(args) == 1
    assert f"was written with other settings (row_format 5 -> {embed_command.ROW_FORMAT})" in (
        capsys.readouterr().err
    )
    out.unlink()
    stop_before_merge(monkeypatch, args)
    _set_pin(tmp_path / "out.parquet.parts" / "run.json", row_format=5)
    capsys.readouterr()
    assert main(args) == 1
    assert f"holds a run with other settings (row_format 5 -> {embed_command.ROW_FORMAT})" in (
        capsys.readouterr().err
    )


def _unreadable_rows(path: Path, count: int) -> Path:
    """JSONL rows with neither `html` nor `file`: error rows, which no extractor process is started for."""
    path.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(count)))
    return path


def test_an_extract_run_without_warc_truncated_is_not_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _extract_args(_unreadable_rows(tmp_path / "pages.jsonl", 3), tmp_path / "texts.jsonl")
    stop_before_merge(monkeypatch, [*args, "--part-size", "1"], "extract")
    _set_pin(tmp_path / "texts.jsonl.parts" / "run.json", row_format=9)
    capsys.readouterr()
    assert main([*args, "--part-size", "1"]) == 1
    expected = f"holds a run with other settings (row_format 9 -> {extract_command.ROW_FORMAT}); delete it"
    assert expected in capsys.readouterr().err


def test_extract_pins_the_memory_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume under another --memory-limit-mb is refused, as one under another --timeout-s is: the
    limit decides which pages fail. --workers, which decides no row, may change."""
    output = tmp_path / "texts.jsonl"
    args = _extract_args(_unreadable_rows(tmp_path / "pages.jsonl", 4), output, "--part-size", "1")
    stop_before_merge(monkeypatch, args, "extract")
    parts = tmp_path / "texts.jsonl.parts"
    assert json.loads((parts / "run.json").read_text())["memory_limit_mb"] == 2048
    capsys.readouterr()
    assert main([*args, "--memory-limit-mb", "4096"]) == 1
    assert capsys.readouterr().err == (
        f"htmllm extract: validation_error: {parts} holds a run with other settings (memory_limit_mb 2048 "
        "-> 4096); delete it, or pass --overwrite, to start over\n"
    )
    assert main([*args, "--memory-limit-mb", "2048", "--workers", "2"]) == 0
    assert "4 of them done by the interrupted run" in capsys.readouterr().err
    assert len(output.read_text().splitlines()) == 4
