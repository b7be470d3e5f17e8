"""Training checkpoints on disk: which one a resume takes."""

from __future__ import annotations

from pathlib import Path

from model_training.training_checkpoints import STATE_FILE, latest_checkpoint


def _fake_checkpoint(checkpoints: Path, step: int) -> Path:
    path = checkpoints / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / STATE_FILE).write_bytes(b"state")
    return path


def test_latest_checkpoint_falls_back_to_the_newest_complete_one(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    assert latest_checkpoint(tmp_path) is None
    _fake_checkpoint(checkpoints, 4)
    newest = _fake_checkpoint(checkpoints, 12)
    (checkpoints / "step-00000016.tmp").mkdir()  # a save the kill interrupted
    (checkpoints / "step-00000020").mkdir()  # no trainer state: not a resumable checkpoint
    # The pointer names a directory that is gone: resuming must not silently start from scratch.
    (checkpoints / "latest").write_text("step-00000016\n", encoding="utf-8")
    assert latest_checkpoint(tmp_path) == newest
    (checkpoints / "latest").unlink()
    assert latest_checkpoint(tmp_path) == newest
    (checkpoints / "latest").write_text("step-00000004\n", encoding="utf-8")
    assert latest_checkpoint(tmp_path) == checkpoints / "step-00000004"  # the pointer wins when valid
