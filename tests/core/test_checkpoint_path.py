"""The checkpoint path check (`htmllm embed --checkpoint`, `htmllm serve --model-path`): one line, before
anything is loaded, and the checkpoint beside a wrong path suggested."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.core.checkpoint_path import CheckpointPathError, check_checkpoint_path
from service.core.errors import CheckpointError, ErrorCode
from tests.factories.disk import closed_directory


def _checkpoint(path: Path) -> Path:
    """A directory the path check takes for a checkpoint: it looks for htmllm.json, and reads nothing."""
    path.mkdir(parents=True)
    (path / "htmllm.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_checkpoint_directory_passes_the_path_check(tmp_path: Path) -> None:
    check_checkpoint_path(_checkpoint(tmp_path / "ckpt"), "--checkpoint")


def test_a_missing_checkpoint_is_said_to_be_a_missing_directory(tmp_path: Path) -> None:
    """It was "<path>/htmllm.json is missing", after seconds of imports."""
    missing = tmp_path / "nonexistent"
    with pytest.raises(CheckpointPathError) as refused:
        check_checkpoint_path(missing, "--checkpoint")
    assert str(refused.value) == f"checkpoint directory {missing} does not exist"
    assert isinstance(refused.value, CheckpointError) and refused.value.code is ErrorCode.CHECKPOINT_INVALID
    assert refused.value.suggestion is None


def test_a_training_runs_folder_suggests_its_model(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "x" / "pretrain"
    model = _checkpoint(run / "model")
    with pytest.raises(CheckpointPathError) as refused:
        check_checkpoint_path(run, "--model-path")
    assert str(refused.value) == (
        f"{run} is not an htmllm checkpoint (it holds no htmllm.json); did you mean --model-path {model}?"
    )
    assert refused.value.suggestion == model


def test_a_file_of_a_checkpoint_suggests_its_directory(tmp_path: Path) -> None:
    model = _checkpoint(tmp_path / "model")
    with pytest.raises(
        CheckpointPathError, match=f"is not a directory .*; did you mean --checkpoint {model}\\?"
    ):
        check_checkpoint_path(model / "model.safetensors", "--checkpoint")


def test_a_directory_with_no_checkpoint_in_or_under_it_suggests_nothing(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()  # a model/ without htmllm.json is no checkpoint either
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(CheckpointPathError) as refused:
        check_checkpoint_path(tmp_path, "--checkpoint")
    assert str(refused.value) == f"{tmp_path} is not an htmllm checkpoint (it holds no htmllm.json)"
    assert refused.value.suggestion is None
    with pytest.raises(CheckpointPathError, match="is not a directory") as file:
        check_checkpoint_path(tmp_path / "weights.bin", "--checkpoint")
    assert file.value.suggestion is None


def test_a_checkpoint_closed_to_this_user_is_said_to_be_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line with the path and the reason, not a bare PermissionError (a traceback under serve)."""
    checkpoint = _checkpoint(tmp_path / "ckpt")
    closed_directory(monkeypatch, tmp_path)  # tmp_path itself can be looked at, what is in it not
    with pytest.raises(
        CheckpointPathError,
        match=re.escape(f"checkpoint {checkpoint} cannot be looked at: Permission denied"),
    ):
        check_checkpoint_path(checkpoint, "--checkpoint")
    monkeypatch.undo()
    closed_directory(monkeypatch, checkpoint)  # the directory can be looked at, its htmllm.json not
    with pytest.raises(CheckpointPathError, match=r"htmllm\.json cannot be looked at: Permission denied"):
        check_checkpoint_path(checkpoint, "--checkpoint")
