"""An unreadable graph where `ensure_onnx` looks is replaced by a fresh export, and said once."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from service.engine.onnx_export import ensure_onnx, read_onnx_metadata


@pytest.mark.slow  # a real export of the tiny model
def test_an_unreadable_graph_is_warned_about_once_and_replaced(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`ensure_onnx` looks at the graph, then looks again under the export's lock (another process may
    have exported it meanwhile): the second look had logged the same warning a second time."""
    root = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    graph = root / "model.onnx"
    graph.write_bytes(b"not a graph: a copy cut short")
    caplog.set_level(logging.WARNING, logger="service.engine.onnx_export")
    assert ensure_onnx(root) == graph
    said = [
        r for r in caplog.records if r.name == "service.engine.onnx_export" and r.levelno >= logging.WARNING
    ]
    assert [r.getMessage().startswith(f"ignoring unreadable ONNX graph {graph}: ") for r in said] == [True]
    read_onnx_metadata(graph)  # a graph now: the export replaced it
