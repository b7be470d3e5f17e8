"""Restarts of `htmllm train`: which model/ counts as a run's own, and what a resume warns about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_training import pretrain
from model_training.pretrain import train
from service.core.checkpoint import read_meta
from service.core.errors import HtmllmError
from tests.model_training.test_pretrain import _build_run_inputs, _config


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("restart")
    _build_run_inputs(root, documents=24)
    return root


def _trained_lr(model_dir: Path) -> float:
    return float(read_meta(model_dir).training["config"]["lr"])


@pytest.mark.slow
def test_a_run_started_over_and_killed_before_its_export_does_not_keep_the_old_model(
    run_inputs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common: dict[str, object] = {"max_steps": 2, "eval_every": 0}
    model_dir = run_inputs / "over" / "model"
    train(_config(run_inputs, "over", lr=3e-3, **common))
    assert _trained_lr(model_dir) == 3e-3

    def killed(new: Path, target: Path) -> None:  # the kill between the final checkpoint and the swap
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(pretrain, "swap_in", killed)
        with pytest.raises(KeyboardInterrupt):
            train(_config(run_inputs, "over", lr=2e-3, **common), resume=False)
    # --no-resume used to leave the earlier run's model/ in place (and its summary with it) ...
    assert not model_dir.exists()
    # ... and the next plain run, at step == total, took it for its own final model.
    result = train(_config(run_inputs, "over", lr=2e-3, **common))
    assert result.model_dir == model_dir and _trained_lr(model_dir) == 2e-3
    checkpoint = read_meta(run_inputs / "over" / "checkpoints" / "step-00000002").training
    assert read_meta(model_dir).training["run_id"] == checkpoint["run_id"]
    summary = json.loads((run_inputs / "over" / "summary.json").read_text(encoding="utf-8"))
    assert summary["run_id"] == checkpoint["run_id"]


@pytest.mark.slow
def test_a_plain_run_that_finds_no_checkpoint_keeps_the_earlier_model_until_its_own_export(
    run_inputs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints deleted to free disk (or an --out holding a model/ and its heads): a plain run may
    not delete that model/ before it has trained anything; only --no-resume starts by discarding."""
    import shutil

    common: dict[str, object] = {"max_steps": 2, "eval_every": 0}
    model_dir = run_inputs / "kept" / "model"
    train(_config(run_inputs, "kept", lr=3e-3, **common))
    shutil.rmtree(run_inputs / "kept" / "checkpoints")

    def killed(new: Path, target: Path) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(pretrain, "swap_in", killed)
        with pytest.raises(KeyboardInterrupt):
            train(_config(run_inputs, "kept", lr=2e-3, **common))
    assert _trained_lr(model_dir) == 3e-3  # still the earlier model, whole
    # The next run resumes the new run's final checkpoint and exports it: the old model/ is not its own.
    result = train(_config(run_inputs, "kept", lr=2e-3, **common))
    assert result.model_dir == model_dir and _trained_lr(model_dir) == 2e-3


@pytest.mark.slow
def test_a_resume_warns_when_the_data_behind_the_same_paths_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _build_run_inputs(tmp_path, documents=24)
    common: dict[str, object] = {"max_steps": 3, "eval_every": 0}
    train(_config(tmp_path, "run", **common), stop_at_step=1)
    with caplog.at_level("WARNING", logger="model_training.training_checkpoints"):
        train(_config(tmp_path, "run", **common), stop_at_step=2)
    assert "changed data" not in caplog.text  # the same data: nothing to say
    # Shards prepared again and teacher embedded again into the same directories, with more pages.
    _build_run_inputs(tmp_path, documents=32)
    caplog.clear()
    with caplog.at_level("WARNING", logger="model_training.training_checkpoints"):
        train(_config(tmp_path, "run", **common))
    assert "changed data" in caplog.text
    assert f"the shards in {tmp_path / 'shards'}" in caplog.text
    assert f"the teacher vectors in {tmp_path / 'teacher'}" in caplog.text
    assert "rows 24 -> 32" in caplog.text  # what the teacher says; the test manifest has no counts


@pytest.mark.slow
def test_a_resume_with_another_max_length_says_so(run_inputs: Path, caplog: pytest.LogCaptureFixture) -> None:
    common: dict[str, object] = {"max_steps": 2, "eval_every": 0}
    train(_config(run_inputs, "length", max_length=64, **common), stop_at_step=1)
    with caplog.at_level("WARNING", logger="model_training.training_checkpoints"):
        train(_config(run_inputs, "length", max_length=48, **common))
    assert "max_length 64 -> 48" in caplog.text


@pytest.mark.slow
def test_no_progress_also_silences_the_bar_transformers_shows_when_saving(
    run_inputs: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as hf_logging

    train(_config(run_inputs, "quiet", max_steps=2, eval_every=0, checkpoint_every=1, progress=False))
    assert "Writing model shards" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # switched back on for the rest of the process


def test_a_missing_shards_directory_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(HtmllmError, match="not a shards directory"):
        train(_config(tmp_path, "run", shards=str(tmp_path / "nonexist")))
