"""`htmllm export-onnx` run again on a graph it exported from the same checkpoint with the same options
leaves it as it is, in one line, by the rule a starting server keeps a graph by; `--force`, another
`--opset` or a changed checkpoint export it again. Each run had exported the same graph again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from service.cli import main
from service.core.checkpoint import read_meta, save_heads
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint


def test_an_up_to_date_graph_is_left_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnx
    from onnx import TensorProto, helper

    exports: list[int] = []

    def write_small_graph(module: object, args: object, path: str, **kwargs: object) -> None:
        """torch.onnx.export's stand-in, counted: any valid graph at the opset asked for (the real one
        takes seconds per export, and this test exports four times)."""
        opset = int(kwargs["opset_version"])  # type: ignore[call-overload]
        exports.append(opset)
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)

    monkeypatch.setattr(torch.onnx, "export", write_small_graph)
    root = build_tiny_checkpoint(tmp_path / "ckpt")
    graph = root / "model.onnx"
    argv = ["export-onnx", "--checkpoint", str(root)]

    assert main(argv) == 0
    assert len(exports) == 1 and f"wrote {graph} (opset 23, " in capsys.readouterr().err
    written = graph.stat()

    assert main(argv) == 0  # the same checkpoint, the same options
    assert len(exports) == 1
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(f"htmllm export-onnx: {graph} is up to date: "), said
    assert "float32, opset 23; left as it is (--force exports it again)" in said[0]
    assert (graph.stat().st_ino, graph.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)

    assert main([*argv, "--force"]) == 0
    assert exports == [23, 23] and "wrote " in capsys.readouterr().err

    assert main([*argv, "--opset", "20"]) == 0  # another opset is another graph
    assert exports == [23, 23, 20]
    assert main([*argv, "--opset", "20"]) == 0
    assert exports == [23, 23, 20] and "is up to date" in capsys.readouterr().err

    spec = HeadSpec(name="extra", kind="regression", hidden=8)
    dim = read_meta(root).embedding_dim
    save_heads(root, {"extra": (spec, TaskHead(spec, dim))})  # the checkpoint changed: the graph is stale
    assert main([*argv, "--opset", "20"]) == 0
    assert exports == [23, 23, 20, 20]
