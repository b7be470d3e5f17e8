"""`htmllm export-onnx`: the options the exporter cannot honour fail before the export, in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.cli import main


def test_an_opset_below_the_exporters_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for opset in ("9", "17", "1000"):
        assert main(["export-onnx", "--checkpoint", str(tmp_path), "--opset", opset]) == 2
        err = capsys.readouterr().err
        assert f"--opset {opset} cannot be exported" in err and "opsets 18 to" in err
        assert "Traceback" not in err


def test_an_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    for out in (tmp_path / "a-file" / "model.onnx", tmp_path):
        assert main(["export-onnx", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"htmllm export-onnx: cannot write {out}: ") and err.count("\n") == 1
    assert main(["export-onnx", "--checkpoint", str(tmp_path / "typo")]) == 1
    assert not (tmp_path / "typo").exists()  # the probe of a default --out made no directory


def _fake_export(written_opset: int) -> Any:
    def export(checkpoint: object, out: Path, *, opset: int, quantize: str | None) -> Path:
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", written_opset)]), str(out))
        return Path(out)

    return export


@pytest.mark.parametrize(("written", "code"), [(18, 1), (20, 0)])
def test_the_opset_written_is_the_one_reported(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    written: int,
    code: int,
) -> None:
    """The converter falls back to opset 18 without failing the export when it cannot convert."""
    import service.core.checkpoint
    import service.engine.onnx_export

    monkeypatch.setattr(service.core.checkpoint, "load_checkpoint", lambda path: object())
    monkeypatch.setattr(service.engine.onnx_export, "export_onnx", _fake_export(written))
    out = tmp_path / "y.onnx"
    assert main(["export-onnx", "--checkpoint", str(tmp_path), "--out", str(out), "--opset", "20"]) == code
    err = capsys.readouterr().err
    if code:
        assert f"wrote {out} at opset 18, not the 20 asked for" in err
    else:
        assert f"wrote {out} (opset 20, " in err
