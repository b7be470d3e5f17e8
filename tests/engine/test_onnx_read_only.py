"""`ensure_onnx` where the graph's place cannot be written: a stale or missing HTMLLM_ONNX_PATH on a
read-only model volume falls back to the temporary directory with a warning, and a graph that can be
written nowhere is one typed error, never a raw OSError (a traceback that crash-looped every new pod).

The export itself is replaced by one that writes a tiny graph carrying the metadata a real export
records (the real one takes ~10 s, and `tests/engine/test_onnx.py` covers it); it writes through
`tempfile.mkstemp` beside its target as the real one does, so a directory made "read-only" by refusing
mkstemp there refuses both. Tests run as root, for whom file modes are no obstacle: hence the patching.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from service.core.checkpoint import checkpoint_fingerprint
from service.engine import onnx_export
from service.engine.onnx_export import (
    EXPORT_FORM_KEY,
    EXPORT_FORMS,
    FINGERPRINT_KEY,
    QUANTIZATION_KEY,
    OnnxExportError,
    ensure_onnx,
    onnx_cache_path,
    read_onnx_metadata,
)

STALE_FINGERPRINT = "0123456789abcdef" * 4


def write_graph(path: Path, fingerprint: str, quantize: str | None = None) -> Path:
    """A one-node graph with the metadata `export_onnx` records."""
    kind = quantize or "none"
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph)
    for key, value in (
        (FINGERPRINT_KEY, fingerprint),
        (QUANTIZATION_KEY, kind),
        (EXPORT_FORM_KEY, EXPORT_FORMS[kind]),
    ):
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.save(model, str(path))
    return path


@pytest.fixture
def root(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, copy)
    return copy


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory (the pod's /tmp), where `onnx_cache_path` puts graphs."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the export by a quick one that writes as the real one does; lists where it wrote."""
    done: list[Path] = []

    def export(
        checkpoint: object, out: str | Path, *, fingerprint: str, quantize: str | None = None, **_: object
    ) -> Path:
        target = Path(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".onnx")
        os.close(fd)
        os.replace(write_graph(Path(name), fingerprint, quantize), target)
        done.append(target)
        return target

    monkeypatch.setattr(onnx_export, "export_onnx", export)
    return done


def refuse_writes(monkeypatch: pytest.MonkeyPatch, *directories: Path, code: int = errno.EACCES) -> None:
    """Make each of `directories` refuse new files (as a volume another user owns, or a read-only one)."""
    mkstemp = tempfile.mkstemp
    refused = {d.resolve() for d in directories}

    def refusing(*args: object, dir: str | None = None, **kwargs: object) -> tuple[int, str]:
        if dir is not None and Path(dir).resolve() in refused:
            raise OSError(code, os.strerror(code), str(Path(dir) / ".model.onnx.euk8k8ix.onnx"))
        return mkstemp(*args, dir=dir, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(tempfile, "mkstemp", refusing)


def test_a_stale_explicit_graph_that_cannot_be_replaced_is_exported_to_the_temporary_directory(
    root: Path,
    temporary: Path,
    exports: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The checkpoint changed (heads added) after `htmllm export-onnx --out graph/model.onnx`, and the
    pod's user cannot write graph/: the server re-raised PermissionError and every new pod crash-looped."""
    (root / "graph").mkdir()
    stale = write_graph(root / "graph" / "model.onnx", STALE_FINGERPRINT)
    before = stale.read_bytes()
    refuse_writes(monkeypatch, root / "graph")
    fingerprint = checkpoint_fingerprint(root)
    caplog.set_level(logging.WARNING, logger=onnx_export.__name__)

    graph = ensure_onnx(root, stale)

    assert graph == onnx_cache_path(fingerprint) and graph.is_relative_to(temporary)
    assert read_onnx_metadata(graph)[FINGERPRINT_KEY] == fingerprint
    assert stale.read_bytes() == before and exports == [graph]
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert str(stale) in message and "Permission denied" in message and str(graph) in message
    assert STALE_FINGERPRINT[:16] in message and fingerprint[:16] in message
    assert f"`htmllm export-onnx --checkpoint {root} --out {stale}`" in message
    assert "\n" not in message

    # The next start in the pod (a restarted container) finds the graph it cached: no second export.
    assert ensure_onnx(root, stale) == graph and exports == [graph]


def test_a_missing_explicit_graph_on_a_read_only_volume_names_the_quantised_refresh(
    root: Path,
    temporary: Path,
    exports: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No graph at HTMLLM_ONNX_PATH on a read-only file system: `OSError: [Errno 30]` had ended the start."""
    missing = root / "model.int8.onnx"
    refuse_writes(monkeypatch, root, code=errno.EROFS)
    caplog.set_level(logging.WARNING, logger=onnx_export.__name__)

    graph = ensure_onnx(root, missing, quantize="int8")

    assert graph == onnx_cache_path(checkpoint_fingerprint(root), "int8") and not missing.exists()
    message = caplog.records[-1].getMessage()
    assert f"{missing} (HTMLLM_ONNX_PATH) does not exist" in message and "Read-only file system" in message
    assert f"--out {missing} --quantize int8`" in message


def test_an_explicit_graph_that_can_be_written_is_replaced_there(
    root: Path, temporary: Path, exports: list[Path]
) -> None:
    """The fallback is for a place that cannot be written: a writable one is refreshed in place, even
    where the temporary directory holds a graph an earlier start cached."""
    fingerprint = checkpoint_fingerprint(root)
    cached = onnx_cache_path(fingerprint)
    cached.parent.mkdir(parents=True)
    write_graph(cached, fingerprint)
    stale = write_graph(root / "served.onnx", STALE_FINGERPRINT)

    assert ensure_onnx(root, stale) == stale and exports == [stale]
    assert read_onnx_metadata(stale)[FINGERPRINT_KEY] == fingerprint


def test_a_graph_that_can_be_written_nowhere_is_one_typed_error(
    root: Path, temporary: Path, exports: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither HTMLLM_ONNX_PATH's directory nor the temporary directory can be written: serving is
    impossible, said in one line with both places and what to do (not a PermissionError traceback)."""
    stale = write_graph(root / "model.onnx", STALE_FINGERPRINT)
    cache_dir = onnx_cache_path(checkpoint_fingerprint(root)).parent
    cache_dir.mkdir(parents=True)
    refuse_writes(monkeypatch, root, cache_dir, code=errno.EROFS)

    with pytest.raises(OnnxExportError) as raised:
        ensure_onnx(root, stale)
    message = str(raised.value)
    assert raised.value.code == "backend_failed" and "\n" not in message
    assert f"{stale} cannot be written (Read-only file system)" in message
    assert f"nor {cache_dir / 'model.onnx'} in the temporary directory (Read-only file system)" in message
    assert f"`htmllm export-onnx --checkpoint {root} --out {stale}`" in message
    assert exports == []

    # Without HTMLLM_ONNX_PATH (the default place, as `htmllm embed --backend onnx` uses) alike.
    stale.unlink()
    with pytest.raises(
        OnnxExportError, match=r"model\.onnx cannot be written \(Read-only file system\), nor"
    ):
        ensure_onnx(root)


def test_another_failure_to_write_is_a_typed_error_without_a_fallback(
    root: Path, temporary: Path, exports: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk is no read-only volume: no fallback, but no raw OSError either."""
    refuse_writes(monkeypatch, root, code=errno.ENOSPC)
    for explicit in (None, root / "elsewhere.onnx"):
        with pytest.raises(OnnxExportError, match="No space left on device") as raised:
            ensure_onnx(root, explicit)
        assert isinstance(raised.value.__cause__, OSError)
    assert exports == []
