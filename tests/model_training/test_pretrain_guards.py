"""What `htmllm train` refuses up front or stops on: a swapped tokenizer, a diverging run, a distillation
loss with no negatives, configs it cannot read. Each used to train silently or end in a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from model_training.pretrain import TrainingDivergedError, train
from model_training.train_config import TrainConfig, load_config
from model_training.train_logs import log_record
from service.core.errors import HtmllmError
from tests.factories.tokenizer import build_tiny_tokenizer
from tests.model_training.test_pretrain import _build_run_inputs, _config


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("guards")
    _build_run_inputs(root, documents=24)
    return root


def _strict(text: str) -> Any:
    """JSON as a strict reader takes it: bare NaN / Infinity are refused."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("other", [{"vocab_size": 384}, {"tags": 20}], ids=["smaller", "same-size"])
def test_a_tokenizer_that_did_not_make_the_shards_is_refused(tmp_path: Path, other: dict[str, int]) -> None:
    """A smaller one had been an IndexError traceback, one of the same size trained silently and the
    checkpoint recorded it as the model's tokenizer. The refused run leaves no run directory it made (an
    empty one had passed for a run)."""
    _build_run_inputs(tmp_path, documents=12)
    swapped = build_tiny_tokenizer(**other)
    assert swapped.sha256 != build_tiny_tokenizer().sha256
    swapped.save(tmp_path / "shards" / "tokenizer.json")
    with pytest.raises(HtmllmError, match="not the tokenizer the shards were made with"):
        train(_config(tmp_path, "swapped", max_steps=1))
    assert not (tmp_path / "swapped").exists()
    (tmp_path / "kept").mkdir()  # a run directory that was there stays
    with pytest.raises(HtmllmError, match="not the tokenizer the shards were made with"):
        train(_config(tmp_path, "kept", max_steps=1))
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "checkpoints").exists()


def test_a_diverging_run_stops_at_its_first_non_finite_loss(run_inputs: Path) -> None:
    """lr 1e6 had run on with NaN losses to its first checkpoint, refused there as holding NaN, and left
    bare NaN (not JSON) in metrics.jsonl."""
    with pytest.raises(TrainingDivergedError, match=r"diverged at step (\d+): losses mlm .*distil .*total"):
        train(_config(run_inputs, "diverge", lr=1e6, warmup_frac=0.0, max_steps=20, checkpoint_every=10))
    out = run_inputs / "diverge"
    records = [_strict(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert records and all(r["split"] == "train" for r in records)
    assert not (out / "checkpoints" / "step-00000010").exists()  # stopped before it, not at it


def test_the_diverged_message_goes_to_stderr_as_one_line(
    run_inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    config = run_inputs / "diverge.toml"
    config.write_text("[optim]\nwarmup_frac = 0.0\n", encoding="utf-8")
    args = ["train", "--config", str(config), "--shards", str(run_inputs / "shards"), "--teacher",
            str(run_inputs / "teacher"), "--out", str(run_inputs / "diverge-cli"), "--preset", "tiny",
            "--lr", "1e6", "--max-steps", "20", "--batch-size", "4", "--max-length", "64", "--device", "cpu",
            "--no-progress"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("htmllm train: validation_error: training diverged at step")


def test_metrics_records_are_strict_json(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    log_record(metrics, None, {"step": 1, "split": "heldout", "cosine": float("nan"), "top1": float("inf")})
    assert _strict(metrics.read_text(encoding="utf-8")) == {
        "step": 1, "split": "heldout", "cosine": None, "top1": None,
    }  # fmt: skip


def test_a_micro_batch_of_one_document_cannot_distil(run_inputs: Path) -> None:
    """The contrastive loss takes its negatives from the micro-batch: with one document it was exactly 0,
    and batch_size 1 with grad_accum trained without distillation."""
    with pytest.raises(HtmllmError, match="no negatives"):
        train(_config(run_inputs, "single", batch_size=1, grad_accum=4, max_steps=1))
    assert not (run_inputs / "single").exists()  # refused before anything was written
    # Without distillation there is nothing to refuse.
    weights = {"mlm": 1.0, "bow": 1.0, "distil": 0.0}
    result = train(_config(run_inputs, "single", batch_size=1, max_steps=1, loss_weights=weights))
    assert result.steps == 1


def test_a_temperature_too_small_to_train_with_is_refused() -> None:
    """1e-40 passed as "finite positive" and gave NaN losses from the first step."""
    for value in (1e-40, 1e-4):
        with pytest.raises(HtmllmError, match="config: temperature must be at least"):
            TrainConfig.from_dict({"temperature": value})
    assert TrainConfig.from_dict({"temperature": 0.05}).temperature == 0.05


def test_a_config_that_is_not_utf8_or_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    latin = tmp_path / "latin.toml"
    latin.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))  # a UnicodeDecodeError traceback before
    with pytest.raises(HtmllmError, match="not valid TOML: not UTF-8"):
        load_config(latin)
    with pytest.raises(HtmllmError, match="is a directory"):  # "does not exist" before
        load_config(tmp_path)
    for path in (latin, tmp_path):
        assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("htmllm train: validation_error: "), err


def test_a_truncated_trainer_state_is_named_not_a_traceback(run_inputs: Path) -> None:
    """torch.load's EOFError had been a traceback naming no file."""
    config = _config(run_inputs, "cut", max_steps=3, eval_every=0, checkpoint_every=1)
    train(config, stop_at_step=1)
    state = run_inputs / "cut" / "checkpoints" / "step-00000001" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(
        HtmllmError, match=r"cannot resume from .*step-00000001: .*trainer_state\.pt cannot be read"
    ):
        train(config)


def test_a_stop_step_behind_the_resumed_run_is_refused(run_inputs: Path) -> None:
    """Resumed at step 2, `stop_at_step=1` had trained nothing and answered no model without a word."""
    config = _config(run_inputs, "behind", max_steps=4, eval_every=0, checkpoint_every=1)
    train(config, stop_at_step=2)
    with pytest.raises(HtmllmError, match=r"--stop-at-step\) 1 is behind the run, which is at step 2"):
        train(config, stop_at_step=1)
    assert train(config, stop_at_step=2).steps == 2  # the step it is at: nothing to do, no error


def test_a_stop_at_step_says_where_it_stopped_and_how_to_go_on(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A time-boxed session ended with `"model": null` and no line on where it stopped or what next."""
    config = _config(run_inputs, "boxed", max_steps=3, eval_every=0)
    with caplog.at_level("INFO", logger="model_training.pretrain"):
        assert train(config, stop_at_step=1).model_dir is None
    checkpoint = run_inputs / "boxed" / "checkpoints" / "step-00000001"
    assert checkpoint.is_dir()
    assert (
        f"stopped at step 1 of 3 (--stop-at-step 1) with checkpoint {checkpoint}: run the command again "
        "without --stop-at-step (or with a later one) to go on from there"
    ) in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="model_training.pretrain"):
        assert train(config).steps == 3
    assert "stopped at step" not in caplog.text  # a run that finished is not said to have stopped


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("bad\nname", "must be printable"),
        ("nul\x00", "must be printable"),
        (" padded", "must not begin or end with a space"),
        ("x" * 201, "at most 200 characters, not 201"),
    ],
)
def test_a_model_name_the_service_cannot_serve_is_refused_with_the_config(name: str, said: str) -> None:
    """ "" and names with a newline or NUL trained and were served; the empty one made
    `GET /v1/models/{id}` unreachable."""
    with pytest.raises(HtmllmError, match=f"config: name .*{said}"):
        TrainConfig.from_dict({"name": name})
    assert TrainConfig.from_dict({"name": "org/htmllm-v2 (mini)"}).name == "org/htmllm-v2 (mini)"


def test_missing_teacher_vectors_say_where_the_path_came_from(
    run_inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "runs/teacher/teacher.json is missing" named a path the user never gave. The line also names the
    way to train with no teacher at all (loss_weights.distil = 0, which used to need the vectors too:
    test_pretrain_without_teacher)."""
    monkeypatch.chdir(tmp_path)  # where runs/teacher is not
    config = _config(run_inputs, "no-teacher", teacher=None)  # neither the config nor --teacher sets one
    with pytest.raises(HtmllmError) as refused:
        train(config)
    assert str(refused.value) == (
        "no teacher vectors in runs/teacher (the default: neither the config nor --teacher set one): "
        f"teacher.json is missing; run `htmllm teacher embed --input {run_inputs / 'shards'} --out DIR` and "
        "pass --teacher DIR (or set teacher in the config), or set loss_weights.distil = 0 to train without "
        "distillation (MLM and bag-of-words only)"
    )
    for given in ("/nowhere/vectors", "runs/teacher"):  # given, even the default's path is the user's
        with pytest.raises(HtmllmError, match=rf"^no teacher vectors in {given}: teacher\.json is missing"):
            train(_config(run_inputs, "no-teacher", teacher=given))
    assert not (run_inputs / "no-teacher").exists()
