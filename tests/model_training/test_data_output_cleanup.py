"""`prepare_shards` that fails leaves no output directory it made itself: a bad corpus row, no page
prepared, a full disk or Ctrl-C while the shards were written had left an empty `--out` (or one of
part of the shards and no manifest) that looked like a preparation to whoever listed it later. A
directory that existed before the run, or that holds anything the run did not write, is kept."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from model_training import data
from model_training.data import MANIFEST_FILE, NO_EXTRACTION, DataError, prepare_shards, read_manifest
from service.core.errors import HtmllmError
from tests.model_training.test_data import _tokenizer_file, _write_corpus

OPTIONS: dict[str, object] = {"extractor": NO_EXTRACTION, "workers": 1, "progress": False}


def _corpus_nothing_survives(root: Path) -> Path:
    corpus = root / "deep.jsonl"
    corpus.write_text(json.dumps({"id": "x", "html": "<div>" * 10_000}) + "\n", encoding="utf-8")
    return corpus


def _corpus_unreadable_row(root: Path) -> Path:
    corpus = _write_corpus(root, 3)
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    return corpus


@pytest.mark.parametrize("corpus", [_corpus_nothing_survives, _corpus_unreadable_row])
def test_a_failed_run_removes_the_directories_it_made(tmp_path: Path, corpus: object) -> None:
    source = corpus(tmp_path)  # type: ignore[operator]
    out = tmp_path / "runs" / "today" / "shards"
    with pytest.raises(HtmllmError):
        prepare_shards(source, out, _tokenizer_file(tmp_path), **OPTIONS)  # type: ignore[arg-type]
    assert not (tmp_path / "runs").exists()


def test_a_failed_run_keeps_a_directory_that_existed(tmp_path: Path) -> None:
    tok = _tokenizer_file(tmp_path)
    parent = tmp_path / "runs"
    empty = parent / "empty"
    empty.mkdir(parents=True)
    with pytest.raises(DataError, match="no page"):
        prepare_shards(_corpus_nothing_survives(tmp_path), empty, tok, **OPTIONS)  # type: ignore[arg-type]
    assert empty.is_dir() and not any(empty.iterdir())
    # Made under a parent that existed: the run's own directory goes, the parent stays.
    with pytest.raises(DataError, match="no page"):
        prepare_shards(
            _corpus_nothing_survives(tmp_path),
            parent / "new",
            tok,
            **OPTIONS,  # type: ignore[arg-type]
        )
    assert sorted(p.name for p in parent.iterdir()) == ["empty"]
    # An earlier preparation there is kept as it was: the run failed before writing anything.
    done = tmp_path / "done"
    prepare_shards(_write_corpus(tmp_path, 4), done, tok, **OPTIONS)  # type: ignore[arg-type]
    before = {p.name: p.read_bytes() for p in done.iterdir()}
    with pytest.raises(HtmllmError, match="not JSON"):
        prepare_shards(_corpus_unreadable_row(tmp_path), done, tok, **OPTIONS)  # type: ignore[arg-type]
    assert {p.name: p.read_bytes() for p in done.iterdir()} == before
    assert read_manifest(done)["shards"]


@pytest.mark.parametrize(
    "failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()], ids=repr
)
def test_a_run_that_fails_while_writing_removes_its_shards_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    """Shards written, then the disk full (or Ctrl-C) at the manifest: part of the shards and no
    manifest was left in a directory made for the run."""
    written: list[str] = []

    def fail(out: Path, *args: object, **kwargs: object) -> None:
        written.extend(sorted(p.name for p in out.iterdir()))
        raise failure

    monkeypatch.setattr(data, "write_manifest", fail)
    out = tmp_path / "new" / "shards"
    with pytest.raises(type(failure)):
        prepare_shards(
            _write_corpus(tmp_path, 12),
            out,
            _tokenizer_file(tmp_path),
            shard_size=5,
            **OPTIONS,  # type: ignore[arg-type]
        )
    assert written == ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    assert not (tmp_path / "new").exists()


def test_what_the_run_did_not_write_is_never_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file put into the run's new directory meanwhile keeps it (the run's own shards go); a run that
    failed after its manifest was in place (a Ctrl-C on the way out) is complete and kept whole."""
    tok = _tokenizer_file(tmp_path)
    out = tmp_path / "shards"
    real = data.write_manifest

    def someone_writes_then_disk_full(directory: Path, *args: object, **kwargs: object) -> None:
        (directory / "notes.txt").write_text("mine", encoding="utf-8")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data, "write_manifest", someone_writes_then_disk_full)
    with pytest.raises(OSError, match="No space"):
        prepare_shards(_write_corpus(tmp_path, 6), out, tok, **OPTIONS)  # type: ignore[arg-type]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    def complete_then_ctrl_c(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "write_manifest", complete_then_ctrl_c)
    late = tmp_path / "late"
    with pytest.raises(KeyboardInterrupt):
        prepare_shards(_write_corpus(tmp_path, 6), late, tok, **OPTIONS)  # type: ignore[arg-type]
    assert (late / MANIFEST_FILE).is_file() and read_manifest(late)["shards"]
