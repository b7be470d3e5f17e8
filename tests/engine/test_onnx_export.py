"""`export_onnx_locked`'s directory lock: every exporter into a directory holds it, whatever happens
while it waits for it. What an export says: its own lines, the exporters' warnings that matter, nothing
else, and the process's logging left as it was."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import service.engine.onnx_export as onnx_export

REPO = Path(__file__).resolve().parents[2]


def test_a_failing_wait_notice_never_drops_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`on_wait` raising OSError (`htmllm export-onnx` printing its notice to a closed pipe, EPIPE) was
    taken for a file system without flock: the export ran without the lock, beside the export holding
    it. The wait still happens and the export runs under the lock. (The other holder is a patched
    `flock`: no second process, no timing.)"""
    real_flock = fcntl.flock
    calls: list[str] = []

    def held_by_another_export(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB and not calls:
            calls.append("tried")
            raise BlockingIOError(11, "Resource temporarily unavailable")
        calls.append("tried" if operation & fcntl.LOCK_NB else "waited")
        real_flock(fd, operation)

    def closed_pipe(directory: Path) -> None:
        calls.append("said")
        raise BrokenPipeError(32, "Broken pipe")

    exported: list[bool] = []

    def export(checkpoint: object, out: Path, **_: object) -> Path:
        fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: conflicts with a holder
            exported.append(False)
        except BlockingIOError:
            exported.append(True)
        finally:
            os.close(fd)
        return out

    monkeypatch.setattr(fcntl, "flock", held_by_another_export)
    monkeypatch.setattr(onnx_export, "export_onnx", export)
    out = tmp_path / "graphs" / "model.onnx"
    assert onnx_export.export_onnx_locked(object(), out, fingerprint="f", on_wait=closed_pipe) == out  # type: ignore[arg-type]
    assert calls == ["tried", "said", "waited"]
    assert exported == [True], "exported without the directory's lock"


# A server starting with `--backend onnx` and no graph: its logging (root handler at INFO), then the
# export `ensure_onnx` runs at start-up. int8: the quantizer's lines come on top of the exporter's.
_SERVER_EXPORT = """
import sys
from service.api.logs import configure_logging
from service.engine.onnx_export import ensure_onnx
configure_logging("info", "text")
ensure_onnx(sys.argv[1], quantize="int8")
"""


@pytest.mark.slow
def test_an_export_at_server_start_logs_only_its_own_lines(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """An export at start-up wrote 181 lines for the tiny model (277 for the bundled one): torchvision
    "not installed" warnings, torch.onnx's progress prints, onnxscript's and onnx_ir's INFO narration,
    onnxruntime's quantizer INFO per tensor and its pre-processing advice on the root logger. Now: that
    it exports, and where, and that it did, in how long. A fresh process, since torch's warnings come
    through its own handler and stdout and stderr are what an operator reads."""
    root = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _SERVER_EXPORT, str(root)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    graph = root / "model.int8.onnx"
    assert graph.is_file()
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].endswith(f" INFO service.engine.onnx_export: exporting {root} to ONNX at {graph}")
    assert f" INFO service.engine.onnx_export: exported {root} to ONNX at {graph} in " in lines[1]
    assert lines[1].endswith("s")


def _logging_state() -> object:
    root = logging.getLogger()
    return (
        [logging.getLogger(name).level for name in ("onnxscript", "onnx_ir")],
        list(root.filters),
        list(root.handlers),
        list(logging.getLogger(onnx_export._TORCH_REGISTRATION_LOGGER).filters),
        list(warnings.filters),
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _record(name: str, level: int, message: str, pathname: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, message, None, None)


def test_the_exporters_chatter_is_dropped_their_warnings_kept_and_logging_restored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside `_quiet_exporters`: onnxscript/onnx_ir INFO, the torchvision skips and the quantizer's
    root-logger INFO and pre-processing advice are dropped; their other warnings, and every other
    module's root records, pass. After it (raising or not), levels, filters, handlers and warning
    filters are what they were, and a root handler that the quantizer's `logging.warning` configured
    (`basicConfig`, where the root had none) is gone."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in `htmllm export-onnx`, which configures no logging
    caplog.set_level(logging.INFO)  # as the server's root logger; restored through setLevel
    collect = _Collect()
    registration = logging.getLogger(onnx_export._TORCH_REGISTRATION_LOGGER)
    narrating = logging.getLogger("onnxscript.optimizer._constant_folding")
    for logger in (registration, narrating):
        monkeypatch.setattr(logger, "handlers", [collect])
        monkeypatch.setattr(logger, "propagate", False)
    quantizer = os.path.join(os.sep, "venv", "site-packages", "onnxruntime", "quantization", "quantize.py")
    root_seen: list[str] = []

    def on_root(record: logging.LogRecord) -> bool:  # after the quiet filter: sees what the handlers would
        root_seen.append(record.getMessage())
        return False

    before = _logging_state()
    with pytest.raises(RuntimeError, match="export failed"), onnx_export._quiet_exporters():
        narrating.info("Skipping constant folding for node 'x'")
        narrating.warning("a rewrite rule failed")
        registration.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
        registration.warning("an operator has no ONNX translation")
        root.addFilter(on_root)
        for record in (
            _record("root", logging.INFO, 'Quantization parameters for tensor:"x" not specified', quantizer),
            _record("root", logging.WARNING, "Please consider to run pre-processing", quantizer),
            _record("root", logging.WARNING, "the model has no MatMul to quantize", quantizer),
            _record("root", logging.INFO, "another module's line", __file__),
        ):
            root.handle(record)
        root.removeFilter(on_root)
        logging.warning("Please consider to run pre-processing")  # calls basicConfig: the root had none
        assert root.handlers, "the module-level call configured no root handler"
        raise RuntimeError("export failed")
    assert _logging_state() == before
    assert collect.messages == ["a rewrite rule failed", "an operator has no ONNX translation"]
    assert root_seen == ["the model has no MatMul to quantize", "another module's line"]
    narrating.info("after the export")
    assert collect.messages[-1] == "after the export", "onnxscript's level stayed raised"
