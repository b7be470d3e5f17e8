"""A `loss_weights.distil = 0` run from before that meant "no teacher" has a distillation head in its
checkpoints that was never trained (`untrained_distil_head`). Resumed with distillation on, it was
accepted: the run switched its objective mid-way, the head's weights those of no training, where a
current checkpoint without distillation is refused. And the line saying its head is dropped was logged
again by a finished run run again, which trains nothing and drops nothing for good."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from model_training.pretrain import train
from service.core.errors import HtmllmError
from tests.model_training.test_pretrain import _build_run_inputs, _config
from tests.model_training.test_resume_from_before_no_teacher import NO_DISTIL, _as_before_no_teacher

COMMON: dict[str, object] = {
    "batch_size": 2,
    "grad_accum": 1,
    "max_steps": 4,
    "eval_every": 0,
    "checkpoint_every": 2,
}


def _dropped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is dropped with its optimizer state" in r.getMessage()]


@pytest.mark.slow
def test_distillation_cannot_be_switched_on_by_resuming_a_run_from_before_no_teacher(tmp_path: Path) -> None:
    _build_run_inputs(tmp_path, documents=20)
    train(_config(tmp_path, "old", loss_weights=NO_DISTIL, **COMMON), stop_at_step=2)
    checkpoints = tmp_path / "old" / "checkpoints"
    _as_before_no_teacher(checkpoints / "step-00000002")

    # Refused as a current checkpoint without distillation is (the same DataError), naming the way on.
    with pytest.raises(HtmllmError, match=r"trained without distillation") as refused:
        train(_config(tmp_path, "old", **COMMON))  # the default weights distil
    message = str(refused.value)
    assert "never trained" in message
    assert "resume it with loss_weights.distil = 0" in message and "--no-resume" in message
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-00000002"]
    # The command it was started with still resumes it.
    assert train(_config(tmp_path, "old", loss_weights=NO_DISTIL, **COMMON)).steps == 4


@pytest.mark.slow
def test_a_finished_run_from_before_no_teacher_run_again_says_nothing_of_dropping_its_head(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _build_run_inputs(tmp_path, documents=20)
    config = _config(tmp_path, "old", loss_weights=NO_DISTIL, **COMMON)
    train(config, stop_at_step=2)
    # Its checkpoints of step 2, kept for the last part.
    shutil.copytree(tmp_path / "old" / "checkpoints", tmp_path / "step-2")
    train(config)
    # A run finished under the old code: its last checkpoint has the untrained head too.
    _as_before_no_teacher(tmp_path / "old" / "checkpoints" / "step-00000004")
    caplog.set_level("INFO")

    rerun = train(config)  # nothing to train or export

    assert rerun.steps == 4 and rerun.model_dir is not None
    assert any("nothing to train or export" in r.getMessage() for r in caplog.records)
    assert _dropped_lines(caplog) == []
    # Exported again with another name: nothing is trained, no run goes on without the head either.
    caplog.clear()
    renamed = train(_config(tmp_path, "old", name="renamed", loss_weights=NO_DISTIL, **COMMON))
    assert renamed.model_dir is not None
    assert _dropped_lines(caplog) == []

    # A session that trains on from such a checkpoint says it, once.
    shutil.rmtree(tmp_path / "old" / "checkpoints")
    shutil.copytree(tmp_path / "step-2", tmp_path / "old" / "checkpoints")
    _as_before_no_teacher(tmp_path / "old" / "checkpoints" / "step-00000002")
    caplog.clear()
    assert train(config).steps == 4
    assert len(_dropped_lines(caplog)) == 1
