"""The heads lock's file: gone once a save lets go of it, ignored by every reader while it is there (a
process killed holding it leaves it), re-entrant within a thread, and never held by two at once although
its holder removes it."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from service.core import heads_stage
from service.core.checkpoint import checkpoint_fingerprint, copy_checkpoint, read_meta, save_heads
from service.core.heads_stage import heads_lock
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint

# What a checkpoint with two heads holds: the format's files and nothing else (docs/engine.md).
_FORMAT_FILES = ["config.json", "heads", "htmllm.json", "model.safetensors", "tokenizer.json"]


def _files(root: Path) -> list[str]:
    return sorted(str(file.relative_to(root)) for file in root.rglob("*"))


def _topic(dim: int) -> dict[str, tuple[HeadSpec, TaskHead]]:
    spec = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8)
    return {"topic": (spec, TaskHead(spec, dim))}


def test_a_finished_save_leaves_no_lock_file(tmp_path: Path) -> None:
    """heads/.pending.lock had stayed in every checkpoint saved (save_checkpoint and save_heads alike),
    and `cp -r`, `kubectl cp` and image builds copied it into every copy of the model."""
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    heads = ["heads/page_type.safetensors", "heads/quality.safetensors"]
    assert _files(ckpt) == sorted([*_FORMAT_FILES, *heads])
    save_heads(ckpt, _topic(read_meta(ckpt).embedding_dim))
    assert _files(ckpt) == sorted([*_FORMAT_FILES, *heads, "heads/topic.safetensors"])


def test_a_lock_file_left_by_a_killed_holder_is_read_by_no_reader_and_removed_by_the_next_holder(
    ckpt: Path, tmp_path: Path
) -> None:
    """A process killed while it held the lock leaves its file: it changes no checkpoint's fingerprint
    (what `htmllm embed` pins and an ONNX graph records), is not copied, and the next save removes it."""
    fingerprint = checkpoint_fingerprint(ckpt)
    (ckpt / "heads" / heads_stage.LOCK_FILE).write_bytes(b"")
    assert checkpoint_fingerprint(ckpt) == fingerprint
    copy_checkpoint(ckpt, tmp_path / "copy")
    assert heads_stage.LOCK_FILE not in {file.name for file in (tmp_path / "copy").rglob("*")}
    assert checkpoint_fingerprint(tmp_path / "copy") == fingerprint
    save_heads(ckpt, _topic(read_meta(ckpt).embedding_dim))
    assert not (ckpt / "heads" / heads_stage.LOCK_FILE).exists()


def test_the_heads_lock_is_reentrant_within_a_thread(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`htmllm heads train` holds the lock over `save_heads` and its card: taken again through another
    descriptor, a flock waits on its own holder for ever. Asked without waiting (LOCK_NB), so that a
    lock that is not re-entrant fails here rather than hanging."""
    real_flock = fcntl.flock
    monkeypatch.setattr(fcntl, "flock", lambda fd, operation: real_flock(fd, operation | fcntl.LOCK_NB))
    lock_file = ckpt / "heads" / heads_stage.LOCK_FILE
    with heads_lock(ckpt):
        with heads_lock(ckpt):
            save_heads(ckpt, _topic(read_meta(ckpt).embedding_dim))  # takes it a third time
        assert lock_file.exists()  # the inner holds left it to the outer one
        outcome: list[str] = []
        other = threading.Thread(target=_probe, args=(ckpt, outcome))
        other.start()
        other.join()
        assert outcome == ["blocked"]  # another thread still waits
    assert not lock_file.exists()
    assert [spec.name for spec in read_meta(ckpt).heads] == ["page_type", "quality", "topic"]


def _probe(ckpt: Path, outcome: list[str]) -> None:
    """Take the heads lock without waiting (fcntl.flock is patched to LOCK_NB by the caller)."""
    try:
        with heads_lock(ckpt):
            outcome.append("free")
    except BlockingIOError:
        outcome.append("blocked")


def test_a_waiter_whose_lock_file_was_removed_meanwhile_takes_the_new_one(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holder A lets go and removes the file that waiter B has open; B then holds the lock of a file no
    longer there, and C, creating a new one, would lock that at once: both in. B must see that its file
    is gone and lock the one at the path, so that C waits. C asks without waiting (LOCK_NB)."""
    real_flock = fcntl.flock
    b_waits, b_holds, c_asked = threading.Event(), threading.Event(), threading.Event()

    def flock(fd: int, operation: int) -> None:
        name = threading.current_thread().name
        if name == "B" and not b_waits.is_set():
            b_waits.set()  # B opened the file A holds, and waits for it
        real_flock(fd, operation | (fcntl.LOCK_NB if name == "C" else 0))

    monkeypatch.setattr(fcntl, "flock", flock)
    outcome: list[str] = []
    errors: list[BaseException] = []

    def b() -> None:
        try:
            with heads_lock(ckpt):
                b_holds.set()
                assert c_asked.wait(30), "C never asked"
        except BaseException as exc:  # reported below
            errors.append(exc)
            b_holds.set()

    def c() -> None:
        _probe(ckpt, outcome)
        c_asked.set()

    waiter = threading.Thread(target=b, name="B")
    with heads_lock(ckpt):  # A: this thread
        waiter.start()
        assert b_waits.wait(30), "B never got to the lock"
    assert b_holds.wait(30), "B never took the lock"
    asker = threading.Thread(target=c, name="C")
    asker.start()
    asker.join()
    waiter.join()
    assert not errors, errors
    assert outcome == ["blocked"]
    assert not (ckpt / "heads" / heads_stage.LOCK_FILE).exists()
