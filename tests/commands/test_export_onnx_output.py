"""What `htmllm export-onnx` prints: one line for the graph it wrote, one for an export that failed, and
nothing of the exporters' own narration."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import service.engine.onnx_export as onnx_export
from service.cli import main
from tests.factories.checkpoint import build_tiny_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_an_int8_export_prints_one_line(tmp_path: Path) -> None:
    """It printed 14 lines: torchvision "not installed" warnings, torch.onnx's progress, and onnxruntime's
    advice to run quantisation pre-processing (a step the user need not take), before its own. A fresh
    process: torch's warnings go through its own handler, and the quantizer's advice configured one."""
    root = build_tiny_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "graph.onnx"
    command = ["export-onnx", "--checkpoint", str(root), "--out", str(out), "--quantize", "int8"]
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", *command],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wrote {out} (opset 23, "), done.stderr


def _data_dependent_forward(self: object, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
    if input_ids.sum() > 3:  # a branch on the data: torch.export cannot capture it
        return (input_ids.float(),)
    return (attention_mask.float(),)


@pytest.mark.slow
def test_an_export_that_fails_is_still_reported_and_logging_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quieting the exporters must not hide their failure: the command reports it once, with torch's
    summary of the cause, and the loggers quieted for the export are as they were after it."""
    root = build_tiny_checkpoint(tmp_path / "ckpt")
    monkeypatch.setattr(onnx_export._ExportWrapper, "forward", _data_dependent_forward)
    levels = [logging.getLogger(name).level for name in ("onnxscript", "onnx_ir")]
    filters = list(logging.getLogger().filters)
    assert main(["export-onnx", "--checkpoint", str(root), "--out", str(tmp_path / "graph.onnx")]) == 1
    err = capsys.readouterr().err.splitlines()
    failed = [line for line in err if line.startswith("htmllm export-onnx: ")]
    assert len(failed) == 1, err
    assert f"exporting {root} to ONNX failed: TorchExportError: " in failed[0]
    assert not (tmp_path / "graph.onnx").exists()
    assert [logging.getLogger(name).level for name in ("onnxscript", "onnx_ir")] == levels
    assert logging.getLogger().filters == filters
