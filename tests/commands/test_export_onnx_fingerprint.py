"""`htmllm export-onnx` stamps its graph with the fingerprint of the checkpoint as it was loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from service.cli import main
from service.core.checkpoint import checkpoint_fingerprint, save_heads
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint


def _write_small_graph(module: object, args: object, path: str, **kwargs: object) -> None:
    """torch.onnx.export's stand-in: any valid graph at the opset asked for (the real one takes seconds)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    opset = int(kwargs["opset_version"])  # type: ignore[call-overload]
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


def test_heads_saved_after_the_load_leave_the_graph_stale_not_stamped_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint had been taken after the load (and after waiting, maybe minutes, on another
    export's lock): a `save_heads` in between stamped the old heads' graph with the new checkpoint's
    fingerprint, and `ensure_onnx` served it as current for good."""
    import service.core.checkpoint
    from service.engine.onnx_export import FINGERPRINT_KEY, read_onnx_metadata

    root = build_tiny_checkpoint(tmp_path / "ckpt")
    before = checkpoint_fingerprint(root)
    real_load = service.core.checkpoint.load_checkpoint

    def load_then_heads_change(path: Path, **kwargs: object) -> object:
        loaded = real_load(path, **kwargs)  # type: ignore[arg-type]
        spec = HeadSpec(name="quality", kind="regression", hidden=16)
        save_heads(path, {"quality": (spec, TaskHead(spec, loaded.model.embedding_dim))})  # meanwhile
        return loaded

    monkeypatch.setattr(service.core.checkpoint, "load_checkpoint", load_then_heads_change)
    monkeypatch.setattr(torch.onnx, "export", _write_small_graph)
    assert main(["export-onnx", "--checkpoint", str(root)]) == 0
    after = checkpoint_fingerprint(root)
    assert after != before
    assert read_onnx_metadata(root / "model.onnx")[FINGERPRINT_KEY] == before
