"""A run's totals over its sessions: the time, tokens and number of the `train` calls that made its
model, recorded in every checkpoint and in summary.json and the export, and given by the model card.

summary.json had said `seconds_this_session` and `tokens_seen_this_session` alone: a run killed and
resumed reported the last session's time as the pretraining time, its earlier sessions lost.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from model_training import default_model
from model_training.pretrain import SUMMARY_FILE, train
from model_training.training_checkpoints import session_totals
from service.core.checkpoint import read_meta
from tests.model_training.test_model_card_figures import _run
from tests.model_training.test_pretrain import _build_run_inputs, _config


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sessions")
    _build_run_inputs(root, documents=24)
    return root


def _summary(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    return summary


def test_a_session_adds_to_the_totals_of_the_checkpoint_it_resumed() -> None:
    assert session_totals(None, seconds=12.34, tokens=500) == {
        "sessions": 1,
        "seconds_all_sessions": 12.3,
        "tokens_seen_all_sessions": 500,
    }
    recorded = {"sessions": 2, "seconds_all_sessions": 100.5, "tokens_seen_all_sessions": 9000, "step": 8}
    assert session_totals(recorded, seconds=20.0, tokens=1000) == {
        "sessions": 3,
        "seconds_all_sessions": 120.5,
        "tokens_seen_all_sessions": 10000,
    }


@pytest.mark.parametrize("value", [None, True, "100", -1.0, math.inf, math.nan])
def test_a_checkpoint_without_totals_leaves_them_unknown_not_this_sessions(value: object) -> None:
    """Written before the totals (or edited into no count): the earlier sessions are unknown, and this
    session's figures must not pass for the run's."""
    recorded = {key: value for key in ("sessions", "seconds_all_sessions", "tokens_seen_all_sessions")}
    recorded = {key: v for key, v in recorded.items() if v is not None}
    assert session_totals(recorded, seconds=5.0, tokens=10) == {
        "sessions": None,
        "seconds_all_sessions": None,
        "tokens_seen_all_sessions": None,
    }


@pytest.mark.slow
def test_a_killed_and_resumed_run_records_the_totals_of_its_sessions(run_inputs: Path) -> None:
    common: dict[str, object] = {"max_steps": 4, "checkpoint_every": 2, "eval_every": 0}
    whole = train(_config(run_inputs, "whole", **common)).summary
    assert whole["sessions"] == 1 and whole["tokens_seen_all_sessions"] == whole["tokens_seen_this_session"]
    assert whole["seconds_all_sessions"] == whole["seconds_this_session"]

    # Killed during step 4, after the checkpoint of step 2 (the stop at step 3 left one more: gone).
    out = run_inputs / "killed"
    train(_config(run_inputs, "killed", **common), stop_at_step=3)
    shutil.rmtree(out / "checkpoints" / "step-00000003")
    (out / "checkpoints" / "latest").write_text("step-00000002\n", encoding="utf-8")
    first = read_meta(out / "checkpoints" / "step-00000002").training
    assert first["sessions"] == 1 and first["seconds_all_sessions"] > 0

    resumed = train(_config(run_inputs, "killed", **common)).summary
    assert resumed["sessions"] == 2
    # Every step's tokens once: those of the killed session's step 3, trained again, are not counted twice.
    assert resumed["tokens_seen_all_sessions"] == whole["tokens_seen_this_session"]
    assert resumed["tokens_seen_all_sessions"] == (
        first["tokens_seen_all_sessions"] + resumed["tokens_seen_this_session"]
    )
    assert resumed["seconds_all_sessions"] == pytest.approx(
        first["seconds_all_sessions"] + resumed["seconds_this_session"], abs=0.11
    )
    assert resumed["seconds_all_sessions"] > resumed["seconds_this_session"]
    # summary.json and the export's training record say the same.
    assert _summary(out) == resumed
    training = read_meta(out / "model").training
    assert {key: training[key] for key in resumed} == resumed
    last = read_meta(out / "checkpoints" / "step-00000004").training
    assert (last["sessions"], last["tokens_seen_all_sessions"]) == (2, whole["tokens_seen_this_session"])


def test_the_card_gives_the_pretraining_time_of_all_sessions(tmp_path: Path) -> None:
    run = _run(tmp_path)
    summary = json.loads((run / "pretrain" / SUMMARY_FILE).read_text(encoding="utf-8"))
    summary.update({"sessions": 3, "seconds_all_sessions": 40.5, "tokens_seen_all_sessions": 9000})
    (run / "pretrain" / SUMMARY_FILE).write_text(json.dumps(summary), encoding="utf-8")
    card = default_model.bundle(run, tmp_path / "assets", curve=None, eval_dir=None).read_text("utf-8")
    assert "pretraining 40.5; pretraining's is the sum of the run's 3 sessions (" in card
    assert "12.5" not in card and "not counted" not in card

    summary.update({"sessions": 1, "seconds_all_sessions": 12.5})
    (run / "pretrain" / SUMMARY_FILE).write_text(json.dumps(summary), encoding="utf-8")
    card = default_model.bundle(run, tmp_path / "assets", curve=None, eval_dir=None).read_text("utf-8")
    assert "pretraining 12.5.\n" in card
