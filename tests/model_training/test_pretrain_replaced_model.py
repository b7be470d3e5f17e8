"""An export that replaces an earlier model/ of a new encoder: what it does not carry over is said."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from model_training.pretrain import train
from service.core.checkpoint import load_checkpoint, save_heads
from service.core.modeling import HeadSpec, TaskHead
from tests.model_training.test_pretrain import _build_run_inputs, _config


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replaced")
    _build_run_inputs(root, documents=24)
    return root


def _heads_and_graph(model_dir: Path) -> None:
    """What `htmllm heads train` and `htmllm export-onnx` add to a finished run's model/."""
    specs = [
        HeadSpec(name=name, kind="classification", labels=["a", "b"], hidden=4) for name in ("lang", "kind")
    ]
    save_heads(model_dir, {spec.name: (spec, TaskHead(spec, 32)) for spec in specs})
    (model_dir / "model.onnx").write_bytes(b"a graph of the old weights")
    (model_dir / "model.int8.onnx").write_bytes(b"its int8 twin")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_training_past_the_end_says_which_heads_and_graphs_the_new_model_drops(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The heads trained into model/ and its ONNX graph went without a word: htmllm.json said
    "heads": [] and the service served none."""
    out = run_inputs / "longer"
    model_dir = train(_config(run_inputs, "longer", max_steps=2, eval_every=0)).model_dir
    assert model_dir is not None
    _heads_and_graph(model_dir)
    with caplog.at_level(logging.INFO, logger="model_training.final_export"):
        assert train(_config(run_inputs, "longer", max_steps=3, eval_every=0)).steps == 3
    assert load_checkpoint(out / "model").meta.heads == []
    assert not list((out / "model").glob("*.onnx"))
    assert _warnings(caplog) == [
        f"{model_dir} held the model of step 2; the model of step 3 replaces it without its task heads "
        f"lang, kind (trained on the old encoder's embeddings): train them again with `htmllm heads train "
        f"--checkpoint {model_dir} --tasks TASKS_DIR`; and without its ONNX graphs model.int8.onnx, "
        f"model.onnx (of the old weights): export again with `htmllm export-onnx --checkpoint {model_dir} "
        f"--quantize int8` and `htmllm export-onnx --checkpoint {model_dir}`"
    ]
    # Run again, it is its own model: nothing replaced, nothing said.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="model_training.final_export"):
        train(_config(run_inputs, "longer", max_steps=3, eval_every=0))
    assert _warnings(caplog) == []


@pytest.mark.slow
def test_a_run_whose_checkpoints_were_deleted_says_what_the_earlier_models_export_loses(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = run_inputs / "deleted"
    model_dir = train(_config(run_inputs, "deleted", max_steps=2, eval_every=0)).model_dir
    assert model_dir is not None
    _heads_and_graph(model_dir)
    (model_dir / "model.int8.onnx").unlink()
    shutil.rmtree(out / "checkpoints")  # to free disk: the run starts from step 0 again
    with caplog.at_level(logging.INFO, logger="model_training.final_export"):
        assert train(_config(run_inputs, "deleted", max_steps=2, eval_every=0)).steps == 2
    assert load_checkpoint(out / "model").meta.heads == []
    (warning,) = _warnings(caplog)
    assert warning.startswith(
        f"{model_dir} held the model of step 2 of another run; the model of step 2 replaces it without "
        "its task heads lang, kind (trained on the old encoder's embeddings)"
    )
    assert warning.endswith(f"export again with `htmllm export-onnx --checkpoint {model_dir}`")
