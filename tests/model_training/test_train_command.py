"""`htmllm train` as a new user meets it: which option sets the run length, what it says while it runs
(with and without a bar), and what it writes to a log that is not a terminal."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from model_training.pretrain import train
from tests.model_training.test_pretrain import _build_run_inputs, _config

# 24 documents, every tenth held out: 21 train. At 4 a batch, one epoch is 5 steps.
EPOCH_STEPS = 5


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("command")
    _build_run_inputs(root, documents=24)
    # As every shipped config does (configs/tiny.toml: 20), the file sets max_steps.
    (root / "config.toml").write_text(
        '[model]\npreset = "tiny"\nmax_length = 64\n\n[optim]\nbatch_size = 4\nmax_steps = 20\n\n'
        "[loss]\ndistil_rank = 8\n\n[run]\n"
        'device = "cpu"\neval_every = 0\ncheckpoint_every = 0\ntensorboard = false\nlog_every = 2\n',
        encoding="utf-8",
    )
    return root


def _args(root: Path, out: str, *extra: str) -> list[str]:
    return ["train", "--config", str(root / "config.toml"), "--shards", str(root / "shards"), "--teacher",
            str(root / "teacher"), "--out", str(root / out), "--no-progress", *extra]  # fmt: skip


def _run_length(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("run length: ")]


def test_epochs_on_the_command_line_replace_the_configs_max_steps(
    run_inputs: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """`--epochs 1` had silently run the config's 20 steps: max_steps, set in the file, won."""
    from service.cli import main

    caplog.set_level(logging.INFO, logger="model_training")
    assert main(_args(run_inputs, "epochs", "--epochs", "1")) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == EPOCH_STEPS
    assert _run_length(caplog) == [
        f"run length: {EPOCH_STEPS} steps, from epochs 1 (21 training documents, 4 per step; max_steps 0)"
    ]
    caplog.clear()
    assert main(_args(run_inputs, "steps", "--max-steps", "3")) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3
    assert _run_length(caplog) == ["run length: 3 steps, from max_steps (epochs is not used)"]


def test_epochs_and_max_steps_together_are_a_one_line_usage_error(
    run_inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    assert main(_args(run_inputs, "both", "--epochs", "1", "--max-steps", "3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["htmllm train: --epochs and --max-steps both set the run length: pass one of them"]
    assert not (run_inputs / "both").exists()
    # --max-steps 0 means "from epochs": nothing to choose between.
    assert main(_args(run_inputs, "zero", "--epochs", "1", "--max-steps", "0")) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == EPOCH_STEPS


def test_without_a_bar_each_logged_step_is_a_log_line(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With --no-progress a run printed nothing until its final JSON (16 minutes for the default model)."""
    caplog.set_level(logging.INFO, logger="model_training")
    train(_config(run_inputs, "quiet", max_steps=5, log_every=2, progress=False))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 1/5", "step 2/5", "step 4/5", "step 5/5"]
    assert all(" mlm " in line and " distil " in line and line.endswith(" tokens/s") for line in lines)


def test_off_a_terminal_nothing_is_redrawn(run_inputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the bar on and stderr a file, transformers' "Writing model shards" bar at every checkpoint
    was carriage-return redraws; our bar is whole lines there (`service.core.progress`)."""
    train(_config(run_inputs, "log", max_steps=5, checkpoint_every=2, eval_every=0, progress=True))
    err = capsys.readouterr().err
    assert "\r" not in err and "Writing model shards" not in err
    bar = [line for line in err.splitlines() if line.startswith("train: ")]
    # Its first and last states (a line at most every 30 s between): the loss postfix set at each logged
    # step had redrawn it, a line per step.
    assert len(bar) <= 3 and bar[-1].startswith("train: 100%|##########| 5/5") and "mlm=" in bar[-1]
