"""`export_onnx_locked`'s directory lock: every exporter into a directory holds it, whatever happens
while it waits for it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

import service.engine.onnx_export as onnx_export


def test_a_failing_wait_notice_never_drops_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`on_wait` raising OSError (`htmllm export-onnx` printing its notice to a closed pipe, EPIPE) was
    taken for a file system without flock: the export ran without the lock, beside the export holding
    it. The wait still happens and the export runs under the lock. (The other holder is a patched
    `flock`: no second process, no timing.)"""
    real_flock = fcntl.flock
    calls: list[str] = []

    def held_by_another_export(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB and not calls:
            calls.append("tried")
            raise BlockingIOError(11, "Resource temporarily unavailable")
        calls.append("tried" if operation & fcntl.LOCK_NB else "waited")
        real_flock(fd, operation)

    def closed_pipe(directory: Path) -> None:
        calls.append("said")
        raise BrokenPipeError(32, "Broken pipe")

    exported: list[bool] = []

    def export(checkpoint: object, out: Path, **_: object) -> Path:
        fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: conflicts with a holder
            exported.append(False)
        except BlockingIOError:
            exported.append(True)
        finally:
            os.close(fd)
        return out

    monkeypatch.setattr(fcntl, "flock", held_by_another_export)
    monkeypatch.setattr(onnx_export, "export_onnx", export)
    out = tmp_path / "graphs" / "model.onnx"
    assert onnx_export.export_onnx_locked(object(), out, fingerprint="f", on_wait=closed_pipe) == out  # type: ignore[arg-type]
    assert calls == ["tried", "said", "waited"]
    assert exported == [True], "exported without the directory's lock"
