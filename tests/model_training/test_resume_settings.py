"""What a resume or a re-run of `htmllm train` does with settings changed since the checkpoint: the
optimizer's (applied, and said), the export options of a finished run (re-exported, task heads kept),
and a run length the run has already reached (refused unless the run had finished)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from model_training.pretrain import train
from model_training.training_checkpoints import STATE_FILE, with_live_settings
from service.core.checkpoint import load_checkpoint, read_meta, save_heads
from service.core.errors import HtmllmError
from service.core.modeling import HeadSpec, TaskHead
from tests.model_training.test_pretrain import _build_run_inputs, _config


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume-settings")
    _build_run_inputs(root, documents=24)
    return root


def _groups(out: Path, step: int) -> list[dict[str, object]]:
    state = torch.load(out / "checkpoints" / f"step-{step:08d}" / STATE_FILE, weights_only=True)
    groups: list[dict[str, object]] = state["optimizer"]["param_groups"]
    return groups


@pytest.mark.slow
def test_a_resume_trains_with_the_changed_optimizer_settings_and_says_so(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The saved optimizer groups used to win over a changed weight_decay, beta1/beta2 and eps, while
    htmllm.json recorded the new values as the ones trained with."""
    common: dict[str, object] = {"max_steps": 3, "eval_every": 0}
    out = run_inputs / "optimizer"
    train(_config(run_inputs, "optimizer", **common), stop_at_step=1)
    new: dict[str, object] = {
        "weight_decay": 0.5,
        "beta1": 0.8,
        "beta2": 0.9,
        "eps": 1e-8,
        "temperature": 0.05,
    }
    with caplog.at_level(logging.WARNING, logger="model_training.training_checkpoints"):
        train(_config(run_inputs, "optimizer", **common, **new), stop_at_step=2)
    decay, no_decay = _groups(out, 2)
    assert decay["weight_decay"] == 0.5 and no_decay["weight_decay"] == 0.0  # biases, norms stay undecayed
    for group in (decay, no_decay):
        assert tuple(group["betas"]) == (0.8, 0.9) and group["eps"] == 1e-8  # type: ignore[arg-type]
    recorded = read_meta(out / "checkpoints" / "step-00000002").training["config"]
    assert {key: recorded[key] for key in new} == new
    said = caplog.text
    assert "weight_decay 0.01 -> 0.5" in said and "beta1 0.9 -> 0.8" in said and "beta2 0.98 -> 0.9" in said
    assert "eps 1e-06 -> 1e-08" in said and "temperature 0.1 -> 0.05" in said
    # The same settings again: nothing changed, nothing said.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="model_training.training_checkpoints"):
        train(_config(run_inputs, "optimizer", **common, **new))
    assert "resuming from" not in caplog.text


def test_the_optimizer_a_resume_builds_keeps_its_own_fused_setting() -> None:
    """A run started on CPU (unfused AdamW) and resumed on CUDA (fused) stayed unfused: the saved groups
    replaced the live ones whole. torch allows switching, the step counts cast as the new group wants."""
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(4, 4))

    def adamw(*, fused: bool) -> torch.optim.AdamW:
        return torch.optim.AdamW([weights], lr=1e-3, weight_decay=0.01, fused=fused)

    before = adamw(fused=False)
    weights.grad = torch.randn(4, 4)
    before.step()
    saved = before.state_dict()
    after = adamw(fused=True)
    after.load_state_dict(with_live_settings(saved, after))
    assert after.param_groups[0]["fused"] is True
    step = after.state[weights]["step"]
    assert step.dtype == torch.float32 and step.device == weights.device and float(step) == 1.0
    after.step()  # the fused kernel accepts the carried-over state
    assert float(after.state[weights]["step"]) == 2.0
    # And back: a fused run resumed where the optimizer is built unfused.
    unfused = adamw(fused=False)
    unfused.load_state_dict(with_live_settings(after.state_dict(), unfused))
    assert unfused.param_groups[0]["fused"] is False
    unfused.step()
    assert float(unfused.state[weights]["step"]) == 3.0
    # The moments are the interrupted run's, not reset.
    assert torch.equal(unfused.state[weights]["exp_avg_sq"], after.state[weights]["exp_avg_sq"])


def _add_head(model_dir: Path) -> None:
    """What `htmllm heads train` does to a finished run's model/."""
    spec = HeadSpec(name="kind", kind="classification", labels=["a", "b"], hidden=4, metrics={"f1": 0.5})
    save_heads(model_dir, {"kind": (spec, TaskHead(spec, 32))})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"name": "htmllm-test-v2"}, "name 'htmllm-test' -> 'htmllm-test-v2'"),
        ({"export_dtype": "float16"}, "export_dtype 'float32' -> 'float16'"),
        ({"max_length": 48}, "max_length 64 -> 48"),
    ],
)
def test_re_exporting_a_finished_run_with_other_export_options_keeps_its_task_heads(
    run_inputs: Path, caplog: pytest.LogCaptureFixture, changed: dict[str, object], said: str
) -> None:
    """Only `name`, `export_dtype` or `max_length` changed: model/ was exported again without the heads
    trained into it (htmllm.json `heads: []`), though the encoder is the same."""
    out_name = f"reexport-{next(iter(changed))}"
    common: dict[str, object] = {"max_steps": 2, "eval_every": 0}
    model_dir = train(_config(run_inputs, out_name, **common)).model_dir
    assert model_dir is not None
    _add_head(model_dir)
    head_before = load_checkpoint(model_dir).model.heads["kind"].state_dict()
    with caplog.at_level(logging.INFO, logger="model_training.final_export"):
        again = train(_config(run_inputs, out_name, **common, **changed))
    assert again.model_dir == model_dir and again.steps == 2
    checkpoint = load_checkpoint(model_dir)
    assert [(h.name, h.metrics) for h in checkpoint.meta.heads] == [("kind", {"f1": 0.5})]
    for key, value in checkpoint.model.heads["kind"].state_dict().items():
        assert torch.equal(value, head_before[key])
    config = checkpoint.meta.training["config"]
    assert all(config[key] == value for key, value in changed.items())  # the new export options apply
    assert checkpoint.meta.name == config["name"] and checkpoint.meta.max_length == config["max_length"]
    summary = json.loads((run_inputs / out_name / "summary.json").read_text(encoding="utf-8"))
    assert checkpoint.meta.training["run_id"] == summary["run_id"]  # still the same run
    assert f"exporting it again with {said}, its task heads carried over: kind" in caplog.text
    length_warning = "were measured at max_length 64; the model is now served at 48"
    assert (length_warning in caplog.text) == ("max_length" in changed)


@pytest.mark.slow
def test_a_resume_with_a_run_length_the_unfinished_run_has_reached_is_refused(
    run_inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--stop-at-step 3` of 6, then `--max-steps 2`: the run counted as finished and exported a model
    whose learning rate never cooled down (summary: steps 3, total_steps 2)."""
    common: dict[str, object] = {"eval_every": 0, "checkpoint_every": 1}
    out = run_inputs / "short"
    train(_config(run_inputs, "short", max_steps=6, **common), stop_at_step=3)
    for total in (2, 3):  # behind the run, and exactly where it stopped: neither is a cooled-down end
        with pytest.raises(
            HtmllmError, match=rf"{total} steps, is not past the run, which is at step 3 of 6"
        ):
            train(_config(run_inputs, "short", max_steps=total, **common))
    assert not (out / "model").exists() and not (out / "summary.json").exists()
    # Said on the command line as the other config errors are (`config.to_dict()` as TOML), with what to do.
    from service.cli import main

    settings = _config(run_inputs, "short", max_steps=6, **common).to_dict()
    lines = [f"{key} = {json.dumps(value)}" for key, value in settings.items() if key != "loss_weights"]
    weights = ", ".join(f"{key} = {value}" for key, value in settings["loss_weights"].items())
    toml = run_inputs / "short.toml"
    toml.write_text("\n".join([*lines, f"loss_weights = {{ {weights} }}", ""]), encoding="utf-8")
    assert main(["train", "--config", str(toml), "--max-steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "validation_error: the run length of this config, 2 steps, is not past the run" in err
    assert "pass max_steps 6 or more (--max-steps) to finish it, or --no-resume to start over" in err
    # The run's own total finishes it; a finished run given a smaller total has nothing left to do.
    assert train(_config(run_inputs, "short", max_steps=6, **common)).steps == 6
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    again = train(_config(run_inputs, "short", max_steps=4, **common))
    assert again.steps == 6 and again.summary == summary
