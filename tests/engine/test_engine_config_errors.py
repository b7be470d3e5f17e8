"""A configuration this machine cannot run is one ValueError, before anything loads, whatever the backend
and wherever the model runs: it had been a ValueError after the load in process, a BackendError after an
ONNX export, and from an inference process a `checkpoint_invalid` error seconds later."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

import pytest

from service.engine.engine import Engine
from service.engine.types import EngineConfig


@pytest.mark.parametrize("inference_process", [False, True])
@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"device": "cuda"}, "device 'cuda', but this machine has no usable CUDA device"),
        (
            {"backend": "onnx", "device": "cuda"},
            "device 'cuda', but onnxruntime has no CUDAExecutionProvider",
        ),
        ({"attn_implementation": "flash_attention_2"}, "flash_attention_2 needs CUDA"),
    ],
)
def test_what_this_machine_cannot_run_is_the_same_value_error_in_every_mode(
    tiny_checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, str],
    said: str,
    inference_process: bool,
) -> None:
    import onnxruntime
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, wherever this runs
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    root = tmp_path / "ckpt"  # a copy: an onnx load would export its graph into it
    shutil.copytree(tiny_checkpoint, root)
    known = {child.pid for child in multiprocessing.active_children()}
    config = EngineConfig(preprocess_workers=1, inference_process=inference_process, **settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=said) as refused:
        Engine.from_checkpoint(root, config)
    assert type(refused.value) is ValueError  # the check's own, not a child's error
    assert [child for child in multiprocessing.active_children() if child.pid not in known] == []
    assert not (root / "model.onnx").exists()  # refused before an export
