"""A finished run run again with other export options (`name`, `export_dtype`, `max_length`): what it
records of the training and of the re-export, and what it warns about."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from model_training.pretrain import train
from service.core.checkpoint import read_meta
from tests.model_training.test_pretrain import _build_run_inputs, _config


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reexport")
    _build_run_inputs(root, documents=24)
    return root


def _summary(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return summary


@pytest.mark.slow
def test_a_re_export_keeps_the_training_figures_and_records_itself(run_inputs: Path) -> None:
    """summary.json (and model/'s training record) used to be rewritten with the re-export session's
    figures: 0 tokens seen, its own seconds, held-out figures measured again at the new length."""
    out = run_inputs / "figures"
    common: dict[str, object] = {"eval_every": 0}
    train(_config(run_inputs, "figures", max_steps=2, **common))
    trained = _summary(out)
    assert trained["tokens_seen_this_session"] > 0
    training_before = read_meta(out / "model").training

    # A smaller max_steps is nothing to train for a finished run; the export options are applied.
    again = train(_config(run_inputs, "figures", max_steps=1, max_length=48, **common))
    assert again.steps == 2
    summary = _summary(out)
    exports = summary.pop("exports")
    assert summary == trained  # steps, total_steps 2 (not 1), tokens, seconds, held-out, final losses
    assert again.summary == {**trained, "exports": exports}
    assert [e["changes"] for e in exports] == [["max_length 64 -> 48"]]
    time.strptime(exports[0]["at"], "%Y-%m-%dT%H:%M:%SZ")

    training = read_meta(out / "model").training
    assert {key: training[key] for key in trained} == trained
    # The config recorded is the one trained with, only its export options changed.
    assert training["config"] == {**training_before["config"], "max_length": 48}
    assert training["exports"] == exports

    # A second re-export adds to the record; the training figures still stand.
    train(_config(run_inputs, "figures", max_steps=2, max_length=48, name="htmllm-v2", **common))
    summary = _summary(out)
    assert [e["changes"] for e in summary.pop("exports")] == [
        ["max_length 64 -> 48"],
        ["name 'htmllm-test' -> 'htmllm-v2'"],
    ]
    assert summary == trained
    meta = read_meta(out / "model")
    assert meta.name == "htmllm-v2" and meta.max_length == 48
    assert meta.training["config"] == {**training_before["config"], "max_length": 48, "name": "htmllm-v2"}


@pytest.mark.slow
def test_a_re_export_does_not_warn_about_training_it_does_not_do(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A new max_length used to warn that "the documents, their cut, order and masks from here on
    differ", and a new eps that "the steps from here on are trained with the new setting", with no step
    to come. A session that does train on is still told."""
    common: dict[str, object] = {"eval_every": 0}
    train(_config(run_inputs, "quiet", max_steps=2, **common))
    changed: dict[str, object] = {"max_length": 48, "eps": 1e-8}
    with caplog.at_level(logging.WARNING, logger="model_training.training_checkpoints"):
        again = train(_config(run_inputs, "quiet", max_steps=2, **common, **changed))
    assert again.steps == 2 and read_meta(again.model_dir or Path()).max_length == 48
    assert "resuming from" not in caplog.text
    # Trained on past the end, the same changes are what the new steps train with: said.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="model_training.training_checkpoints"):
        assert train(_config(run_inputs, "quiet", max_steps=3, **common, **changed)).steps == 3
    assert "with a changed max_length 64 -> 48: the documents, their cut" in caplog.text
    assert "with a changed eps 1e-06 -> 1e-08: the steps from here on are trained" in caplog.text
