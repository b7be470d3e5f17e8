"""One graph file given to a float32 run and an int8 run (one HTMLLM_ONNX_PATH or `--onnx-path` for
both): each had exported its graph over the other's at every start, minutes each with a real model, and
a run that found the file up to date could load the other's graph written in between, serving int8
while its settings said float32. Now the file is left to the quantisation it holds; the other run
serves its own graph from the temporary directory, with a warning naming a file of its own.

The graph already there is `write_graph`'s one-node graph carrying a real export's metadata (the runs
only read its metadata); the graph asked for is exported for real from the tiny checkpoint."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from service.core.checkpoint import checkpoint_fingerprint, load_checkpoint
from service.engine import onnx_export
from service.engine.onnx_export import (
    QUANTIZATION_KEY,
    OtherQuantizationError,
    ensure_onnx,
    export_onnx_locked,
    onnx_cache_path,
    read_onnx_metadata,
)
from tests.engine.test_onnx_read_only import write_graph

pytestmark = pytest.mark.slow  # an export takes ~10 s on a busy 2-core box


@pytest.fixture
def root(tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the tiny checkpoint, with the temporary directory (the pod's /tmp) under `tmp_path`."""
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, copy)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return copy


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_float_and_an_int8_run_sharing_an_explicit_path_never_export_over_each_other(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fingerprint = checkpoint_fingerprint(root)
    shared = write_graph(tmp_path / "shared.onnx", fingerprint)  # the float32 run's, up to date
    before = shared.read_bytes()
    caplog.set_level(logging.WARNING, logger=onnx_export.__name__)

    graph = ensure_onnx(root, shared, quantize="int8")

    assert graph == onnx_cache_path(fingerprint, "int8")
    assert read_onnx_metadata(graph)[QUANTIZATION_KEY] == "int8"
    assert shared.read_bytes() == before
    [message] = _warnings(caplog)
    assert message.startswith(
        f"the ONNX graph {shared} (HTMLLM_ONNX_PATH) is the float32 graph, not the int8 one asked for: it "
        f"is left as it is (runs of the other precision use it), and the int8 graph exported to {graph} is "
        "served instead"
    )
    own = tmp_path / "shared.int8.onnx"
    assert f"`htmllm export-onnx --checkpoint {root} --out {own} --quantize int8` and point" in message
    # The float32 run still finds its graph as it was; the int8 run's next start reuses its own.
    assert ensure_onnx(root, shared) == shared and shared.read_bytes() == before
    stamp = graph.stat().st_mtime_ns
    caplog.clear()
    assert ensure_onnx(root, shared, quantize="int8") == graph and graph.stat().st_mtime_ns == stamp
    assert len(_warnings(caplog)) == 1 and shared.read_bytes() == before


def test_no_export_replaces_a_graph_of_the_other_quantization_found_under_the_lock(root: Path) -> None:
    """What the caller saw before taking the lock may be old: the graph is looked at again under it."""
    fingerprint = checkpoint_fingerprint(root)
    shared = write_graph(root.parent / "shared.onnx", fingerprint, "int8")
    before = shared.read_bytes()
    checkpoint = load_checkpoint(root)
    for reuse in (True, False):  # a starting server's export, and `htmllm export-onnx`'s
        with pytest.raises(OtherQuantizationError) as raised:
            export_onnx_locked(checkpoint, shared, fingerprint=fingerprint, reuse=reuse)
        assert raised.value.code == "validation_error"
        assert str(raised.value) == (
            f"{shared} holds the int8 ONNX graph, not the float32 one asked for: it is left as it is (runs "
            f"of the other precision use it); give the float32 graph a file of its own "
            f"({shared.with_name('shared.float32.onnx')}, say), or remove {shared} first to replace it"
        )
    assert shared.read_bytes() == before


def test_a_graph_of_the_other_quantization_exported_while_a_start_waits_is_left_to_it(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No graph when a float32 start looked; an int8 export holds the directory's lock and writes one
    meanwhile. The start, once it holds the lock, had exported over it."""
    fingerprint = checkpoint_fingerprint(root)
    shared = tmp_path / "graphs" / "shared.onnx"
    shared.parent.mkdir()
    waiting = threading.Event()

    class Waits(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for the export lock"):
                waiting.set()

    handler = Waits()
    logging.getLogger(onnx_export.__name__).addHandler(handler)
    caplog.set_level(logging.INFO, logger=onnx_export.__name__)
    result: list[Path | BaseException] = []

    def start() -> None:
        try:
            result.append(ensure_onnx(root, shared))
        except BaseException as exc:
            result.append(exc)

    directory = os.open(shared.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)  # the int8 export's lock
        thread = threading.Thread(target=start)
        thread.start()
        assert waiting.wait(120), "the start never waited for the lock"  # a bound for a hang
        write_graph(shared, fingerprint, "int8")
    finally:
        os.close(directory)  # lets the lock go
        logging.getLogger(onnx_export.__name__).removeHandler(handler)
    thread.join(300)  # a bound for a hang: one export
    assert not thread.is_alive()
    assert result == [onnx_cache_path(fingerprint)]
    assert read_onnx_metadata(shared)[QUANTIZATION_KEY] == "int8"
    assert any(
        f"the ONNX graph {shared} (HTMLLM_ONNX_PATH) is the int8 graph" in m for m in _warnings(caplog)
    )


def test_an_onnx_file_htmllm_did_not_export_is_replaced_with_a_warning(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped path naming a user's own model had been replaced with an info line alone."""
    theirs = write_graph(tmp_path / "theirs.onnx", "a user's")
    _strip_fingerprint(theirs)
    caplog.set_level(logging.WARNING, logger=onnx_export.__name__)

    assert ensure_onnx(root, theirs) == theirs
    assert read_onnx_metadata(theirs)[onnx_export.FINGERPRINT_KEY] == checkpoint_fingerprint(root)
    assert any("htmllm did not export" in w and str(theirs) in w for w in _warnings(caplog))


def _strip_fingerprint(graph: Path) -> None:
    import onnx

    model = onnx.load(str(graph))
    kept = [(p.key, p.value) for p in model.metadata_props if p.key != onnx_export.FINGERPRINT_KEY]
    del model.metadata_props[:]
    for key, value in kept:
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.save(model, str(graph))
