"""The onnx runner checks the graph it loaded against what was asked for: the quantisation, and the
checkpoint's fingerprint the graph records. `ensure_onnx` checks the file, but the load comes after it: a
graph written there in between (another server's export to one HTMLLM_ONNX_PATH, `htmllm export-onnx
--out`) had been served as it was, the runner taking its dtype from the graph, so a server configured for
float32 served int8 (or another checkpoint's graph) without a word. Now the load fails typed, in one
line (`htmllm serve: backend_failed: ...`, status 1).

The file `ensure_onnx` finds is `write_graph`'s one-node graph carrying the metadata of a current export
(it reads only the metadata); what replaces it after the check is a real int8 export of the checkpoint,
which the runner loads and would serve."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

from service.cli import main
from service.core.checkpoint import checkpoint_fingerprint, load_checkpoint
from service.engine import onnx_export
from service.engine.loading import build_runner
from service.engine.onnx_export import FINGERPRINT_KEY, export_onnx
from service.engine.runners.onnx import GraphMismatchError, OnnxRunner
from service.engine.types import EngineConfig
from tests.engine.test_onnx_read_only import STALE_FINGERPRINT, write_graph
from tests.factories.cli import write_pages

pytestmark = pytest.mark.slow  # one int8 export, ~7 s on a busy 2-core box

HOW = (
    "it was written there after it was checked (another server or `htmllm export-onnx` given the same "
    "file?) or by hand"
)
AGAIN = "give each configuration a graph file of its own, and start again"


@pytest.fixture(scope="module")
def root(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny checkpoint (another test may add a head to the shared one), with its int8 graph
    exported beside it as `int8.onnx`."""
    copy = tmp_path_factory.mktemp("loaded-graph") / "ckpt"
    shutil.copytree(tiny_checkpoint, copy)
    export_onnx(
        load_checkpoint(copy),
        copy.parent / "int8.onnx",
        fingerprint=checkpoint_fingerprint(copy),
        quantize="int8",
    )
    return copy


def _replaced_after_the_check(monkeypatch: pytest.MonkeyPatch, by: Path) -> None:
    """`ensure_onnx` as it is, then `by` written over the graph it returned (another run's export)."""
    real = onnx_export.ensure_onnx

    def ensure_then_replaced(*args: object, **kwargs: object) -> Path:
        graph = real(*args, **kwargs)  # type: ignore[arg-type]
        shutil.copyfile(by, graph)
        return graph

    monkeypatch.setattr(onnx_export, "ensure_onnx", ensure_then_replaced)


def _config(graph: Path, quantize: str | None) -> EngineConfig:
    return EngineConfig(backend="onnx", onnx_path=str(graph), onnx_quantize=quantize)


def test_a_float32_run_refuses_the_int8_graph_written_after_the_check(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fingerprint = checkpoint_fingerprint(root)
    shared = write_graph(tmp_path / "shared.onnx", fingerprint)  # float32, up to date
    _replaced_after_the_check(monkeypatch, root.parent / "int8.onnx")
    with pytest.raises(GraphMismatchError) as raised:
        build_runner(root, _config(shared, None))  # it had loaded, its dtype int8
    assert raised.value.code == "backend_failed"
    said = f"{shared} holds the int8 ONNX graph, not the float32 one asked for: {HOW}; {AGAIN}"
    assert str(raised.value) == said
    # A command (`htmllm serve` likewise) says so in one line, status 1.
    write_graph(shared, fingerprint)
    write_pages(tmp_path / "pages.jsonl", 2)
    argv = ["embed", "--checkpoint", str(root), "--input", str(tmp_path / "pages.jsonl"), "--output",
            str(tmp_path / "out.parquet"), "--no-progress", "--backend", "onnx",
            "--onnx-path", str(shared)]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [f"htmllm embed: backend_failed: {said}"]


def test_a_run_refuses_the_graph_of_another_checkpoint_written_after_the_check(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fingerprint = checkpoint_fingerprint(root)
    other = onnx.load(str(root.parent / "int8.onnx"))  # another checkpoint's int8 graph: its fingerprint
    for prop in other.metadata_props:
        if prop.key == FINGERPRINT_KEY:
            prop.value = STALE_FINGERPRINT
    onnx.save(other, str(tmp_path / "other.onnx"))
    shared = write_graph(tmp_path / "shared.int8.onnx", fingerprint, "int8")  # up to date
    _replaced_after_the_check(monkeypatch, tmp_path / "other.onnx")
    with pytest.raises(GraphMismatchError) as raised:
        build_runner(root, _config(shared, "int8"))
    assert str(raised.value) == (
        f"{shared} is the ONNX graph of another checkpoint (fingerprint {STALE_FINGERPRINT[:12]}, not "
        f"{fingerprint[:12]}): {HOW}, or the checkpoint changed while it loaded; {AGAIN}"
    )


def test_the_graph_asked_for_loads_and_a_runner_without_expectations_takes_any(
    root: Path, tmp_path: Path
) -> None:
    graph = Path(shutil.copyfile(root.parent / "int8.onnx", tmp_path / "model.int8.onnx"))
    runner, _, _ = build_runner(root, _config(graph, "int8"))
    assert isinstance(runner, OnnxRunner) and runner.dtype == "int8"
    heads = [spec.name for spec in load_checkpoint(root).meta.heads]
    assert OnnxRunner(graph, pad_id=0, head_names=heads).dtype == "int8"  # a benchmark's: as it is
