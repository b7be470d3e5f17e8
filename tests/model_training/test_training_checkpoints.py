"""Training checkpoints on disk: which one a resume takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from model_training import training_checkpoints
from model_training.pretrain import train
from model_training.training_checkpoints import LATEST_FILE, STATE_FILE, latest_checkpoint
from tests.model_training.test_pretrain import _build_run_inputs, _config


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


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["trainer state", "latest pointer"])
def test_a_ctrl_c_during_a_checkpoint_leaves_the_one_before_to_resume_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """Ctrl-C (or SIGTERM, taken as Ctrl-C) while step 4's checkpoint is written: cut before its
    directory is renamed into place, or after, before `latest` names it. Either way the resume takes
    step 2's, whole, and trains on to the end."""
    _build_run_inputs(tmp_path, documents=24)
    config = _config(tmp_path, "run", checkpoint_every=2, eval_every=0)
    real_save, real_replace = torch.save, os.replace

    def save(state: object, path: Path) -> None:
        if Path(path).parent.name == "step-00000004.tmp":
            raise KeyboardInterrupt
        real_save(state, path)

    def replace(source: str | Path, target: str | Path) -> None:
        if Path(target).name == LATEST_FILE and "step-00000004" in Path(source).read_text(encoding="utf-8"):
            raise KeyboardInterrupt
        real_replace(source, target)

    with monkeypatch.context() as patch:
        if cut == "trainer state":
            patch.setattr(training_checkpoints.torch, "save", save)
        else:
            patch.setattr(training_checkpoints.os, "replace", replace)
        with pytest.raises(KeyboardInterrupt):
            train(config)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert latest_checkpoint(tmp_path / "run") == checkpoints / "step-00000002"
    resumed = train(config)
    assert resumed.steps == 6 and resumed.model_dir is not None
    # The cut save's `.tmp` is gone with the save of step 4 that replaced it (keep_checkpoints 2).
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-00000004", "step-00000006"]
