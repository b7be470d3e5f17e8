"""A run with `loss_weights.distil = 0` started before that meant "no teacher" (2f2824a) read teacher
vectors (the docs told users to pass --teacher) and built a distillation head it trained at weight 0,
which is to say never. Its own command then refused to resume or re-export it: "it was trained with a
distillation head ... resume it with loss_weights.distil above 0 and its teacher". It resumes now, the
untrained head and its optimizer state dropped, and continues exactly as a run without distillation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from model_training.pretrain import train
from model_training.training_checkpoints import STATE_FILE
from service.core.checkpoint import load_checkpoint
from tests.model_training.test_pretrain import TEACHER_DIM, _build_shards, _config

NO_DISTIL = {"mlm": 0.1, "bow": 1.0, "distil": 0.0}
RANK = 8  # _config's distil_rank
HIDDEN = 32  # the tiny preset's


def _as_before_no_teacher(checkpoint: Path) -> None:
    """Rewrite a checkpoint of a run without distillation in the layout the code before 2f2824a wrote
    for `loss_weights.distil = 0`: a teacher recorded and read, a distillation head (registered last,
    so its parameters end both AdamW groups, the second group's indices shifted by the first's two), its
    AdamW moments (zero: its gradients were 0 at weight 0), and a distillation scale and weight 0."""
    meta_file = checkpoint / "htmllm.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    training = meta["training"]
    training["teacher"] = {"dim": TEACHER_DIM, "model": "a teacher", "view": "text", "rows": 20}
    training["data_identity"]["teacher"] = "0" * 64
    training["config"]["teacher"] = "runs/teacher"
    meta_file.write_text(json.dumps(meta), encoding="utf-8")

    state: dict[str, Any] = torch.load(checkpoint / STATE_FILE, weights_only=True)
    assert state["distil_head"] is None
    head = {
        "down.weight": torch.randn(RANK, HIDDEN),
        "up.weight": torch.randn(TEACHER_DIM, RANK),
        "up.bias": torch.zeros(TEACHER_DIM),
    }
    state["distil_head"] = head
    optimizer = state["optimizer"]
    decay, no_decay = optimizer["param_groups"]
    step = optimizer["state"][decay["params"][0]]["step"]
    n_decay, n_no_decay = len(decay["params"]), len(no_decay["params"])
    old_state = {
        (index if index < n_decay else index + 2): value for index, value in optimizer["state"].items()
    }
    new_ids = {"down.weight": n_decay, "up.weight": n_decay + 1, "up.bias": n_decay + 2 + n_no_decay}
    for name, index in new_ids.items():
        zeros = torch.zeros_like(head[name])
        old_state[index] = {"step": step.clone(), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}
    decay["params"] = list(range(n_decay + 2))
    no_decay["params"] = list(range(n_decay + 2, n_decay + 3 + n_no_decay))
    optimizer["state"] = old_state
    aggregator = state["aggregator"]
    aggregator["weights"] = dict(NO_DISTIL)
    aggregator["scales"] = {**aggregator["scales"], "distil": 4.0}
    torch.save(state, checkpoint / STATE_FILE)


def _encoder(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(model_dir).model.encoder.state_dict()


@pytest.mark.slow
def test_a_run_without_distillation_from_before_it_meant_no_teacher_resumes_with_its_own_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _build_shards(tmp_path, documents=20)
    common: dict[str, object] = {
        "loss_weights": NO_DISTIL,
        "batch_size": 2,
        "grad_accum": 1,
        "max_steps": 4,
        "eval_every": 2,
        "checkpoint_every": 2,
    }
    train(_config(tmp_path, "fresh", **common), stop_at_step=2)
    shutil.copytree(tmp_path / "fresh" / "checkpoints", tmp_path / "old" / "checkpoints")
    _as_before_no_teacher(tmp_path / "old" / "checkpoints" / "step-00000002")
    fresh = train(_config(tmp_path, "fresh", **common))

    caplog.set_level("INFO", logger="model_training.training_checkpoints")
    old = train(_config(tmp_path, "old", **common))  # the command it was started with

    assert old.steps == 4 and old.model_dir is not None and fresh.model_dir is not None
    dropped = [r.getMessage() for r in caplog.records if "distillation head" in r.getMessage()]
    assert len(dropped) == 1 and "is dropped with its optimizer state" in dropped[0]
    # The teacher it recorded is no data this run reads: no "resuming with changed data" about it.
    assert not [r for r in caplog.records if "changed data" in r.getMessage()]
    # The encoder goes on exactly as the run without distillation does: the head's optimizer entries
    # gone, the others where a run built without the head has them.
    fresh_encoder, old_encoder = _encoder(fresh.model_dir), _encoder(old.model_dir)
    assert fresh_encoder.keys() == old_encoder.keys()
    assert all(torch.equal(fresh_encoder[name], old_encoder[name]) for name in fresh_encoder)
    last = Path("checkpoints") / "step-00000004" / STATE_FILE
    fresh_state = torch.load(tmp_path / "fresh" / last, weights_only=True)
    old_state = torch.load(tmp_path / "old" / last, weights_only=True)
    assert old_state["distil_head"] is None
    assert old_state["optimizer"]["param_groups"] == fresh_state["optimizer"]["param_groups"]
    assert old_state["optimizer"]["state"].keys() == fresh_state["optimizer"]["state"].keys()
    for index, moments in fresh_state["optimizer"]["state"].items():
        assert all(
            torch.equal(value, old_state["optimizer"]["state"][index][k]) for k, value in moments.items()
        )
    training = load_checkpoint(old.model_dir).meta.training
    assert training["teacher"] is None and training["config"]["teacher"] is None

    # Run again with another export option, the finished run is exported again, not refused.
    renamed = train(_config(tmp_path, "old", name="renamed", **common))
    assert renamed.model_dir is not None and load_checkpoint(renamed.model_dir).meta.name == "renamed"
