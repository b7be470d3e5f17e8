"""`htmllm embed`: the page cap (a row over it is that row's error, payload_too_large, as the Engine
would have answered for the page), and what a run may remove or resume (the rest is in tests/engine)."""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.commands import embed as embed_command
from service.commands import resume_state
from service.core import pages
from service.core.checkpoint import CheckpointMeta, save_checkpoint
from service.core.modeling import HeadSpec, TaskHead
from service.core.prune import PRUNE_VERSION
from tests.factories.checkpoint import build_tiny_checkpoint, build_tiny_model
from tests.factories.cli import ROOT, cli_env, stop_before_merge, write_pages
from tests.factories.disk import closed_directory, eio_for
from tests.factories.tokenizer import build_tiny_tokenizer


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
    assert "embedded this run (3 failed)" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["id"].to_pylist() == ["a", "1", "big", "no-html"]
    assert table["error"].to_pylist() == [None, "payload_too_large", "payload_too_large", "validation_error"]
    assert "line 2 has more than 4096 bytes" in table["error_message"][1].as_py()


# --- resuming: what a run may remove, and when it may go on (tests/engine has the rest) ---


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("embed") / "tiny")


def _args(checkpoint: Path, source: Path, output: Path, *options: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1", *options]  # fmt: skip


def _not_loaded(*_: object, **__: object) -> object:
    raise AssertionError("the model was loaded before the options were checked")


def test_a_run_removes_only_its_own_leftovers_never_a_users_hidden_files(
    checkpoint: Path, tmp_path: Path
) -> None:
    """`.<output>.<8 characters>` was taken for a killed run's temporary: a user's backup file, or a
    snapshot folder (removed whole), went with it."""
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    (tmp_path / ".out.parquet.original").write_bytes(b"PAR1 a backup")
    (tmp_path / ".out.parquet.snapshot").mkdir()
    (tmp_path / ".out.parquet.snapshot" / "file").write_text("data")
    (tmp_path / ".out.parquet.original.tmp").write_text("a user's, named as an older version's temporary")
    (tmp_path / ".out.parquet.archived.tmp").mkdir()  # a folder of another shape than a parts' trash
    (tmp_path / ".out.parquet.archived.tmp" / "parts").mkdir()
    (tmp_path / ".out.parquet.archived.tmp" / "parts" / "thesis.tex").write_text("mine")
    users = sorted(p.name for p in tmp_path.iterdir())
    # What killed runs leave: a merge's temporary, a trash of this version and one of an older version.
    (tmp_path / ".out.parquet.k3_x9abz.htmllm-tmp").write_bytes(b"PAR1" * 100)
    (tmp_path / ".out.parquet.zz001122.htmllm-trash" / "parts").mkdir(parents=True)
    (tmp_path / ".out.parquet.zz001122.htmllm-trash" / "parts" / "part-000000.parquet").write_bytes(b"x")
    (tmp_path / ".out.parquet.zz003344.tmp" / "parts").mkdir(parents=True)
    (tmp_path / ".out.parquet.zz003344.tmp" / "parts" / "lock").write_text("pid 1")
    # A trash another run is removing right now (its lock held): not touched.
    live = tmp_path / ".out.parquet.live0000.htmllm-trash" / "parts"
    live.mkdir(parents=True)
    with (live / "lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert main(_args(checkpoint, tmp_path / "pages.jsonl", out)) == 0
    assert (tmp_path / ".out.parquet.snapshot" / "file").read_text() == "data"
    assert (tmp_path / ".out.parquet.original").read_bytes() == b"PAR1 a backup"
    assert (tmp_path / ".out.parquet.archived.tmp" / "parts" / "thesis.tex").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*users, ".out.parquet.live0000.htmllm-trash", "out.parquet"]
    )


def test_an_interrupted_overwrite_with_other_settings_survives_a_run_of_the_finished_settings(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 4)
    out = tmp_path / "out.parquet"
    finished = _args(checkpoint, tmp_path / "pages.jsonl", out)
    assert main(finished) == 0
    other = [*finished, "--max-length", "64", "--overwrite", "--part-size", "1"]
    stop_before_merge(monkeypatch, other)
    parts = tmp_path / "out.parquet.parts"
    before = sorted(p.name for p in parts.glob("part-*"))
    assert len(before) == 4
    capsys.readouterr()
    assert main(finished) == 0
    err = capsys.readouterr().err
    assert (
        "nothing to do" in err
        and f"{parts} holds an interrupted run with other settings (max_length 64 -> 128)" in err
    )
    assert err.count("\n") == 1
    assert sorted(p.name for p in parts.glob("part-*")) == before
    assert main(other) == 0  # and it goes on from its parts
    assert "4 resumed from earlier runs, 0 embedded this run (0 failed)" in capsys.readouterr().err
    assert not parts.exists()
    assert pq.read_table(out).num_rows == 4


def test_a_resume_over_an_input_rewritten_without_ids_is_refused(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows without ids are named by position: the ids' check cannot tell another input of as many rows."""
    source = tmp_path / "pages.jsonl"
    source.write_text("".join(json.dumps({"html": f"<p>page {i}</p>"}) + "\n" for i in range(4)))
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, source, out, "--part-size", "1")
    stop_before_merge(monkeypatch, args)
    size = source.stat().st_size
    source.write_text("".join(json.dumps({"html": f"<p>another page, {i}</p>"}) + "\n" for i in range(4)))
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"input changed since the interrupted run (it was 1 file(s), {size} bytes" in err, err
    assert "delete" in err and err.count("\n") == 1
    assert not out.exists()


def test_a_resume_over_a_page_file_edited_under_its_name_is_refused(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pages_dir = tmp_path / "site"
    pages_dir.mkdir()
    for name in ("a.html", "b.html", "c.html"):
        (pages_dir / name).write_text(f"<p>the page {name}</p>")
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, pages_dir, out, "--part-size", "1")
    stop_before_merge(monkeypatch, args)
    edited = pages_dir / "a.html"
    edited.write_text("<p>the page a.htmX</p>")  # as long as it was: only its modification time tells
    stat = edited.stat()
    os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    # "(3 file(s), N bytes, last modified T, but a file was replaced or modified", or "(it was ..., now
    # ...)" when the edit's millisecond crossed into the next second of the time shown.
    assert "input changed since the interrupted run (" in err and "3 file(s)" in err, err
    assert not out.exists()


def test_a_finished_output_whose_input_grew_is_not_complete(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "pages.jsonl"
    write_pages(source, 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, source, out)
    assert main(args) == 0
    with source.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "new", "html": "<p>a page added later</p>"}) + "\n")
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "was written before its input changed (it was 1 file(s)" in err and "pass --overwrite" in err
    assert main([*args, "--overwrite"]) == 0
    assert pq.read_table(out)["id"].to_pylist() == ["p0", "p1", "p2", "new"]


def test_a_kill_while_the_parts_are_removed_leaves_nothing_after_the_next_run(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts are moved into a temporary folder, then deleted: a kill in between left a full copy of
    them that the next run, finding the output complete, never looked at."""
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "1")

    def killed(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(resume_state.shutil, "rmtree", killed)
        assert main(args) == 130
    assert out.exists() and not (tmp_path / "out.parquet.parts").exists()
    assert len(list(tmp_path.glob(".out.parquet.*"))) == 1  # the parts, on their way out
    capsys.readouterr()
    assert main(args) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "pages.jsonl"]


def _corpus(path: Path, n: int) -> Path:
    """A corpus directory as the shared corpus is laid out: manifest.jsonl and gzipped page files."""
    (path / "pages").mkdir(parents=True)
    rows = []
    for i in range(n):
        (path / "pages" / f"p{i:04d}.html.gz").write_bytes(
            gzip.compress(f"<p>page {i} of words</p>".encode())
        )
        rows.append(json.dumps({"id": f"p{i}", "file": f"pages/p{i:04d}.html.gz"}) + "\n")
    (path / "manifest.jsonl").write_text("".join(rows))
    return path


def test_a_page_file_of_a_corpus_replaced_since_is_noticed_as_a_directory_of_pages_notices_it(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the manifest was pinned: a page file replaced after a finished run was "complete with these
    settings; nothing to do", its old embedding kept, and a resume mixed old pages' rows with new."""
    corpus = _corpus(tmp_path / "corpus", 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, corpus, out)
    assert main(args) == 0
    replaced = corpus / "pages" / "p0001.html.gz"
    replaced.write_bytes(gzip.compress(b"<p>another page altogether, longer</p>"))
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "was written before its input changed (it was 4 file(s)" in err and "pass --overwrite" in err, err
    assert err.count("\n") == 1
    assert main([*args, "--overwrite"]) == 0
    assert main(args) == 0
    assert "nothing to do" in capsys.readouterr().err
    # A resume over a page file replaced since the interrupted run.
    resumed = tmp_path / "resumed.parquet"
    stop_before_merge(monkeypatch, _args(checkpoint, corpus, resumed, "--part-size", "1"))
    replaced.write_bytes(gzip.compress(b"<p>yet another page</p>"))
    capsys.readouterr()
    assert main(_args(checkpoint, corpus, resumed, "--part-size", "1")) == 1
    err = capsys.readouterr().err
    assert "input changed since the interrupted run (it was 4 file(s)" in err and "delete" in err, err
    assert not resumed.exists()


def test_a_jsonl_file_of_inline_pages_is_not_read_through_again_to_find_that_nothing_is_left(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its identity, recorded in the output's metadata (and run.json), says that it names no page file:
    unchanged, a crawl dump of inline pages is not read again for "nothing to do", nor for a resume."""
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "1")
    stop_before_merge(monkeypatch, args)

    def unread(*_: object) -> object:
        raise AssertionError("the input was read through for its page files")

    monkeypatch.setattr(pages, "named_files", unread)
    assert main(args) == 0  # the resume: run.json's identity
    capsys.readouterr()
    assert main(args) == 0  # the output's
    assert capsys.readouterr().err == f"htmllm embed: {out} is complete with these settings; nothing to do\n"


def _checkpoint_with_heads(path: Path, *specs: HeadSpec) -> Path:
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(heads=False)
    for spec in specs:
        model.add_head(TaskHead(spec, model.embedding_dim))
    meta = CheckpointMeta(
        name="collide", pooling="cls", prune_version=PRUNE_VERSION, tokenizer_sha256=tokenizer.sha256,
        max_length=128, embedding_dim=model.embedding_dim, training={},
    )  # fmt: skip
    save_checkpoint(path, model, tokenizer, meta)
    return path


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            [HeadSpec(name="tokens", kind="regression", hidden=16)],
            "head 'tokens' would write a column 'tokens'",
        ),
        (
            [HeadSpec(name="error", kind="classification", labels=["a", "b"], hidden=16)],
            "head 'error' would write a column 'error'",
        ),
        ([HeadSpec(name="index", kind="regression", hidden=16)], "head 'index' would write a column 'index'"),
        (
            [HeadSpec(name="http_status", kind="regression", hidden=16)],
            "head 'http_status' would write a column 'http_status'",
        ),
    ],
)
def test_a_head_named_like_another_column_is_one_line_before_the_model_loads(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    specs: list[HeadSpec],
    message: str,
) -> None:
    from service.engine import Engine

    ckpt = _checkpoint_with_heads(tmp_path / "ckpt", *specs)
    write_pages(tmp_path / "pages.jsonl", 2)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    capsys.readouterr()
    assert main(_args(ckpt, tmp_path / "pages.jsonl", tmp_path / "out.parquet")) == 1
    err = capsys.readouterr().err
    assert message in err and "validation_error" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "pages.jsonl"]


def test_the_order_of_heads_does_not_matter_to_a_resume(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "1")
    stop_before_merge(monkeypatch, [*args, "--heads", "quality,page_type"])
    assert main([*args, "--heads", "page_type,quality"]) == 0
    assert main([*args, "--heads", "quality,page_type"]) == 0  # complete with these settings
    assert pq.read_table(out).column_names[-3:] == ["page_type", "page_type.probs", "quality"]


@pytest.mark.parametrize("files", [[], ["notes.txt"]])
def test_a_directory_without_pages_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, files: list[str]
) -> None:
    """As `htmllm extract` refuses it: an empty output and exit 0 would pass for a finished run."""
    from service.engine import Engine

    source = tmp_path / "site"
    source.mkdir()
    for name in files:
        (source / name).write_text("not a page")
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    assert main(_args(tmp_path / "no-checkpoint-needed", source, tmp_path / "out.parquet")) == 1
    err = capsys.readouterr().err
    assert f"page source {source} holds no pages" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out.parquet").exists() and not (tmp_path / "out.parquet.parts").exists()


def test_a_page_file_that_cannot_be_read_is_an_input_unreadable_row_a_resume_keeps(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError reading a page (EIO, permission denied, a file gone) was a `validation_error` row, as if
    the page were bad, and a dangling symlink in a directory of pages was skipped: its document lost
    without a word. Both are `input_unreadable` rows now, which a resume keeps as it keeps a bad page's
    row: done, though the disk answers by then. (Root reads a chmod 000 file: the reader is patched.)"""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("a.html", "c.html", "d.html"):
        (site / name).write_text(f"<p>the page {name}, with a few words to embed</p>")
    (site / "b.html").symlink_to(tmp_path / "gone.html")
    (site / "e.html.gz").write_bytes(b"\x1f\x8b\x08 truncated")  # a bad page, for comparison
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, site, out, "--part-size", "1")
    with monkeypatch.context() as patch:
        eio_for(patch, "c.html")
        stop_before_merge(monkeypatch, args)
    capsys.readouterr()
    assert main(args) == 0
    assert (
        f"wrote 5 documents to {out}: 5 resumed from earlier runs, 0 embedded this run (0 failed)"
        in capsys.readouterr().err
    )
    table = pq.read_table(out)
    assert table["id"].to_pylist() == ["a.html", "b.html", "c.html", "d.html", "e.html.gz"]
    assert table["error"].to_pylist() == [
        None,
        "input_unreadable",
        "input_unreadable",
        None,
        "validation_error",
    ]
    messages = table["error_message"].to_pylist()
    assert "No such file or directory" in messages[1] and "Input/output error" in messages[2]
    assert table["embedding"][2].as_py() is None and table["embedding"][3].as_py() is not None


def test_an_input_behind_a_closed_directory_is_one_line_with_its_code(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input under a directory of mode 000 was "htmllm embed: [Errno 13] Permission denied: ..."
    (`Path.exists` raised), without the code every other input failure has. (Root searches any
    directory: the file system is patched.)"""
    from service.engine import Engine

    closed = tmp_path / "noperm"
    (closed / "site").mkdir(parents=True)
    write_pages(closed / "pages.jsonl", 2)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    closed_directory(monkeypatch, closed)
    for source in (closed / "pages.jsonl", closed / "site"):
        assert main(_args(checkpoint, source, tmp_path / "out.parquet")) == 1
        assert capsys.readouterr().err == (
            f"htmllm embed: input_unreadable: page source {source} cannot be looked at: Permission denied "
            "(a directory on its path is closed to this user)\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noperm"]


def test_an_input_that_cannot_be_read_is_input_unreadable_before_the_model_loads(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.engine import Engine

    source = tmp_path / "pages.jsonl"
    write_pages(source, 2)
    real_open = Path.open

    def failing_disk(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == source:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    monkeypatch.setattr(Path, "open", failing_disk)
    capsys.readouterr()
    assert main(_args(checkpoint, source, tmp_path / "out.parquet")) == 1
    err = capsys.readouterr().err
    assert err == f"htmllm embed: input_unreadable: page source {source} cannot be read: Input/output error\n"


def test_an_output_inside_the_input_directory_is_no_file_of_the_input(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's own parts directory (lock, run.json, parts) and output were files of its input, whose
    identity took their sizes and times: the resume was refused as "input changed since the interrupted
    run", and a finished output as "written before its input changed; pass --overwrite"."""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("a.html", "b.html", "c.html"):
        (site / name).write_text(f"<p>the page {name}, with a few words to embed</p>")
    out = site / "emb.parquet"
    args = _args(checkpoint, site, out, "--part-size", "1")
    stop_before_merge(monkeypatch, args)
    assert len(list((site / "emb.parquet.parts").glob("part-*"))) == 3
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    assert f"wrote 3 documents to {out}" in capsys.readouterr().err
    assert main(args) == 0
    assert capsys.readouterr().err == f"htmllm embed: {out} is complete with these settings; nothing to do\n"
    assert pq.read_table(out)["id"].to_pylist() == ["a.html", "b.html", "c.html"]
    assert sorted(p.name for p in site.iterdir()) == ["a.html", "b.html", "c.html", "emb.parquet"]


@pytest.mark.parametrize(
    ("name", "content"), [("pages.jsonl", b""), ("pages.jsonl", b"\n\n"), ("crawl.warc.gz", b"")]
)
def test_a_single_file_without_pages_is_refused_before_the_model_loads(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    content: bytes,
) -> None:
    """As a directory without pages is: an empty output and exit 0 would pass for a finished run."""
    from service.engine import Engine

    source = tmp_path / name
    source.write_bytes(content)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    assert main(_args(tmp_path / "no-checkpoint-needed", source, tmp_path / "out.parquet")) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"htmllm embed: validation_error: page source {source} holds no pages: "), err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_an_output_that_cannot_be_read_is_said_so_not_called_another_commands(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was "was not written by this version of htmllm embed; pass --overwrite to replace it": an
    invitation to replace a file its owner may have closed to this user, and not why the run stopped.
    (Root reads a chmod 000 file: opening it is patched.)"""
    from service.engine import Engine

    write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    out.write_bytes(b"PAR1 someone else's results")
    real_open = Path.open

    def closed(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == out:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    args = _args(checkpoint, tmp_path / "pages.jsonl", out)
    with monkeypatch.context() as patch:
        patch.setattr(Path, "open", closed)
        patch.setattr(Engine, "from_checkpoint", _not_loaded)
        assert main(args) == 1
    err = capsys.readouterr().err
    assert err == (
        f"htmllm embed: validation_error: {out} exists but cannot be read (Permission denied), so this run "
        "cannot tell whether it is its finished output: make it readable, or pass --overwrite to replace it "
        "unread\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "pages.jsonl"]
    with monkeypatch.context() as patch:
        patch.setattr(Path, "open", closed)
        assert main([*args, "--overwrite"]) == 0  # asked for: replaced unread
    assert pq.read_table(out).num_rows == 2


# --- a preprocessing process killed from outside (the OOM killer): not the page's failure ---

_KILLED_PAGE = "<p>the kernel's OOM killer picks the process pruning this page</p>"


def _pages_with_one_killed(path: Path) -> Path:
    rows = [("a", "<p>alpha beta gamma</p>"), ("killed", _KILLED_PAGE), ("c", "<p>delta epsilon</p>")]
    path.write_text("".join(json.dumps({"id": i, "html": html}) + "\n" for i, html in rows))
    return path


def test_a_page_whose_process_is_killed_from_outside_is_embedded_in_a_fresh_one(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was a `preprocess_failed` row ("crashed its preprocessing process (exit code -9)"), done for
    good: no resume read the page again, though nothing is wrong with it."""
    from tests.factories.worker_kills import kill_workers_holding

    source = _pages_with_one_killed(tmp_path / "pages.jsonl")
    clean = tmp_path / "clean.parquet"
    assert main([*_args(checkpoint, source, clean), "--preprocess-pool", "process"]) == 0
    out = tmp_path / "out.parquet"
    with monkeypatch.context() as patch:
        killed = kill_workers_holding(patch, _KILLED_PAGE.encode(), kills=1)
        assert main([*_args(checkpoint, source, out), "--preprocess-pool", "process"]) == 0
    assert len(killed) == 1
    assert "embedded this run (0 failed)" in capsys.readouterr().err
    table, expected = pq.read_table(out), pq.read_table(clean)
    assert table["error"].null_count == 3 and table["tokens"].to_pylist() == expected["tokens"].to_pylist()
    np.testing.assert_allclose(  # batched otherwise (the retry's timing): the same up to rounding
        np.array(table["embedding"].to_pylist()), np.array(expected["embedding"].to_pylist()), atol=1e-5
    )


def test_a_page_whose_process_is_killed_in_every_try_is_left_for_the_resume(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.engine.preprocessing import LOST_PROCESS_RETRIES
    from tests.factories.worker_kills import kill_workers_holding

    source = _pages_with_one_killed(tmp_path / "pages.jsonl")
    out = tmp_path / "out.parquet"
    args = [*_args(checkpoint, source, out, "--part-size", "1"), "--preprocess-pool", "process"]
    with monkeypatch.context() as patch:
        killed = kill_workers_holding(patch, _KILLED_PAGE.encode(), kills=LOST_PROCESS_RETRIES + 1)
        assert main(args) == 1
    assert len(set(killed)) == LOST_PROCESS_RETRIES + 1
    err = capsys.readouterr().err
    assert "1 documents were left for the next run (1 not_ready; first: not_ready:" in err, err
    assert "killed from outside" in err and not out.exists()
    parts = (tmp_path / "out.parquet.parts").glob("part-*.parquet")
    assert sorted(i for part in parts for i in pq.read_table(part)["index"].to_pylist()) == [0, 2]

    assert main(args) == 0  # the resume embeds it
    table = pq.read_table(out)
    assert table["index"].to_pylist() == [0, 1, 2] and table["error"].null_count == 3


def test_an_empty_heads_selection_scores_no_head_as_the_api_does(checkpoint: Path, tmp_path: Path) -> None:
    """`--heads ""` scored every head, as no --heads does; the API's `"heads": []` scores none."""
    write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    assert main([*_args(checkpoint, tmp_path / "pages.jsonl", out), "--heads", ""]) == 0
    table = pq.read_table(out)
    assert table.column_names == list(embed_command.FIXED_COLUMNS) and table["error"].null_count == 2
    assert json.loads(table.schema.metadata[b"htmllm.head_labels"]) == {}
    every = tmp_path / "every.parquet"
    assert main(_args(checkpoint, tmp_path / "pages.jsonl", every)) == 0
    assert pq.read_table(every).column_names[-3:] == ["page_type", "page_type.probs", "quality"]


# `main(argv)` in a fresh interpreter, then whether it imported torch (on stdout).
_MAIN_THEN_TORCH = (
    "import sys; from service.cli import main; s = main(sys.argv[1:]); "
    "print('torch' in sys.modules); sys.exit(s)"
)


def test_a_checkpoint_path_that_is_no_checkpoint_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    """`--checkpoint /nonexistent` imported torch (4-5 s) to say "/nonexistent/htmllm.json is missing",
    and a training run's folder was "not an htmllm checkpoint", its model/ unnamed."""
    write_pages(tmp_path / "pages.jsonl", 1)
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "htmllm.json").write_text("{}")  # the path check looks no further
    for checkpoint, message in (
        (tmp_path / "nonexistent", f"checkpoint directory {tmp_path / 'nonexistent'} does not exist"),
        (
            run,
            f"{run} is not an htmllm checkpoint (it holds no htmllm.json); "
            f"did you mean --checkpoint {run}/model?",
        ),
    ):
        args = _args(checkpoint, tmp_path / "pages.jsonl", tmp_path / "out.parquet")
        done = subprocess.run(
            [sys.executable, "-c", _MAIN_THEN_TORCH, *args],
            cwd=ROOT,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stdout) == (1, "False\n"), done.stderr
        assert done.stderr == f"htmllm embed: checkpoint_invalid: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl", "run"]


# --- an upgrade: the pruner's and tokenizers' versions are pinned as the options are ---


def _as_version(monkeypatch: pytest.MonkeyPatch, setting: str, value: str) -> None:
    """Make this process the htmllm of another pruner, or run with another tokenizers library."""
    from service.core import prune

    if setting == "prune_version":
        monkeypatch.setattr(prune, "PRUNE_VERSION", value)
    else:
        package = setting.removesuffix("_version")
        installed = resume_state.version
        monkeypatch.setattr(
            resume_state, "version", lambda name: value if name == package else installed(name)
        )


def _now(setting: str) -> str:
    from importlib.metadata import version

    return PRUNE_VERSION if setting == "prune_version" else version(setting.removesuffix("_version"))


UPGRADES = [("prune_version", "9"), ("selectolax_version", "0.3.0"), ("tokenizers_version", "0.19.0")]


@pytest.mark.parametrize(("setting", "old"), UPGRADES)
def test_a_resume_across_an_upgrade_of_the_pruner_or_tokenizers_is_refused_and_overwrite_starts_over(
    checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    old: str,
) -> None:
    """Neither was pinned: rows pruned (or tokenized) by the old version and the new were merged into one
    output, and its `htmllm.run` did not say which made it."""
    write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "1")
    with monkeypatch.context() as patch:
        _as_version(patch, setting, old)
        stop_before_merge(monkeypatch, args)
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err == (
        f"htmllm embed: validation_error: {out}.parts holds a run with other settings ({setting} {old} -> "
        f"{_now(setting)}); delete it, or pass --overwrite, to start over\n"
    )
    assert main([*args, "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert f"discarded the 3 part(s) of an interrupted run with other settings ({setting} {old} ->" in err
    assert "0 resumed from earlier runs, 3 embedded this run" in err
    recorded = json.loads(pq.read_schema(out).metadata[b"htmllm.run"])
    assert recorded[setting] == _now(setting)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "pages.jsonl"]


@pytest.mark.parametrize(("setting", "old"), UPGRADES)
def test_a_finished_output_of_another_pruner_or_tokenizers_is_not_complete(
    checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    old: str,
) -> None:
    write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out)
    with monkeypatch.context() as patch:
        _as_version(patch, setting, old)
        assert main(args) == 0
    assert json.loads(pq.read_schema(out).metadata[b"htmllm.run"])[setting] == old
    capsys.readouterr()
    assert main(args) == 1
    assert capsys.readouterr().err == (
        f"htmllm embed: validation_error: {out} was written with other settings ({setting} {old} -> "
        f"{_now(setting)}); pass --overwrite to replace it\n"
    )
    assert main([*args, "--overwrite"]) == 0
    assert json.loads(pq.read_schema(out).metadata[b"htmllm.run"])[setting] == _now(setting)


def test_an_older_htmllms_output_or_interrupted_run_is_another_version_and_says_so(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version before these were pinned recorded neither: its output passed for complete, and its
    interrupted run was resumed, whichever pruner had made its rows."""
    write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "1")
    older = (
        f"prune_version unset -> {PRUNE_VERSION}, selectolax_version unset -> {_now('selectolax_version')}, "
        f"tokenizers_version unset -> {_now('tokenizers_version')}"
    )
    assert main(args) == 0
    table = pq.read_table(out)
    metadata = dict(table.schema.metadata)
    settings = json.loads(metadata[b"htmllm.run"])
    del settings["prune_version"], settings["selectolax_version"], settings["tokenizers_version"]
    metadata[b"htmllm.run"] = json.dumps(settings, sort_keys=True).encode()
    pq.write_table(table.replace_schema_metadata(metadata), out)
    capsys.readouterr()
    assert main(args) == 1
    assert capsys.readouterr().err == (
        f"htmllm embed: validation_error: {out} was written with other settings ({older}; written by an "
        "older htmllm); pass --overwrite to replace it\n"
    )
    out.unlink()
    stop_before_merge(monkeypatch, args)
    pin = tmp_path / "out.parquet.parts" / "run.json"
    pin.write_text(json.dumps(settings), encoding="utf-8")
    capsys.readouterr()
    assert main(args) == 1
    assert f"holds a run with other settings ({older}; written by an older htmllm); delete it, or pass " in (
        capsys.readouterr().err
    )
    assert main([*args, "--overwrite"]) == 0
    assert "0 resumed from earlier runs, 2 embedded this run" in capsys.readouterr().err


def test_overwrite_starts_over_from_an_interrupted_run_over_a_changed_input_touching_nothing_else(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs said `--overwrite` fixes a refused interrupted run; it was refused all the same. Only the
    output's own parts go: a user's files beside the output stay."""
    source = tmp_path / "pages.jsonl"
    write_pages(source, 3)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, source, out, "--part-size", "1")
    stop_before_merge(monkeypatch, args)
    (tmp_path / ".out.parquet.backup").write_text("mine")
    (tmp_path / "out.parquet.parts.notes").write_text("mine too")
    write_pages(source, 2)
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "input changed since the interrupted run (" in err
    assert err.endswith(f"delete {out}.parts, or pass --overwrite, to start over\n"), err
    assert main([*args, "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert (
        "htmllm embed: --overwrite: discarded the 3 part(s) of an interrupted run over an input that " in err
    )
    assert "0 resumed from earlier runs, 2 embedded this run" in err
    assert pq.read_table(out)["id"].to_pylist() == ["p0", "p1"]
    assert (tmp_path / ".out.parquet.backup").read_text() == "mine"
    assert (tmp_path / "out.parquet.parts.notes").read_text() == "mine too"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".out.parquet.backup", "out.parquet", "out.parquet.parts.notes", "pages.jsonl"
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["out.parquet.gz", "out.GZ", "out.zst"])
def test_an_output_named_as_a_compressed_file_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """As `htmllm extract` refuses one: a Parquet file named `.gz` had been written, which `gzip -t` and
    `zcat` refuse (Parquet compresses inside)."""
    from service.engine import Engine

    source = tmp_path / "pages.jsonl"
    write_pages(source, 2)
    monkeypatch.setattr(Engine, "from_checkpoint", _not_loaded)
    assert main(_args(tmp_path / "no-checkpoint-needed", source, tmp_path / name)) == 1
    err = capsys.readouterr().err
    assert "names a compressed file, but htmllm embed writes a Parquet file" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl"]
