"""What `htmllm train --no-resume` says when stopped: whether it had discarded the earlier run yet."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from model_training import pretrain
from model_training.training_checkpoints import STATE_FILE


def _checkpoint(out: Path, step: int) -> Path:
    """A step directory as `latest_checkpoint` finds it (its trainer_state.pt need not be readable)."""
    directory = out / "checkpoints" / f"step-{step:08d}"
    directory.mkdir(parents=True)
    (directory / STATE_FILE).write_bytes(b"")
    (out / "checkpoints" / "latest").write_text(directory.name + "\n", encoding="utf-8")
    return directory


def _stopped_in(
    monkeypatch: pytest.MonkeyPatch, before_ctrl_c: Callable[[Path], None]
) -> Callable[..., pretrain.TrainResult]:
    def train(config: object, **kwargs: object) -> pretrain.TrainResult:
        before_ctrl_c(Path(config.out))  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "train", train)
    return train


def _train(out: Path, *extra: str) -> list[str]:
    return ["train", "--out", str(out), "--no-progress", *extra]


def test_stopped_before_it_discarded_the_earlier_run_no_resume_says_the_same_command_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the data loads: the line advised resuming the earlier run (`run it without
    --no-resume`), the one the user had asked to throw away, and nothing had been discarded yet."""
    from service.cli import main

    out = tmp_path / "run"
    last = _checkpoint(out, 40)
    _stopped_in(monkeypatch, lambda out: None)
    assert main(_train(out, "--no-resume")) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"htmllm train: interrupted; the earlier run's checkpoints were not discarded yet (the last is "
        f"step 40, {last}) and the new run wrote none: run the same command again to start over"
    ]


def test_stopped_after_its_own_first_checkpoint_no_resume_names_that_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from service.cli import main

    out = tmp_path / "run"
    earlier = _checkpoint(out, 2)
    os.utime(earlier / STATE_FILE, (1e9, 1e9))  # written long before; the new run's is written now

    def discarded_then_checkpointed(out: Path) -> None:
        # The new run reaches the same step as the earlier run's last checkpoint: a checkpoint of its own.
        shutil.rmtree(out / "checkpoints")
        _checkpoint(out, 2)

    _stopped_in(monkeypatch, discarded_then_checkpointed)
    assert main(_train(out, "--no-resume")) == 130
    mine = out / "checkpoints" / "step-00000002"
    assert capsys.readouterr().err.splitlines() == [
        f"htmllm train: interrupted; the last checkpoint is step 2 ({mine}): run it without --no-resume "
        "to resume from it"
    ]
    # No earlier run at all: a checkpoint found is the new run's.
    shutil.rmtree(out)

    def checkpointed(out: Path) -> None:
        _checkpoint(out, 4)

    _stopped_in(monkeypatch, checkpointed)
    assert main(_train(out, "--no-resume")) == 130
    assert "the last checkpoint is step 4" in capsys.readouterr().err
    # Plain runs are as they were: the same command resumes.
    _stopped_in(monkeypatch, lambda out: None)
    assert main(_train(out)) == 130
    assert "run the same command to resume from it" in capsys.readouterr().err
