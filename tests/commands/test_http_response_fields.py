"""`http_status` and `content_type` in `htmllm embed`'s rows and `htmllm extract`'s: a WARC page's HTTP
status and Content-Type, null for any other page, so 404 bodies and empty redirects can be filtered out
of a crawl's rows afterwards (they had neither, and an empty 301 was embedded as a 2-token document)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.commands import embed as embed_command
from service.commands import extract as extract_command
from service.core.modeling import HeadSpec
from service.core.pages import Page
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.cli import stop_before_merge
from tests.factories.pages import make_pages
from tests.factories.warc import HttpResponse, response, warc_gz, warc_record


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("http") / "tiny")


def _crawl(path: Path) -> Path:
    """A WARC of a 200 page, a 404 page, a 301 with an empty body, a 302 with neither a body nor a
    Content-Type (it had been no row at all), an HTML resource record (no HTTP response: no status) and
    a 200 whose gzip body is corrupt (an error row)."""
    page = make_pages(1, seed=7, min_words=20, max_words=40)[0].encode()
    not_found = b"<html><body><h1>Not Found</h1><p>The page you asked for is gone.</p></body></html>"
    moved = {"Location": "https://example.com/new"}
    records = [
        response("ok", HttpResponse(page, "text/html; charset=utf-8"), "https://example.com/ok"),
        response("gone", HttpResponse(not_found, "text/html", status="404 Not Found")),
        response("moved", HttpResponse(b"", "text/html", status="301 Moved Permanently", headers=moved)),
        response("found", HttpResponse(b"", None, status="302 Found", headers=moved)),
        warc_record("res", b"<p>a stored resource</p>", record_type="resource", content_type="text/html"),
        response("bad", HttpResponse(b"not gzip", "text/html", headers={"Content-Encoding": "gzip"})),
    ]
    path.write_bytes(warc_gz(records))
    return path


STATUSES = [200, 404, 301, 302, None, 200]
CONTENT_TYPES = ["text/html; charset=utf-8", "text/html", "text/html", None, "text/html", "text/html"]


def _jsonl_claiming_a_response(path: Path) -> Path:
    """Rows with fields of their own named like the columns, one with a `warc_file` too (as a dump of
    crawl records may carry): the row's word, never a response this run read."""
    pages = make_pages(2, seed=9, min_words=20, max_words=40)
    rows = [
        {"id": "a", "html": pages[0], "http_status": 404, "content_type": "text/plain"},
        {"id": "b", "html": pages[1], "warc_file": "crawl.warc.gz", "http_status": 301, "content_type": "x"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _embed_args(checkpoint: Path, source: Path, output: Path, *options: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1", *options]  # fmt: skip


def _extract_rows(source: Path, output: Path) -> list[dict[str, Any]]:
    args = ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    assert main(args) == 0
    return [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]


def test_embed_rows_carry_a_warc_pages_http_status_and_content_type(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    assert main(_embed_args(checkpoint, _crawl(tmp_path / "crawl.warc.gz"), out)) == 0
    table = pq.read_table(out)
    assert table.column_names[:5] == ["index", "id", "url", "http_status", "content_type"]
    assert str(table.schema.field("http_status").type) == "int32"
    assert table["http_status"].to_pylist() == STATUSES
    assert table["content_type"].to_pylist() == CONTENT_TYPES
    # The 404 and the empty redirects are embedded as any page is; the status is what tells them apart.
    assert table["error"].to_pylist() == [None, None, None, None, None, "validation_error"]


def test_embed_never_takes_a_jsonl_rows_own_fields_for_a_response(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    assert main(_embed_args(checkpoint, _jsonl_claiming_a_response(tmp_path / "pages.jsonl"), out)) == 0
    table = pq.read_table(out)
    assert table["http_status"].to_pylist() == [None, None]
    assert table["content_type"].to_pylist() == [None, None]
    assert table["error"].null_count == 2


def test_extract_rows_end_with_a_warc_pages_http_status_and_content_type(tmp_path: Path) -> None:
    output = tmp_path / "texts.jsonl"
    rows = _extract_rows(_crawl(tmp_path / "crawl.warc.gz"), output)
    assert [row["http_status"] for row in rows] == STATUSES
    assert [row["content_type"] for row in rows] == CONTENT_TYPES
    assert "error" in rows[5] and "error" not in rows[0]  # both of `_process`'s ends
    for row in rows:  # last, after the keys that tell the command's own output (`_ROW_START`)
        assert list(row)[:3] == ["index", "id", "url"]
        assert list(row)[-3:] == ["http_status", "content_type", "warc_truncated"]
    assert extract_command._ROW_START.match(output.read_bytes())
    # So the output is still the command's own: a second run replaces it without --overwrite.
    assert [row["http_status"] for row in _extract_rows(tmp_path / "crawl.warc.gz", output)] == STATUSES


def test_extract_never_takes_a_jsonl_rows_own_fields_for_a_response(tmp_path: Path) -> None:
    rows = _extract_rows(_jsonl_claiming_a_response(tmp_path / "pages.jsonl"), tmp_path / "texts.jsonl")
    assert [(row["http_status"], row["content_type"]) for row in rows] == [(None, None), (None, None)]


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"warc_file": "c.warc", "http_status": 404, "content_type": "text/html"}, (404, "text/html")),
        ({"warc_file": "c.warc"}, (None, None)),  # a file-level error row: no record read
        ({"warc_file": "c.warc", "http_status": True, "content_type": 7}, (None, None)),
        ({"warc_file": "c.warc", "http_status": "404", "content_type": None}, (None, None)),
        ({"http_status": 404, "content_type": "text/html"}, (None, None)),  # no WARC page
    ],
)
def test_response_fields_take_only_a_warc_pages_values_of_the_readers_types(
    meta: dict[str, Any], expected: tuple[Any, Any]
) -> None:
    fields = embed_command.response_fields(Page(id="p", html=b"", meta=meta), jsonl=False)
    assert (fields["http_status"], fields["content_type"]) == expected
    jsonl = embed_command.response_fields(Page(id="p", html=b"", meta=meta), jsonl=True)
    assert jsonl == {"http_status": None, "content_type": None, "warc_truncated": None}


def test_a_head_or_task_named_like_the_new_columns_is_refused() -> None:
    """`htmllm embed` refuses such a head, and `htmllm heads train` such a task (it reads
    `FIXED_COLUMNS`): its column would collide with the row's own."""
    from model_training.commands.heads import check_columns
    from model_training.evaluation.metrics import EvaluationError
    from service.commands.options import OptionError

    for name in ("http_status", "content_type"):
        spec = HeadSpec(name=name, kind="regression", hidden=16)
        with pytest.raises(OptionError, match=f"would write a column '{name}'"):
            embed_command._check_columns([spec])
        task = cast(Any, SimpleNamespace(spec=spec, path=Path("tasks") / name))
        with pytest.raises(EvaluationError, match=f"the column '{name}'"):
            check_columns([task], [])


def test_an_embed_output_or_run_of_the_previous_row_format_is_refused(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows without the two columns (format 2) are never taken for this run's: a finished output is
    refused (not complete, nor a smaller --limit's to keep), an interrupted run's parts not resumed."""
    assert embed_command.ROW_FORMAT >= 3
    source = _crawl(tmp_path / "crawl.warc.gz")
    out = tmp_path / "out.parquet"
    args = _embed_args(checkpoint, source, out, "--limit", "2")
    assert main(args) == 0
    table = pq.read_table(out)
    metadata = dict(table.schema.metadata)
    settings = {**json.loads(metadata[b"htmllm.run"]), "row_format": 2}
    metadata[b"htmllm.run"] = json.dumps(settings, sort_keys=True).encode()
    pq.write_table(table.replace_schema_metadata(metadata), out)
    capsys.readouterr()
    for options in ([], ["--limit", "3"]):
        assert main(_embed_args(checkpoint, source, out, *options)) == 1
        assert "was written with other settings (" in capsys.readouterr().err
    assert main(args) == 1
    assert capsys.readouterr().err == (
        f"htmllm embed: validation_error: {out} was written with other settings (row_format 2 -> "
        f"{embed_command.ROW_FORMAT}); pass "
        "--overwrite to replace it\n"
    )
    out.unlink()
    stop_before_merge(monkeypatch, args)
    pin = tmp_path / "out.parquet.parts" / "run.json"
    pin.write_text(json.dumps({**json.loads(pin.read_text(encoding="utf-8")), "row_format": 2}))
    capsys.readouterr()
    assert main(args) == 1
    expected = f"holds a run with other settings (row_format 2 -> {embed_command.ROW_FORMAT}); delete it"
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_an_extract_run_of_the_previous_row_format_is_not_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of format 6 (rows without the two fields) are never merged with rows of format 7."""
    assert extract_command.ROW_FORMAT >= 7
    source = tmp_path / "pages.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(3)))  # error rows: no worker
    output = tmp_path / "texts.jsonl"
    args = ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    stop_before_merge(monkeypatch, [*args, "--part-size", "1"], "extract")
    pin = tmp_path / "texts.jsonl.parts" / "run.json"
    pin.write_text(json.dumps({**json.loads(pin.read_text(encoding="utf-8")), "row_format": 6}))
    capsys.readouterr()
    assert main([*args, "--part-size", "1"]) == 1
    expected = f"holds a run with other settings (row_format 6 -> {extract_command.ROW_FORMAT}); delete it"
    assert expected in capsys.readouterr().err
    assert not output.exists()


def test_a_task_a_case_apart_from_a_head_or_task_is_refused_before_embedding() -> None:
    """`save_heads` refuses it (one file on a case-insensitive file system), once every page was embedded."""
    from model_training.commands.heads import check_columns
    from model_training.evaluation.metrics import EvaluationError

    def task(name: str) -> Any:
        return cast(
            Any, SimpleNamespace(spec=HeadSpec(name=name, kind="regression", hidden=16), path=Path(name))
        )

    kept = HeadSpec(name="quality", kind="regression", hidden=16)
    with pytest.raises(EvaluationError, match="'Quality' differs from head or task 'quality' only in case"):
        check_columns([task("Quality")], [kept])
    with pytest.raises(EvaluationError, match="differs from head or task 'lang' only in case"):
        check_columns([task("lang"), task("LANG")], [])
    check_columns([task("quality")], [kept])  # the head retrained under its own name
