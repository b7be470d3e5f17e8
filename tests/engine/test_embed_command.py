"""`htmllm embed`: a Parquet file with every document exactly once, even after kill -9 and a restart."""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from service.cli import main
from service.engine import Document, DocumentResult, Engine
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.cli import (
    ROOT,
    cli,
    cli_env,
    kill_minus_nine_when,
    sigterm_given_back,
    stop_before_merge,
    write_pages,
)
from tests.factories.pages import make_pages
from tests.factories.warc import HttpResponse, response, warc_gz


async def _embed(checkpoint: Path, pages: list[str]) -> list[DocumentResult]:
    async with Engine.from_checkpoint(checkpoint) as engine:
        return await engine.embed([Document(html=p) for p in pages])


@pytest.mark.slow  # two CLI processes, each importing torch
def test_kill_minus_nine_then_resume_writes_each_document_once(tiny_checkpoint: Path, tmp_path: Path) -> None:
    n = 160
    pages = write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    args = cli(
        "embed", "--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "pages.jsonl"),
        "--output", str(out), "--part-size", "8", "--batch-size", "4", "--no-progress",
    )  # fmt: skip
    kill_minus_nine_when(args, lambda: len(list(parts.glob("part-*.parquet"))) >= 3)
    assert not out.exists(), "the first run finished before it could be killed"
    written_before = sum(pq.read_table(p).num_rows for p in parts.glob("part-*.parquet"))
    assert 0 < written_before < n

    second = subprocess.run(args, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert not parts.exists()
    table = pq.read_table(out)
    assert table["index"].to_pylist() == list(range(n))
    assert table["id"].to_pylist() == [f"p{i}" for i in range(n)]
    assert table["error"].null_count == n
    labels = json.loads(table.schema.metadata[b"htmllm.head_labels"])
    assert labels == {"page_type": ["article", "listing", "other"]}
    assert set(table["page_type"].to_pylist()) <= set(labels["page_type"])

    embeddings = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    sample = [0, written_before - 1, written_before, n - 1]
    expected = asyncio.run(_embed(tiny_checkpoint, [pages[i] for i in sample]))
    for i, result in zip(sample, expected, strict=True):
        np.testing.assert_allclose(embeddings[i], result.embedding, atol=1e-5)
        assert table["quality"][i].as_py() == pytest.approx(result.scores["quality"], abs=1e-5)

    assert main(args[3:]) == 0  # a finished output is left alone
    assert pq.read_table(out).num_rows == n


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_bad_rows_become_error_rows_and_the_run_goes_on(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], pool: str
) -> None:
    """A crawl dump with a broken line, a row without html and a page nested too deep: every position gets
    its row, the good pages their embeddings, the others an error code and message."""
    good = make_pages(2, seed=3, min_words=20, max_words=40)
    lines = [
        json.dumps({"id": "a", "html": good[0]}),
        '{"id": "broken", "html": "<p>cut',
        json.dumps({"id": "no-html"}),
        json.dumps({"id": "deep", "html": "<div>" * 20_000}),
        json.dumps({"id": "b", "html": good[1]}),
    ]
    source = tmp_path / "pages.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--output", str(out)]
    assert main([*args, "--no-progress", "--preprocess-pool", pool]) == 0
    assert "embedded this run (3 failed)" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["id"].to_pylist() == ["a", "1", "no-html", "deep", "b"]
    assert table["error"].to_pylist() == [
        None,
        "validation_error",
        "validation_error",
        "preprocess_failed",
        None,
    ]
    messages = table["error_message"].to_pylist()
    assert messages[0] is None and messages[4] is None
    assert "line 2 is not JSON" in messages[1] and "neither 'html' nor 'file'" in messages[2]
    assert "nests more than 8192 elements deep" in messages[3]
    assert table["embedding"][1].as_py() is None and table["tokens"][3].as_py() is None
    expected = asyncio.run(_embed(tiny_checkpoint, good))
    for row, result in zip((0, 4), expected, strict=True):
        np.testing.assert_allclose(np.array(table["embedding"][row].as_py()), result.embedding, atol=1e-5)


def test_a_warc_file_is_embedded_like_the_pages_it_holds(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crawler's .warc.gz in, one row per HTML response out: record ids, target URIs, the HTTP charset
    and Content-Encoding honoured, non-HTML records skipped, a cut-off last record an error row."""
    good = make_pages(2, seed=11, min_words=20, max_words=40)
    records = [
        response(
            "one",
            HttpResponse(good[0].encode("cp1250", errors="replace"), "text/html; charset=windows-1250"),
            "https://a.example/",
        ),
        response("png", HttpResponse(b"\x89PNG\r\n\x1a\n", "image/png")),
        response(
            "two",
            HttpResponse(gzip.compress(good[1].encode()), "text/html", headers={"Content-Encoding": "gzip"}),
            "https://b.example/",
        ),
    ]
    cut = warc_gz([response("cut", HttpResponse(b"<p>" + b"lost " * 200 + b"</p>"))])
    source = tmp_path / "crawl.warc.gz"
    source.write_bytes(warc_gz(records) + cut[: len(cut) // 2])
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--output", str(out)]
    assert main([*args, "--no-progress"]) == 0
    assert "embedded this run (1 failed)" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["id"].to_pylist()[:2] == ["<urn:uuid:one>", "<urn:uuid:two>"] and table.num_rows == 3
    assert table["url"].to_pylist()[:2] == ["https://a.example/", "https://b.example/"]
    assert table["error"].to_pylist() == [None, None, "validation_error"]
    expected = asyncio.run(
        _embed(tiny_checkpoint, [good[0].encode("cp1250", errors="replace").decode("cp1250"), good[1]])
    )
    for row, result in enumerate(expected):
        np.testing.assert_allclose(np.array(table["embedding"][row].as_py()), result.embedding, atol=1e-5)


@pytest.mark.slow  # spawns the inference process, which imports torch
def test_the_model_in_a_child_process_writes_what_the_engine_gives(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    pages = write_pages(tmp_path / "pages.jsonl", 12)
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "pages.jsonl")]
    assert main([*args, "--output", str(out), "--inference-process", "--no-progress"]) == 0
    table = pq.read_table(out)
    assert table["id"].to_pylist() == [f"p{i}" for i in range(12)] and table["error"].null_count == 12
    expected = asyncio.run(_embed(tiny_checkpoint, pages))
    embeddings = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(embeddings, np.stack([r.embedding for r in expected]), atol=1e-5)


def _args(checkpoint: Path, source: Path, out: Path, *options: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(out),
            "--no-progress", *options]  # fmt: skip


def _not_loaded(*_: object, **__: object) -> Engine:
    raise AssertionError("the model was loaded before the options were checked")


def test_ctrl_c_keeps_what_was_finished_and_the_resume_embeds_the_rest(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents in flight at Ctrl-C fail with shutting_down: they must be left for the resume, not
    written as done error rows; the command ends with one line and status 130."""
    n = 40
    write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "1", "--batch-size", "4")
    original = Engine.embed
    calls = 0
    handler: object = None  # SIGINT's at the Ctrl-C, for the failure's message

    async def embed_then_ctrl_c(self: Engine, *a: Any, **kw: Any) -> list[DocumentResult]:
        nonlocal calls, handler
        calls += 1
        if calls == 12:
            handler = signal.getsignal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # asyncio.run's handler cancels the run, as a Ctrl-C does
        return await original(self, *a, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(Engine, "embed", embed_then_ctrl_c)
        try:
            status: int | None = main(args)
        except KeyboardInterrupt:
            status = None
    err = capsys.readouterr().err
    assert status == 130, (calls, handler, err)
    assert "interrupted" in err and "Traceback" not in err
    tables = [pq.read_table(p) for p in (tmp_path / "out.parquet.parts").glob("part-*.parquet")]
    kept = sum(t.num_rows for t in tables)
    assert 0 < kept < n
    assert all(t["error"].null_count == t.num_rows for t in tables), [t["error"] for t in tables]

    assert main(args) == 0
    table = pq.read_table(out)
    assert table["index"].to_pylist() == list(range(n)) and table["error"].null_count == n
    # The last line says what the resume took over and what it embedded (it said "wrote 40 documents
    # ... (0 failed this run)", as if this run had embedded them all).
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"wrote {n} documents to {out}: {kept} resumed from earlier runs, {n - kept} embedded this run "
        "(0 failed)"
    )


def test_sigterm_keeps_what_was_finished_as_ctrl_c_does(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (what Kubernetes and Slurm send) ended the run on the spot with status 143, the finished
    rows held for the next part lost. It ends as Ctrl-C does, with SIGTERM's status and word, and
    SIGTERM's handler is given back."""
    n = 40
    write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "5", "--batch-size", "4")
    original = Engine.embed
    calls = 0

    async def embed_then_sigterm(self: Engine, *a: Any, **kw: Any) -> list[DocumentResult]:
        nonlocal calls
        calls += 1
        if calls == 12:
            signal.raise_signal(signal.SIGTERM)
        return await original(self, *a, **kw)

    with sigterm_given_back(), monkeypatch.context() as patch:
        patch.setattr(Engine, "embed", embed_then_sigterm)
        assert main(args) == 143
    parts = tmp_path / "out.parquet.parts"
    assert capsys.readouterr().err == (
        f"htmllm embed: terminated (SIGTERM); what was finished is kept in {parts}: run the same command "
        "again to go on\n"
    )
    tables = [pq.read_table(p) for p in parts.glob("part-*.parquet")]
    assert 0 < sum(t.num_rows for t in tables) < n
    assert all(t["error"].null_count == t.num_rows for t in tables), [t["error"] for t in tables]

    assert main(args) == 0
    table = pq.read_table(out)
    assert table["index"].to_pylist() == list(range(n)) and table["error"].null_count == n


def test_a_failure_a_retry_may_fix_is_left_for_the_next_run(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.engine.types import BackendError

    write_pages(tmp_path / "pages.jsonl", 8)
    out = tmp_path / "out.parquet"
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "2")
    original = Engine.embed

    async def flaky(self: Engine, docs: list[Document], **kw: Any) -> list[DocumentResult]:
        if docs[0].id in ("p2", "p5"):
            raise BackendError("CUDA out of memory")
        return await original(self, docs, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(Engine, "embed", flaky)
        assert main(args) == 1
    err = capsys.readouterr().err
    assert "2 documents were left for the next run (2 backend_failed" in err and "CUDA out of memory" in err
    assert not out.exists()
    written = [
        i
        for p in (tmp_path / "out.parquet.parts").glob("part-*.parquet")
        for i in pq.read_table(p)["index"].to_pylist()
    ]
    assert sorted(written) == [0, 1, 3, 4, 6, 7]

    assert main(args) == 0
    table = pq.read_table(out)
    assert table["index"].to_pylist() == list(range(8)) and table["error"].null_count == 8


def test_a_second_run_on_the_same_output_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    fd = os.open(parts / "lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"pid 4242 on crawler-7, since 2024-05-01 10:00:00\n")
        fcntl.flock(fd, fcntl.LOCK_EX)  # a run that is still going
        assert main(_args(tiny_checkpoint, tmp_path / "pages.jsonl", out)) == 1
        assert "another run (pid 4242 on crawler-7" in capsys.readouterr().err
        assert not out.exists()
    finally:
        os.close(fd)
    assert main(_args(tiny_checkpoint, tmp_path / "pages.jsonl", out)) == 0
    assert pq.read_table(out)["index"].to_pylist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("parts_indices", "documents"), [([[0, 1], [3]], 4), ([[0, 1], [1, 2]], 3), ([[0, 1]], 3)]
)
def test_the_merge_refuses_parts_without_each_document_once(
    tmp_path: Path, parts_indices: list[list[int]], documents: int
) -> None:
    import pyarrow as pa

    from service.commands.embed import _schema
    from service.commands.embed_state import merge
    from service.commands.resume_state import RunStateError

    schema = _schema(4, [])
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    for number, indices in enumerate(parts_indices):
        rows = [{"index": i, "id": f"p{i}"} for i in indices]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), parts / f"part-{number:06d}.parquet")
    with pytest.raises(RunStateError, match="once each"):
        merge(parts, tmp_path / "out.parquet", schema, documents, {})
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("window", [1, 3, 100])
def test_the_merge_streams_windows_of_parts_in_any_order(
    tmp_path: Path, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts hold indices in completion order (a late part may hold scattered ones, a retry's): the
    merged file is every row once, in index order, whatever the window it is written in."""
    import pyarrow as pa

    from service.commands import embed_state
    from service.commands.embed import _schema

    schema = _schema(4, [])
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    layout = [[4, 2, 5], [0, 1], [9, 3], [6, 8, 7]]
    for number, indices in enumerate(layout):
        rows = [{"index": i, "id": f"p{i}", "embedding": [float(i)] * 4} for i in indices]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), parts / f"part-{number:06d}.parquet")
    monkeypatch.setattr(embed_state, "MERGE_WINDOW_ROWS", window)
    assert embed_state.merge(parts, tmp_path / "out.parquet", schema, 10, {"k": 1}) == 10
    merged = pq.read_table(tmp_path / "out.parquet")
    assert merged["index"].to_pylist() == list(range(10))
    assert merged["id"].to_pylist() == [f"p{i}" for i in range(10)]
    assert [row[0] for row in merged["embedding"].to_pylist()] == [float(i) for i in range(10)]
    assert embed_state.output_settings(tmp_path / "out.parquet") == {"k": 1}


def test_the_merge_reads_a_part_of_many_windows_a_window_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished output of a smaller --limit is one part of the run that goes on from it: read whole for
    each window it meets, a merge of N rows took N / 16,384 reads of the whole output."""
    import pyarrow as pa

    from service.commands import embed_state
    from service.commands.embed import _schema

    schema = _schema(4, [])
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    monkeypatch.setattr(embed_state, "MERGE_WINDOW_ROWS", 4)
    rows = [{"index": i, "id": f"p{i}", "embedding": [float(i)] * 4} for i in range(22)]
    for number, (start, end) in enumerate([(0, 10), (10, 22)]):
        pq.write_table(
            pa.Table.from_pylist(rows[start:end], schema=schema), parts / f"part-{number:06d}.parquet"
        )
    # The earlier output: merged from its own parts, in windows, then taken as a part.
    embed_state.merge(parts, tmp_path / "earlier.parquet", schema, 22, {"limit": 22})
    for part in parts.iterdir():
        part.unlink()
    os.link(tmp_path / "earlier.parquet", parts / "part-000000.parquet")
    pq.write_table(
        pa.Table.from_pylist([{**row, "index": i + 22} for i, row in enumerate(rows[:3])], schema=schema),
        parts / "part-000001.parquet",
    )
    read_table, read = pq.read_table, []

    def counted(*args: Any, **kwargs: Any) -> pa.Table:
        table = read_table(*args, **kwargs)
        if "columns" not in kwargs:  # rows, not the index column the check reads first
            read.append(table.num_rows)
        return table

    monkeypatch.setattr(pq, "read_table", counted)
    assert embed_state.merge(parts, tmp_path / "out.parquet", schema, 25, {"limit": None}) == 25
    monkeypatch.undo()
    assert max(read) <= 4 and sum(read) == 25, read
    merged = pq.read_table(tmp_path / "out.parquet")
    assert merged["index"].to_pylist() == list(range(25))
    assert merged["id"].to_pylist() == [f"p{i}" for i in range(22)] + ["p0", "p1", "p2"]


def test_resume_with_another_checkpoint_or_dtype_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retrained checkpoint has the same name and tokenizer: its weights must tell it apart. A copy of
    the same checkpoint (other mtimes) resumes."""
    write_pages(tmp_path / "pages.jsonl", 4)
    out = tmp_path / "out.parquet"
    stop_before_merge(monkeypatch, _args(tiny_checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "2"))
    retrained = build_tiny_checkpoint(tmp_path / "retrained", seed=1)
    assert main(_args(retrained, tmp_path / "pages.jsonl", out)) == 1
    assert "holds a run with other settings (checkpoint_sha256 " in capsys.readouterr().err
    assert main(_args(tiny_checkpoint, tmp_path / "pages.jsonl", out, "--dtype", "bfloat16")) == 1
    assert "other settings (dtype float32 -> bfloat16)" in capsys.readouterr().err
    assert not out.exists()

    copy = shutil.copytree(tiny_checkpoint, tmp_path / "copy")
    assert main(_args(copy, tmp_path / "pages.jsonl", out)) == 0
    assert pq.read_table(out)["index"].to_pylist() == [0, 1, 2, 3]


def test_parts_of_an_older_row_format_are_not_resumed(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.commands import embed as command

    write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    pin = tmp_path / "out.parquet.parts" / "run.json"
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out)
    stop_before_merge(monkeypatch, args)
    # The same run as written by a version whose rows had no error_message: no row_format in run.json.
    settings = json.loads(pin.read_text(encoding="utf-8"))
    assert settings.pop("row_format") == command.ROW_FORMAT
    pin.write_text(json.dumps(settings), encoding="utf-8")
    assert main(args) == 1
    assert f"(row_format unset -> {command.ROW_FORMAT}; written by an older" in capsys.readouterr().err
    assert not out.exists()


def test_an_existing_output_is_kept_unless_it_is_this_runs(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished output is a no-op for the same settings only; any other file is refused, or replaced
    with --overwrite. The output is created with the umask's mode, not mkstemp's 0600."""
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    out.write_bytes(b"my thesis, not a parquet file")
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out)
    assert main(args) == 1
    assert "was not written by this version of htmllm embed; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"my thesis, not a parquet file"
    directory = tmp_path / "a-directory"
    directory.mkdir()
    assert main(_args(tiny_checkpoint, tmp_path / "pages.jsonl", directory)) == 1
    assert "is a directory" in capsys.readouterr().err

    mask = os.umask(0o027)
    try:
        assert main([*args, "--overwrite"]) == 0
    finally:
        os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o640
    assert pq.read_table(out).num_rows == 3
    capsys.readouterr()
    assert main(args) == 0
    assert "complete with these settings; nothing to do" in capsys.readouterr().err
    assert main([*args, "--limit", "2"]) == 1
    assert "was written with other settings (limit none -> 2); pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--limit", "2", "--overwrite"]) == 0
    assert pq.read_table(out)["index"].to_pylist() == [0, 1]


def test_a_dangling_symlink_input_is_input_unreadable_as_the_same_link_among_pages_is(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was "does not exist" (validation_error), where the same link in a directory of pages is an
    `input_unreadable` row: the file system's, not the input's."""
    source = tmp_path / "crawl.warc.gz"
    source.symlink_to(tmp_path / "moved.warc.gz")
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    assert main(_args(tiny_checkpoint, source, tmp_path / "out.parquet")) == 1
    err = capsys.readouterr().err
    assert err == (
        f"htmllm embed: input_unreadable: page source {source} is a symlink to {tmp_path / 'moved.warc.gz'}, "
        "which is gone\n"
    )
    assert not (tmp_path / "out.parquet.parts").exists()


def test_a_typo_in_the_input_neither_loads_the_model_nor_locks_the_output(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    with monkeypatch.context() as patch:
        patch.setattr(Engine, "from_checkpoint", _not_loaded)
        assert main(_args(tiny_checkpoint, tmp_path / "pagse.jsonl", out)) == 1
        assert "pagse.jsonl does not exist" in capsys.readouterr().err
        (tmp_path / "notes.txt").write_text("not pages\n")  # a file of no kind a source is read as
        assert main(_args(tiny_checkpoint, tmp_path / "notes.txt", out)) == 1
        assert "cannot tell what" in capsys.readouterr().err
    assert not parts.exists()
    # A run.json written by a run that wrote no part yet (an older version's typo) is replaced.
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"input": str(tmp_path / "pagse.jsonl")}), encoding="utf-8")
    assert main(_args(tiny_checkpoint, tmp_path / "pages.jsonl", out)) == 0
    assert pq.read_table(out).num_rows == 3


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        (["--batch-size", "0"], 2, "--batch-size: must be at least 1"),
        (["--workers", "0"], 2, "--workers: must be at least 1"),
        (["--intra-op-threads", "0"], 2, "--intra-op-threads: must be at least 1"),
        (["--max-length", "1"], 2, "--max-length: must be at least 2"),
        (["--part-size", "0"], 2, "--part-size: must be at least 1"),
        (["--limit", "-3"], 2, "--limit: must be at least 1"),
        (["--max-length", "100000"], 1, "--max-length 100000 exceeds the checkpoint's"),
        (["--dtype", "float16"], 1, "float16 is for CUDA"),
        (["--onnx-quantize", "int8"], 1, "needs the onnx backend on CPU"),
        (["--heads", "quality,nope"], 1, "unknown head(s) 'nope'"),
        (["--onnx-path", "{tmp}/g.onnx"], 1, "--onnx-path is the onnx backend's graph"),
        (["--backend", "onnx", "--attention", "eager"], 1, "attention 'eager' is the torch backend's"),
        pytest.param(
            ["--device", "cuda"], 1, "no usable CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
        (["--attention", "flash_attention_2"], 1, "flash_attention_2 needs CUDA"),
        (["--output", "/proc/x.parquet"], 1, "/proc/x.parquet.parts"),
        (  # an output under a file: a bare "[Errno 20] Not a directory" line, without a code, at the lock
            ["--output", "{tmp}/pages.jsonl/out.parquet"], 1,
            "validation_error: --output {tmp}/pages.jsonl/out.parquet is under {tmp}/pages.jsonl, which "
            "is not a directory",
        ),
    ],
)  # fmt: skip
def test_a_bad_option_is_one_line_before_the_model_loads(
    tiny_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    options: list[str],
    status: int,
    message: str,
) -> None:
    write_pages(tmp_path / "pages.jsonl", 2)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    options = [option.format(tmp=tmp_path) for option in options]
    message = message.format(tmp=tmp_path)
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", tmp_path / "out.parquet", *options)
    code: object
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    err = capsys.readouterr().err
    assert code == status and message in err, err
    assert "Traceback" not in err and (status == 2 or err.count("\n") == 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl"]


def test_onnx_on_cuda_without_onnxruntimes_cuda_is_refused_before_the_model_loads(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device check once skipped every backend but torch: the command exported the whole ONNX graph
    (minutes, on a real model) and only then failed `backend_failed`. onnxruntime's providers are patched,
    so this holds on a machine with CUDA too."""
    import onnxruntime

    write_pages(tmp_path / "pages.jsonl", 2)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    options = ["--backend", "onnx", "--device", "cuda", "--dtype", "float32"]
    assert main(_args(tiny_checkpoint, tmp_path / "pages.jsonl", tmp_path / "out.parquet", *options)) == 1
    err = capsys.readouterr().err
    assert "onnxruntime has no CUDAExecutionProvider" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out.parquet.parts").exists()


def test_the_onnx_backend_without_onnxruntime_is_one_line(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 2)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", tmp_path / "out.parquet", "--backend", "onnx")
    assert main(args) == 1
    assert "--backend onnx needs onnxruntime" in capsys.readouterr().err


def test_leftovers_of_a_killed_merge_are_removed_by_the_resume(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out)
    stop_before_merge(monkeypatch, args)
    # A merge killed half way (this version's temporary), files that are not surely ours (an older
    # version's temporaries looked like a user's `.out.parquet.original`: kept) and one that is not.
    kept = (".out.parquet.k3_x9abz.tmp", ".out.parquet.a1b2c3d4", ".out.parquet.notes")
    for name in (".out.parquet.k3_x9abz.htmllm-tmp", *kept):
        (tmp_path / name).write_bytes(b"PAR1" * 1000)
    trash = tmp_path / ".out.parquet.zz001122.tmp" / "parts"  # a removal of the parts killed half way
    trash.mkdir(parents=True)
    assert main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "out.parquet", "pages.jsonl"])


def test_an_input_that_shrank_since_the_interrupted_run_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "pages.jsonl"
    write_pages(source, 6)
    out = tmp_path / "out.parquet"
    args = _args(tiny_checkpoint, source, out, "--part-size", "2")
    stop_before_merge(monkeypatch, args)
    source.write_text(
        "".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:4]), encoding="utf-8"
    )
    assert main(args) == 1
    assert "input changed since the interrupted run (it was " in capsys.readouterr().err
    assert not out.exists()


def test_an_unreadable_part_is_embedded_again(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 6)
    out = tmp_path / "out.parquet"
    args = _args(tiny_checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "2")
    stop_before_merge(monkeypatch, args)
    parts = sorted((tmp_path / "out.parquet.parts").glob("part-*.parquet"))
    assert len(parts) == 3
    parts[1].write_bytes(parts[1].read_bytes()[:100])  # damaged from outside
    assert main(args) == 0
    assert f"{parts[1]} cannot be read" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["index"].to_pylist() == list(range(6)) and table["error"].null_count == 6


def test_the_onnx_backend_runs_the_graph_onnx_path_names(tmp_path: Path) -> None:
    """A graph exported once (`htmllm export-onnx --out`) is the one the run uses: without --onnx-path
    every run exported its own beside the checkpoint (minutes on a real model; refused where the
    checkpoint is read-only)."""
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    graph = tmp_path / "graphs" / "tiny.onnx"
    graph.parent.mkdir()
    assert main(["export-onnx", "--checkpoint", str(checkpoint), "--out", str(graph)]) == 0
    exported = graph.stat().st_mtime_ns
    write_pages(tmp_path / "pages.jsonl", 5)
    onnx_out, torch_out = tmp_path / "onnx.parquet", tmp_path / "torch.parquet"
    options = ["--backend", "onnx", "--onnx-path", str(graph)]
    assert main(_args(checkpoint, tmp_path / "pages.jsonl", onnx_out, *options)) == 0
    assert main(_args(checkpoint, tmp_path / "pages.jsonl", torch_out)) == 0
    assert graph.stat().st_mtime_ns == exported  # used as it was, not exported again
    assert not list(checkpoint.glob("*.onnx"))  # nor a graph of its own beside the checkpoint
    onnx_rows, torch_rows = pq.read_table(onnx_out), pq.read_table(torch_out)
    assert onnx_rows["id"].to_pylist() == torch_rows["id"].to_pylist()
    np.testing.assert_allclose(
        np.array(onnx_rows["embedding"].to_pylist()), np.array(torch_rows["embedding"].to_pylist()), atol=1e-4
    )
