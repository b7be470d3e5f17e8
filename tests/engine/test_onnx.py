"""ONNX export and the onnxruntime runner: one graph, dynamic shapes, the torch runner's outputs."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from service.cli import main
from service.core.checkpoint import checkpoint_fingerprint, load_checkpoint, save_heads
from service.core.modeling import HeadSpec, TaskHead
from service.engine import Engine, EngineConfig
from service.engine.onnx_export import (
    EXPORT_FORM_KEY,
    EXPORT_FORMS,
    FINGERPRINT_KEY,
    HEAD_WEIGHTS_PREFIX,
    QUANTIZATION_KEY,
    OnnxExportError,
    ensure_onnx,
    export_onnx,
    read_onnx_metadata,
)
from service.engine.runners.onnx import OnnxRunner
from service.engine.runners.torch import TorchRunner
from service.engine.types import ShuttingDownError
from tests.factories.pages import make_pages

pytestmark = pytest.mark.slow  # one export takes ~10 s on a busy 2-core box


@pytest.fixture(scope="module")
def exported(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx") / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    assert main(["export-onnx", "--checkpoint", str(root)]) == 0  # the CLI, into <checkpoint>/model.onnx
    return root


def test_onnx_matches_torch_for_any_batch_shape(exported: Path) -> None:
    ckpt = load_checkpoint(exported)
    torch_runner = TorchRunner(ckpt.model)
    onnx_runner = OnnxRunner(
        exported / "model.onnx", pad_id=torch_runner.pad_id, head_names=["page_type", "quality"]
    )
    rng = random.Random(0)
    vocab = ckpt.model.config.vocab_size
    for lengths in ([5], [3, 17, 40], [128, 2, 9, 64, 31]):
        docs = [[2, *(rng.randrange(5, vocab) for _ in range(n - 2)), 3] for n in lengths]
        a = torch_runner.run(torch_runner.prepare(docs))
        b = onnx_runner.run(onnx_runner.prepare(docs))
        np.testing.assert_allclose(b.embeddings, a.embeddings, atol=1e-4, rtol=0)
        assert set(b.scores) == set(a.scores)
        for head in a.scores:
            np.testing.assert_allclose(b.scores[head], a.scores[head], atol=1e-4, rtol=0)


def test_onnx_threads_are_chosen_like_torch_threads(exported: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime reads no OMP_NUM_THREADS and no cgroup limit itself: the runner passes the choice on.
    heads = ["page_type", "quality"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    runner = OnnxRunner(exported / "model.onnx", pad_id=0, head_names=heads)
    assert runner.threads == 1
    assert runner._session.get_session_options().intra_op_num_threads == 1
    set_here = OnnxRunner(exported / "model.onnx", pad_id=0, head_names=heads, intra_op_threads=2)
    assert set_here._session.get_session_options().intra_op_num_threads == 2


def test_a_closed_runner_refuses_a_pass_as_shutting_down(exported: Path) -> None:
    """Its session had been dropped as an attribute: a pass after the close (a call accepted before an
    engine's close) failed as a BackendError "no attribute '_session'", which counted against health."""
    runner = OnnxRunner(exported / "model.onnx", pad_id=0, head_names=["page_type", "quality"])
    docs = [[2, 7, 8, 3]]
    assert runner.run(runner.prepare(docs)).embeddings.shape[0] == 1
    runner.close()
    with pytest.raises(ShuttingDownError, match="closed"):
        runner.run(runner.prepare(docs))
    runner.close()  # again: nothing to do


async def test_engine_on_onnx_matches_engine_on_torch(exported: Path) -> None:
    pages = make_pages(10, seed=4)
    async with Engine.from_checkpoint(exported, EngineConfig(backend="onnx")) as onnx_engine:
        assert onnx_engine.info.backend == "onnx"
        via_onnx = await onnx_engine.embed(pages, normalize=False)
    async with Engine.from_checkpoint(exported) as torch_engine:
        via_torch = await torch_engine.embed(pages, normalize=False)
    for a, b in zip(via_onnx, via_torch, strict=True):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-4, rtol=0)
        assert a.tokens == b.tokens
        assert a.scores["quality"] == pytest.approx(b.scores["quality"], abs=1e-4)


def test_export_is_reused_while_fresh_and_redone_when_heads_change(exported: Path) -> None:
    graph = exported / "model.onnx"
    assert read_onnx_metadata(graph)[FINGERPRINT_KEY] == checkpoint_fingerprint(exported)
    stamp = graph.stat().st_mtime_ns
    assert ensure_onnx(exported) == graph and graph.stat().st_mtime_ns == stamp
    spec = HeadSpec(name="spam", kind="classification", labels=["no", "yes"], hidden=8)
    save_heads(exported, {"spam": (spec, TaskHead(spec, 32))})
    ensure_onnx(exported)
    assert read_onnx_metadata(graph)[FINGERPRINT_KEY] == checkpoint_fingerprint(exported)
    runner = OnnxRunner(graph, pad_id=0, head_names=["page_type", "quality", "spam"])
    assert runner.run(runner.prepare([[2, 9, 3]])).scores["spam"].shape == (1, 2)


def test_a_graph_without_the_expected_heads_is_refused(exported: Path) -> None:
    from service.engine.types import BackendError

    with pytest.raises(BackendError, match="outputs"):
        OnnxRunner(exported / "model.onnx", pad_id=0, head_names=["page_type"])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


def test_default_graph_uses_the_fused_attention_and_rotary_operators(exported: Path) -> None:
    import onnx

    graph = onnx.load(str(exported / "model.onnx"))
    ops = [node.op_type for node in graph.graph.node]
    layers = load_checkpoint(exported).model.config.num_hidden_layers
    # opset 23: one Attention node per layer, not a dozen unfused nodes each
    assert ops.count("Attention") == layers and ops.count("RotaryEmbedding") == 2 * layers


def test_int8_graph_is_a_separate_file_close_to_float32(exported: Path) -> None:
    assert main(["export-onnx", "--checkpoint", str(exported), "--quantize", "int8"]) == 0
    quantized = exported / "model.int8.onnx"
    meta = read_onnx_metadata(quantized)
    assert (
        meta[QUANTIZATION_KEY] == "int8"
        and read_onnx_metadata(exported / "model.onnx")[QUANTIZATION_KEY] == "none"
    )
    import onnx

    ops = [node.op_type for node in onnx.load(str(quantized)).graph.node]
    layers = load_checkpoint(exported).model.config.num_hidden_layers
    assert ops.count("DynamicQuantizeMatMul") + ops.count("MatMulInteger") >= 4 * layers  # Wqkv, Wo, Wi, Wo
    assert ops.count("Attention") == layers  # quantisation keeps the fused operators
    # The heads stay float32 (a quantised head's score moved with its batch company): their weights are
    # float, and every node reading them is a float operator (Gemm comes back as MatMul + Add).
    graph = onnx.load(str(quantized)).graph
    head_weights = [i.name for i in graph.initializer if i.name.startswith(HEAD_WEIGHTS_PREFIX)]
    assert head_weights and not any(name.endswith(("_quantized", "_scale")) for name in head_weights)
    readers = {n.op_type for n in graph.node if set(head_weights).intersection(n.input)}
    assert "MatMul" in readers and readers <= {"Gemm", "MatMul", "Add", "LayerNormalization"}, readers
    stamp = quantized.stat().st_mtime_ns
    assert ensure_onnx(exported, quantize="int8") == quantized and quantized.stat().st_mtime_ns == stamp
    # An int8 graph of the older form (heads quantised; no form recorded) is stale for the same weights;
    # a float graph without the key is of the float form, "1", and kept.
    for path in (quantized, exported / "model.onnx"):
        old = onnx.load(str(path))
        kept = [(p.key, p.value) for p in old.metadata_props if p.key != EXPORT_FORM_KEY]
        del old.metadata_props[:]
        for key, value in kept:
            prop = old.metadata_props.add()
            prop.key, prop.value = key, value
        onnx.save(old, str(path))
    float_stamp = (exported / "model.onnx").stat().st_mtime_ns
    assert ensure_onnx(exported) == exported / "model.onnx"
    assert (exported / "model.onnx").stat().st_mtime_ns == float_stamp
    ensure_onnx(exported, quantize="int8")
    assert read_onnx_metadata(quantized)[EXPORT_FORM_KEY] == EXPORT_FORMS["int8"] == "2"
    with pytest.raises(ValueError):
        ensure_onnx(exported, quantize="int4")

    ckpt = load_checkpoint(exported)
    torch_runner = TorchRunner(ckpt.model)
    heads = list(ckpt.model.heads)  # an earlier test may have added one
    runner = OnnxRunner(quantized, pad_id=torch_runner.pad_id, head_names=heads)
    assert runner.dtype == "int8"
    docs = [[2, *(random.Random(n).randrange(5, 300) for _ in range(n)), 3] for n in (5, 40, 120)]
    a = torch_runner.run(torch_runner.prepare(docs))
    b = runner.run(runner.prepare(docs))
    cos = _cosines(a.embeddings, b.embeddings)
    assert cos.min() > 0.99, cos  # int8 weights: close, not equal
    assert np.abs(a.embeddings - b.embeddings).max() > 1e-6  # and really quantised


async def test_engine_runs_the_int8_graph_when_asked(exported: Path) -> None:
    pages = make_pages(6, seed=9)
    config = EngineConfig(backend="onnx", onnx_quantize="int8")
    async with Engine.from_checkpoint(exported, config) as engine:
        assert engine.info.dtype == "int8"
        via_int8 = await engine.embed(pages)
    async with Engine.from_checkpoint(exported) as torch_engine:
        via_torch = await torch_engine.embed(pages)
    cos = [float(np.dot(a.embedding, b.embedding)) for a, b in zip(via_int8, via_torch, strict=True)]
    assert min(cos) > 0.99


def test_quantization_is_only_for_the_onnx_backend_on_cpu() -> None:
    with pytest.raises(ValueError):
        EngineConfig(backend="torch", onnx_quantize="int8")
    with pytest.raises(ValueError):
        EngineConfig(backend="onnx", device="cuda", onnx_quantize="int8")
    with pytest.raises(ValueError):
        EngineConfig(backend="onnx", onnx_quantize="int4")
    with pytest.raises(ValueError):
        EngineConfig(backend="onnx", dtype="bfloat16")


def test_an_attention_is_refused_with_the_onnx_backend() -> None:
    """The graph runs onnxruntime's own attention: a kernel asked of it had been ignored in silence."""
    for attention in ("sdpa", "eager", "varlen", "flash_attention_2"):
        with pytest.raises(ValueError, match=f"attention '{attention}' is the torch backend's"):
            EngineConfig(backend="onnx", attn_implementation=attention)
    assert EngineConfig(backend="onnx").attn_implementation is None
    assert EngineConfig(backend="torch", attn_implementation="eager").attn_implementation == "eager"


def test_a_read_only_checkpoint_exports_its_graph_to_the_temporary_directory(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kubernetes mounts models read-only: the onnx backend must start there as the torch one does."""
    import errno
    import tempfile

    from service.engine import onnx_export

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    mkstemp = tempfile.mkstemp

    def read_only(*args: object, dir: str | None = None, **kwargs: object) -> tuple[int, str]:
        if dir is not None and Path(dir) == root:
            raise OSError(errno.EROFS, "Read-only file system", dir)
        return mkstemp(*args, dir=dir, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(onnx_export.tempfile, "mkstemp", read_only)
    graph = ensure_onnx(root)
    expected = tmp_path / "tmp" / "htmllm-onnx" / checkpoint_fingerprint(root)[:32] / "model.onnx"
    assert graph == expected and not (root / "model.onnx").exists()
    assert read_onnx_metadata(graph)[FINGERPRINT_KEY] == checkpoint_fingerprint(root)
    stamp = graph.stat().st_mtime_ns
    assert ensure_onnx(root) == graph and graph.stat().st_mtime_ns == stamp  # found again, not redone
    runner = OnnxRunner(graph, pad_id=0, head_names=["page_type", "quality"])
    assert runner.run(runner.prepare([[2, 9, 3]])).embeddings.shape[0] == 1

    # Another failure to write is not papered over (a typed error, not a raw OSError), and neither is
    # one at an explicit path (`tests/engine/test_onnx_read_only.py`: the read-only ones fall back).
    def full(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx_export.tempfile, "mkstemp", full)
    with pytest.raises(OnnxExportError, match="No space"):
        ensure_onnx(root, quantize="int8")
    with pytest.raises(OnnxExportError, match="No space"):
        ensure_onnx(root, tmp_path / "elsewhere.onnx")


def test_a_mean_pooling_graph_without_heads_matches_torch_and_a_change_during_export_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mean pooling, no heads, batches of one and odd lengths match torch; and heads saved while the
    export ran leave the graph stale. Its fingerprint had been taken after the export, from the changed
    files: the graph without the head passed for current, and the runner refused it at every start."""
    import torch

    from service.engine import onnx_export
    from tests.factories.checkpoint import build_tiny_checkpoint

    root = build_tiny_checkpoint(tmp_path / "mean", pooling="mean", heads=False)
    before = checkpoint_fingerprint(root)
    spec = HeadSpec(name="spam", kind="regression", hidden=8)
    real_export = torch.onnx.export

    def export_while_heads_are_added(*args: object, **kwargs: object) -> object:
        save_heads(root, {"spam": (spec, TaskHead(spec, 32))})  # another process, meanwhile
        return real_export(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.onnx, "export", export_while_heads_are_added)
    graph = ensure_onnx(root)
    monkeypatch.undo()
    assert read_onnx_metadata(graph)[FINGERPRINT_KEY] == before != checkpoint_fingerprint(root)
    exports: list[Path] = []
    monkeypatch.setattr(onnx_export, "export_onnx", lambda checkpoint, out, **_: exports.append(out) or out)
    assert ensure_onnx(root) == graph and exports == [graph]  # stale: exported again

    ckpt = load_checkpoint(root)  # the encoder is unchanged; only the head is new
    torch_runner = TorchRunner(ckpt.model)
    runner = OnnxRunner(graph, pad_id=torch_runner.pad_id, head_names=[])
    rng = random.Random(1)
    vocab = ckpt.model.config.vocab_size
    for lengths in ([2], [7], [128], [3, 128, 9, 2, 65]):
        docs = [[2, *(rng.randrange(5, vocab) for _ in range(n - 2)), 3] for n in lengths]
        want = torch_runner.run(torch_runner.prepare(docs))
        got = runner.run(runner.prepare(docs))
        np.testing.assert_allclose(got.embeddings, want.embeddings, atol=1e-4, rtol=0)
        assert got.scores == {}


def test_a_model_loaded_in_bfloat16_is_refused_and_left_as_it_was(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The graph had been cast up from the rounded weights (~4e-3 off the checkpoint) yet stamped with
    the checkpoint's fingerprint, so ensure_onnx took it as current; and the caller's model was cast."""
    import torch

    ckpt = load_checkpoint(tiny_checkpoint, dtype=torch.bfloat16)
    with pytest.raises(OnnxExportError, match=r"loaded in torch\.bfloat16.*float32"):
        export_onnx(ckpt, tmp_path / "model.onnx", fingerprint="f")
    assert not (tmp_path / "model.onnx").exists()
    assert {p.dtype for p in ckpt.model.encoder.parameters()} == {torch.bfloat16}


def test_export_runs_on_a_copy_leaving_the_callers_model_as_it_was(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export had switched the caller's (serving) model to SDPA and moved it to the CPU."""
    import torch

    ckpt = load_checkpoint(tiny_checkpoint, attn_implementation="eager")
    seen: list[tuple[bool, str]] = []

    def stop_at_export(wrapper: torch.nn.Module, *args: object, **kwargs: object) -> None:
        exported_model = wrapper.model
        seen.append((exported_model is ckpt.model, exported_model.encoder.config._attn_implementation))
        raise RuntimeError("stopped before exporting")

    monkeypatch.setattr(torch.onnx, "export", stop_at_export)
    with pytest.raises(OnnxExportError, match="stopped before exporting"):
        export_onnx(ckpt, tmp_path / "model.onnx", fingerprint="f")
    assert seen == [(False, "sdpa")]
    assert ckpt.model.encoder.config._attn_implementation == "eager"


def test_an_export_removes_the_temporaries_of_a_killed_export_and_nothing_else(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kill -9` during an export leaves its temporary (as large as the graph) in the checkpoint; the next
    export, holding the directory's lock, removes those of its own naming only."""
    from service.engine import onnx_export

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    stale = [".model.onnx.k3_x9abz.onnx", ".model.onnx.k3_x9abz.float.onnx", ".model.int8.onnx.ab12cd34.onnx"]
    kept = [
        ".model.onnx.notes",
        "model.onnx.bak",
        ".model.onnx.original.onnx.txt",
        ".other.onnx.ab12cd34.onnx",
    ]
    for name in stale + kept:
        (root / name).write_bytes(b"graph")
    seen: list[list[str]] = []

    def export(checkpoint: object, out: Path, **kwargs: object) -> Path:
        seen.append(sorted(p.name for p in Path(out).parent.iterdir()))
        return Path(out)

    monkeypatch.setattr(onnx_export, "export_onnx", export)
    assert ensure_onnx(root) == root / "model.onnx"
    assert not {*stale[:2]} & {*seen[0]} and stale[2] in seen[0]  # another graph's: its own export's
    assert ensure_onnx(root, quantize="int8") == root / "model.int8.onnx"
    assert sorted(p.name for p in root.iterdir() if p.name in stale + kept) == sorted(kept)


def test_a_cli_export_keeps_its_temporary_from_a_server_starting_meanwhile(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm export-onnx` exported without `ensure_onnx`'s directory lock: a server starting on the
    checkpoint during the export took the CLI's temporary for a killed export's and removed it under its
    lock (the CLI then failed reading it back). Now the server waits for the CLI's lock, and finds the
    CLI's graph up to date instead of exporting again."""
    import fcntl
    import tempfile
    import threading

    import onnx
    import torch

    from service.engine import onnx_export

    root = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # no graph of an earlier run cached
    cli = threading.current_thread()
    served: list[Path] = []
    failed: list[Exception] = []

    def serve() -> None:
        try:
            served.append(ensure_onnx(root))
        except Exception as exc:  # reported by the assertions below
            failed.append(exc)

    server = threading.Thread(target=serve)
    server_held_off = threading.Event()  # the server blocked on the lock, or done with its cleanup
    real_flock, real_export = fcntl.flock, torch.onnx.export
    real_cleanup = onnx_export._remove_stale_temporaries

    def flock(fd: int, operation: int) -> None:
        if threading.current_thread() is server and operation == fcntl.LOCK_EX:
            try:
                real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                server_held_off.set()
        real_flock(fd, operation)

    def cleanup(target: Path) -> None:
        real_cleanup(target)
        if threading.current_thread() is server:
            server_held_off.set()

    exports: list[str] = []
    temporary_kept: list[bool] = []

    def export_then_start_the_server(*args: object, **kwargs: object) -> object:
        result = real_export(*args, **kwargs)  # type: ignore[arg-type]
        exports.append(threading.current_thread().name)
        if threading.current_thread() is cli:
            temporary = Path(str(args[2]))  # written: what the CLI reads back next
            server.start()
            assert server_held_off.wait(120), "the server neither waited for the lock nor cleaned up"
            temporary_kept.append(temporary.is_file())
        return result

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(onnx_export, "_remove_stale_temporaries", cleanup)
    monkeypatch.setattr(torch.onnx, "export", export_then_start_the_server)
    try:
        assert main(["export-onnx", "--checkpoint", str(root)]) == 0
    finally:
        if server.ident is not None:  # started
            server.join(120)
    monkeypatch.undo()
    assert temporary_kept == [True]
    assert not failed, failed
    graph = root / "model.onnx"
    assert served == [graph] and exports == [cli.name]  # the server took the CLI's graph, not exporting
    assert not [p.name for p in root.iterdir() if p.name.startswith(".model.onnx.")]
    for path in {graph, *served}:  # what the CLI wrote and what the server runs
        onnx.checker.check_model(str(path))
        assert read_onnx_metadata(path)[FINGERPRINT_KEY] == checkpoint_fingerprint(root)
        runner = OnnxRunner(path, pad_id=0, head_names=["page_type", "quality"])
        assert runner.run(runner.prepare([[2, 9, 3], [2, 3]])).embeddings.shape[0] == 2
