"""`htmllm embed`: how a run ends short of its input, keeping what it finished: a part the disk will not
take (the run stops at once), SIGHUP (as SIGTERM and Ctrl-C)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.commands.embed_state import ParquetParts
from service.engine import Document, DocumentResult, Engine
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.cli import write_pages


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("embed") / "tiny")


def _args(checkpoint: Path, source: Path, output: Path, *options: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1", *options]  # fmt: skip


def test_a_part_the_disk_will_not_take_ends_the_run_at_once_and_the_resume_does_the_rest(
    checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a full disk the run embedded on for minutes, each part's write failing and its rows lost, with
    a "Task exception was never retrieved" traceback, and said why only at its end."""
    n = 40
    write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "2", "--batch-size", "4")
    write, embed = ParquetParts.write, Engine.embed
    writes = calls = 0
    calls_at_failure = -1

    def full_from_the_second(self: ParquetParts, rows: list[dict[str, Any]], path: Path) -> None:
        nonlocal writes, calls_at_failure
        writes += 1
        if writes == 2:
            calls_at_failure = calls
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, rows, path)

    async def counted(self: Engine, docs: list[Document], **kw: Any) -> list[DocumentResult]:
        nonlocal calls
        calls += 1
        return await embed(self, docs, **kw)

    with monkeypatch.context() as patch, caplog.at_level(logging.ERROR):
        patch.setattr(ParquetParts, "write", full_from_the_second)
        patch.setattr(Engine, "embed", counted)
        assert main(args) == 1
        gc.collect()  # a task whose failure nobody took says so when it is collected
    assert capsys.readouterr().err == "htmllm embed: [Errno 28] No space left on device\n"
    assert "never retrieved" not in caplog.text
    assert writes == 2  # none after the failure, the Ctrl-C path's included
    # No page taken after it; of those in flight (8: twice --batch-size) none had yet to start.
    assert calls - calls_at_failure < 8, (calls_at_failure, calls)
    (part,) = (tmp_path / "out.parquet.parts").glob("part-*.parquet")
    assert pq.read_table(part)["index"].to_pylist() == [0, 1]

    assert main(args) == 0
    assert capsys.readouterr().err.endswith(
        f"wrote {n} documents to {out}: 2 resumed from earlier runs, {n - 2} embedded this run (0 failed)\n"
    )
    assert pq.read_table(out)["index"].to_pylist() == list(range(n))


def test_ctrl_c_while_a_full_disk_stops_the_run_still_says_the_disk_is_full(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who presses Ctrl-C while the run stops for a full disk (its pages in flight cancelled) was
    told "interrupted", with status 130, and never that the disk is full, the one thing to fix before the
    next run. The disk's failure is the run's end: its line and its status, 1."""
    n = 40
    write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "2", "--batch-size", "4")
    write, embed = ParquetParts.write, Engine.embed
    writes = 0
    pressed = False

    def full_from_the_second(self: ParquetParts, rows: list[dict[str, Any]], path: Path) -> None:
        nonlocal writes
        writes += 1
        if writes == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, rows, path)

    async def ctrl_c_when_cancelled(self: Engine, docs: list[Document], **kw: Any) -> list[DocumentResult]:
        nonlocal pressed
        try:
            return await embed(self, docs, **kw)
        except asyncio.CancelledError:  # the stop the full disk began: Ctrl-C, once
            if not pressed:
                pressed = True
                signal.raise_signal(signal.SIGINT)
            raise

    with monkeypatch.context() as patch:
        patch.setattr(ParquetParts, "write", full_from_the_second)
        patch.setattr(Engine, "embed", ctrl_c_when_cancelled)
        assert main(args) == 1
    assert pressed
    assert capsys.readouterr().err == "htmllm embed: [Errno 28] No space left on device\n"
    (part,) = (tmp_path / "out.parquet.parts").glob("part-*.parquet")
    assert pq.read_table(part)["index"].to_pylist() == [0, 1]


def _sighup_kills(*_: object) -> None:
    raise AssertionError("SIGHUP's default: the process ends at once, its held rows lost")


@contextlib.contextmanager
def _sighup_given_back() -> Iterator[None]:
    """As `sigterm_given_back`, for SIGHUP: a run that leaves it to its handler before fails the test
    (SIGHUP's default would end the test process), and must give that handler back."""
    previous = signal.signal(signal.SIGHUP, _sighup_kills)
    try:
        yield
        assert signal.getsignal(signal.SIGHUP) is _sighup_kills
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_sighup_keeps_what_was_finished_as_sigterm_does(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminal or SSH session a run was started from closed: SIGHUP ended it on the spot, the
    finished rows held for the next part lost. It ends as SIGTERM does, with SIGHUP's status, 129."""
    n = 40
    write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    args = _args(checkpoint, tmp_path / "pages.jsonl", out, "--part-size", "5", "--batch-size", "4")
    embed = Engine.embed
    calls = 0

    async def embed_then_sighup(self: Engine, docs: list[Document], **kw: Any) -> list[DocumentResult]:
        nonlocal calls
        calls += 1
        if calls == 12:
            signal.raise_signal(signal.SIGHUP)
        return await embed(self, docs, **kw)

    with _sighup_given_back(), monkeypatch.context() as patch:
        patch.setattr(Engine, "embed", embed_then_sighup)
        assert main(args) == 129
    parts = tmp_path / "out.parquet.parts"
    assert capsys.readouterr().err == (
        f"htmllm embed: hung up (SIGHUP); what was finished is kept in {parts}: run the same command "
        "again to go on\n"
    )
    tables = [pq.read_table(p) for p in parts.glob("part-*.parquet")]
    assert 0 < sum(t.num_rows for t in tables) < n
    assert all(t["error"].null_count == t.num_rows for t in tables), [t["error"] for t in tables]

    assert main(args) == 0
    assert pq.read_table(out)["index"].to_pylist() == list(range(n))
