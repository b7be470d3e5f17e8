"""`htmllm export-onnx --out FILE` where FILE holds htmllm's graph of the other quantisation: refused in
one line before the checkpoint loads, FILE left as it was. It had been replaced, and a server whose
HTMLLM_ONNX_PATH named it ran the other precision from its next start (or exported its own back over it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main
from service.core.checkpoint import checkpoint_fingerprint
from tests.engine.test_onnx_read_only import write_graph
from tests.factories.checkpoint import build_tiny_checkpoint


@pytest.mark.parametrize(
    ("there", "options", "found", "wanted", "own"),
    [
        (None, ["--quantize", "int8"], "float32", "int8", "served.int8.onnx"),
        ("int8", [], "int8", "float32", "served.float32.onnx"),
    ],
)
def test_an_out_holding_the_other_quantizations_graph_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    there: str | None,
    options: list[str],
    found: str,
    wanted: str,
    own: str,
) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "ckpt")
    served = write_graph(tmp_path / "served.onnx", checkpoint_fingerprint(checkpoint), there)
    before = served.read_bytes()
    capsys.readouterr()  # the checkpoint's save says what it writes
    assert main(["export-onnx", "--checkpoint", str(checkpoint), "--out", str(served), *options]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"htmllm export-onnx: validation_error: {served} holds the {found} ONNX graph, not the {wanted} one "
        f"asked for: it is left as it is (runs of the other precision use it); give the {wanted} graph a "
        f"file of its own ({tmp_path / own}, say), or remove {served} first to replace it"
    ]
    assert served.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "served.onnx"]  # nor a temporary left
