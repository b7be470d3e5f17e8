"""`loss_weights.distil = 0` is a run without a teacher: MLM + bag-of-words only, for a language with no
good teacher model. It used to refuse to start without teacher vectors (read "even with distil = 0"),
built and checkpointed a distillation head it never trained, reported its random projection's cosine as
held-out figures and printed 0.000 distillation figures in the model card."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model_training.batches import SplitData
from model_training.default_model import bundle
from model_training.heldout_eval import evaluate
from model_training.pretrain import SUMMARY_FILE, train
from model_training.pretraining_model import PretrainingModel, all_special_ids
from model_training.run_data import load_run_data
from model_training.train_config import DEFAULT_TEACHER_DIR
from model_training.train_logs import read_metrics
from model_training.training_checkpoints import STATE_FILE
from service.core.checkpoint import load_checkpoint
from service.core.errors import HtmllmError
from service.core.modeling import HtmlEncoderModel, build_config
from tests.factories.tokenizer import build_tiny_tokenizer
from tests.model_training.test_pretrain import _build_run_inputs, _build_shards, _config

NO_DISTIL = {"mlm": 0.1, "bow": 1.0, "distil": 0.0}
TEACHER_FIGURES = {"cosine", "centroid_cosine", "top1", "distil_loss"}


@pytest.mark.slow
def test_a_run_without_distillation_trains_resumes_and_is_bundled_with_no_teacher_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _build_shards(tmp_path, documents=20)
    monkeypatch.chdir(tmp_path)  # the config's default teacher directory, runs/teacher, is not there
    common: dict[str, object] = {
        "teacher": DEFAULT_TEACHER_DIR,
        "loss_weights": NO_DISTIL,
        # One document per micro-batch: the contrastive loss's need for negatives is no concern here.
        "batch_size": 1,
        "grad_accum": 2,
        "max_steps": 3,
        "eval_every": 2,
        "checkpoint_every": 2,
    }
    out = tmp_path / "pretrain"
    first = train(_config(tmp_path, "pretrain", **common), stop_at_step=2)
    assert first.steps == 2 and first.model_dir is None
    state = torch.load(out / "checkpoints" / "step-00000002" / STATE_FILE, weights_only=True)
    assert state["distil_head"] is None  # no head is built, so none is saved or in the optimizer
    assert state["aggregator"]["weights"] == {"mlm": 0.1, "bow": 1.0}

    # Resumed with another temperature, the distillation loss's: unused here, no warning about it.
    caplog.set_level("WARNING", logger="model_training.training_checkpoints")
    result = train(_config(tmp_path, "pretrain", temperature=0.05, **common))  # resumes from step 2
    assert result.steps == 3 and result.model_dir is not None
    assert not [r for r in caplog.records if "temperature" in r.getMessage()]
    records = read_metrics(out / "metrics.jsonl")
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == [1, 2, 3]
    for record in train_records:
        assert {"mlm", "bow", "u_mlm", "u_bow"} <= set(record)
        assert "distil" not in record and "u_distil" not in record
    heldout = [r for r in records if r["split"] == "heldout"]
    assert [r["step"] for r in heldout] == [2, 3]
    for record in heldout:
        assert {"mlm_loss", "bow_loss", "documents"} <= set(record) and not TEACHER_FIGURES & set(record)
    assert (out / "training_curve.png").is_file()

    training = load_checkpoint(result.model_dir).meta.training
    assert training["teacher"] is None and training["data_identity"]["teacher"] is None
    # The config's teacher, given but never read, is not recorded as if it had been.
    assert training["config"]["teacher"] is None
    assert not TEACHER_FIGURES & set(training["heldout"])
    assert "distil" not in training["final_train"]
    summary = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    for heldout in (training["heldout"], summary["heldout"]):
        assert heldout["documents"] == 2 and isinstance(heldout["documents"], int)  # a count, not 2.0

    # The card says that no distillation was used, instead of 0.000 figures and a teacher it cannot read.
    card = bundle(tmp_path, tmp_path / "bundle", curve=None, eval_dir=None).read_text(encoding="utf-8")
    assert "- Teacher: none; no distillation was used (`loss_weights.distil = 0`)." in card
    assert "bag-of-words from [CLS] (no distillation);" in card
    assert "| MLM / BOW loss, held out |" in card
    assert "cosine" not in card and "distillation loss" not in card and "top-1" not in card
    assert not (tmp_path / "runs").exists() and not (tmp_path / "teacher").exists()


@pytest.mark.slow
def test_distillation_cannot_be_switched_on_or_off_by_a_resume(tmp_path: Path) -> None:
    """A checkpoint with a distillation head has its weights and AdamW moments; one without has
    neither: the two cannot continue each other, and the refusal says how to resume or start over."""
    _build_run_inputs(tmp_path, documents=20)
    common: dict[str, object] = {"max_steps": 3, "eval_every": 0, "batch_size": 2, "grad_accum": 1}
    train(_config(tmp_path, "off", loss_weights=NO_DISTIL, **common), stop_at_step=1)
    with pytest.raises(HtmllmError, match=r"trained without distillation .* loss_weights\.distil = 0, or"):
        train(_config(tmp_path, "off", **common))
    train(_config(tmp_path, "on", **common), stop_at_step=1)
    with pytest.raises(
        HtmllmError, match=r"trained with a distillation head \(teacher vectors of 12 dimensions\)"
    ):
        train(_config(tmp_path, "on", loss_weights=NO_DISTIL, **common))
    # Another weight above 0 stays a loss setting the resume trains with.
    weights = {"mlm": 0.1, "bow": 1.0, "distil": 0.5}
    assert train(_config(tmp_path, "on", loss_weights=weights, **common)).steps == 3


def test_evaluation_without_a_distillation_head_leaves_the_teacher_figures_out() -> None:
    tokenizer = build_tiny_tokenizer()
    model = HtmlEncoderModel.from_config(build_config("tiny", tokenizer, max_length=32), pooling="cls")
    pretraining = PretrainingModel(
        model,
        tokenizer.special_ids,
        teacher_dim=None,
        rank=4,
        temperature=0.1,
        special_ids=all_special_ids(tokenizer),
    )
    assert pretraining.distil_head is None and pretraining.loss_names == ("mlm", "bow")
    assert not [name for name, _ in pretraining.named_parameters() if "distil" in name]
    ids = [np.asarray(tokenizer.encode(f"<p>page {i} text</p>", max_length=32).ids) for i in range(3)]
    data = SplitData(ids=ids, teacher=np.zeros((3, 0), np.float32), doc_ids=["a", "b", "c"])
    config = _config(Path("."), "unused", max_length=32)
    figures = evaluate(pretraining, data, config=config, device=torch.device("cpu"), train_centroid=None)
    assert set(figures) == {"documents", "mlm_loss", "bow_loss"}
    assert figures["documents"] == 3 and isinstance(figures["documents"], int)


def test_a_teacher_named_for_a_run_without_distillation_is_said_not_to_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning compared the path with the default: `--teacher runs/teacher` got none, and a teacher
    that does not exist was "the teacher vectors in X". Named by the user (flag or config), it is said
    not to be read, as vectors only where there are some; not named, nothing is said."""
    _, teacher = _build_run_inputs(tmp_path, documents=20)
    monkeypatch.chdir(tmp_path)  # where runs/teacher is not
    caplog.set_level("WARNING", logger="model_training.run_data")
    said = {}
    for given in (None, DEFAULT_TEACHER_DIR, str(teacher)):
        caplog.clear()
        load_run_data(_config(tmp_path, "unused", teacher=given, loss_weights=NO_DISTIL))
        said[given] = [record.getMessage() for record in caplog.records]
    prefix = "loss_weights.distil = 0: training without distillation; "
    assert said[None] == []
    assert said[DEFAULT_TEACHER_DIR] == [
        prefix + "the teacher named by --teacher or the config, runs/teacher (it holds no teacher vectors), "
        "is not read"
    ]
    assert said[str(teacher)] == [
        prefix + f"the teacher vectors in {teacher} (--teacher or the config's teacher) are not read"
    ]
