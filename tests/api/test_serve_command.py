"""`htmllm serve` / `python -m service.api`: flags, and a clear failure when there is no model."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.api import main as api_main
from service.api import start_checks
from service.api.settings import Settings
from service.cli import build_parser
from service.core.checkpoint import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HTMLLM_PORT", "9000")
    monkeypatch.setenv("HTMLLM_MAX_WAIT_MS", "3")
    flags = ["--host", "127.0.0.1", "--model-path", str(tmp_path), "--max-batch-requests", "1"]
    args = build_parser().parse_args(["serve", *flags, "--intra-op-threads", "3"])
    settings = api_main.settings_from_args(args)
    assert (settings.host, settings.port, settings.model_path) == ("127.0.0.1", 9000, tmp_path)
    assert (settings.max_batch_requests, settings.max_wait_ms) == (1, 3.0)
    assert settings.engine_config().intra_op_threads == 3


def test_missing_default_model_says_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "default-model"
    monkeypatch.setattr("service.api.settings.default_model_path", lambda: missing)
    with pytest.raises(start_checks.ModelMissingError, match="make default-model"):
        start_checks.check_model_path(Settings(model_path=missing))
    assert api_main.serve(Settings(model_path=missing)) == 1
    assert "make default-model" in capsys.readouterr().err


def test_a_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    missing = r"holds no htmllm\.json\); point HTMLLM_MODEL_PATH"
    with pytest.raises(start_checks.ModelMissingError, match=missing):
        start_checks.check_model_path(Settings(model_path=tmp_path))
    with pytest.raises(start_checks.ModelMissingError, match="does not exist; point HTMLLM_MODEL_PATH"):
        start_checks.check_model_path(Settings(model_path=tmp_path / "nothing"))
    (tmp_path / "htmllm.json").write_text("{not json")  # the path passes; reading the file does not
    with pytest.raises(CheckpointError, match=r"htmllm\.json"):
        start_checks.check_model_path(Settings(model_path=tmp_path))


# `python -m service.api` in a fresh interpreter, then whether it imported torch (on stdout).
_MAIN_THEN_TORCH = (
    "import sys; from service.api.main import main; s = main(sys.argv[1:]); "
    "print('torch' in sys.modules); sys.exit(s)"
)


@pytest.mark.parametrize("where", ["missing", "run folder"])
def test_a_model_path_that_is_no_checkpoint_is_refused_before_torch_is_imported(
    tmp_path: Path, where: str
) -> None:
    """It imported the engine, and so torch (4-5 s), to say "no model at", and a training run's folder
    did not point at its model/."""
    run = tmp_path / "runs" / "x" / "pretrain"
    (run / "model").mkdir(parents=True)
    (run / "model" / "htmllm.json").write_text("{}")  # the path check looks no further
    path, message = {
        "missing": (
            tmp_path / "none",
            f"checkpoint directory {tmp_path / 'none'} does not exist; point HTMLLM_MODEL_PATH / "
            "--model-path at a checkpoint directory",
        ),
        "run folder": (
            run,
            f"{run} is not an htmllm checkpoint (it holds no htmllm.json); did you mean --model-path "
            f"{run / 'model'}?",
        ),
    }[where]
    result = subprocess.run(
        [sys.executable, "-c", _MAIN_THEN_TORCH, "--model-path", str(path), "--port", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert (result.returncode, result.stdout) == (1, "False\n"), result.stderr
    assert result.stderr == f"htmllm serve: checkpoint_invalid: {message}\n"


def test_a_refused_setting_is_one_line_that_never_quotes_the_api_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check across fields had printed pydantic's dump of the whole input, the API key's last 22
    characters among it, into the container's log."""
    key = "sk-0123456789abcdefghijklmnopqrstuvwxyzABCD"
    monkeypatch.setenv("HTMLLM_API_KEY", key)
    monkeypatch.setenv("HTMLLM_MAX_INFLIGHT_BYTES", "1000")
    assert api_main.main([]) == 2
    err = capsys.readouterr().err
    assert err == (
        "htmllm serve: invalid settings: HTMLLM_MAX_INFLIGHT_BYTES (1000) is below HTMLLM_MAX_BODY_BYTES "
        "(16777216): a body of the largest accepted size could never be taken; raise the first\n"
    )
    monkeypatch.setenv("HTMLLM_MAX_INFLIGHT_BYTES", str(2**30))
    monkeypatch.setenv("HTMLLM_MAX_BATCH_TOKENS", "-5")
    assert api_main.main(["--port", "70000"]) == 2
    said = "htmllm serve: invalid settings: "
    assert capsys.readouterr().err.splitlines() == [
        said + "HTMLLM_MAX_BATCH_TOKENS: Input should be greater than 0 (got '-5')",
        said + "HTMLLM_PORT: Input should be less than or equal to 65535 (got 70000)",
    ]
    for secret in (key[3:], key[-12:]):
        assert secret not in err


def test_invalid_settings_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert api_main.main(["--port", "70000"]) == 2
    assert "invalid settings" in capsys.readouterr().err
    monkeypatch.setenv("HTMLLM_DTYPE", "float16")  # the engine refuses it on CPU: one line, not a traceback
    assert api_main.main(["--device", "cpu"]) == 2
    assert "float16 is for CUDA" in capsys.readouterr().err


def test_a_max_length_beyond_the_checkpoints_is_one_line_and_exit_2(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A setting this checkpoint cannot serve with, as the settings the Settings class refuses: not 1,
    which says the model is missing or broken."""
    assert api_main.serve(Settings(model_path=tiny_checkpoint, max_length=100_000, port=1)) == 2
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: invalid settings: HTMLLM_MAX_LENGTH 100000 exceeds the ")
    assert err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_is_one_line_and_exit_2(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was the runner's ValueError, a traceback and exit 1, once the checkpoint had loaded."""
    monkeypatch.setenv("HTMLLM_DTYPE", "bfloat16")
    assert api_main.main(["--device", "cuda", "--model-path", str(tiny_checkpoint), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "htmllm serve: invalid settings: device 'cuda', but this machine has no usable CUDA device "
        "(HTMLLM_DEVICE=cuda, HTMLLM_DTYPE=bfloat16, HTMLLM_ATTENTION=auto)\n"
    )


def test_onnx_on_cuda_without_onnxruntimes_cuda_is_one_line_and_exit_2(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked for torch only, it failed once the checkpoint had loaded and the ONNX graph was exported
    (minutes, on a real model). onnxruntime's providers are patched: this holds on a CUDA machine too."""
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setenv("HTMLLM_DTYPE", "float32")
    args = ["--backend", "onnx", "--device", "cuda", "--model-path", str(tiny_checkpoint), "--port", "1"]
    assert api_main.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "htmllm serve: invalid settings: device 'cuda', but onnxruntime has no CUDAExecutionProvider here"
    )
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flash_attention_on_cpu_is_one_line_and_exit_2(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    """It was the runner's ValueError, a traceback and exit 1, once the checkpoint had loaded."""
    monkeypatch.setenv("HTMLLM_ATTENTION", "flash_attention_2")
    monkeypatch.setenv("HTMLLM_DTYPE", dtype)
    assert api_main.main(["--device", "cpu", "--model-path", str(tiny_checkpoint), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "htmllm serve: invalid settings: flash_attention_2 needs CUDA and bfloat16 or float16 "
        f"(HTMLLM_DEVICE=cpu, HTMLLM_DTYPE={dtype}, HTMLLM_ATTENTION=flash_attention_2)\n"
    )


def test_an_attention_the_device_can_run_starts_as_before(tiny_checkpoint: Path) -> None:
    """The check refuses only what the runner would: eager on CPU passes it."""
    start_checks.check_device(Settings(model_path=tiny_checkpoint, attention="eager"))
    start_checks.check_device(Settings(model_path=tiny_checkpoint, backend="onnx", attention="auto"))


def test_an_attention_with_the_onnx_backend_is_refused_before_the_model_loads(
    tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph runs onnxruntime's own attention: HTMLLM_ATTENTION=eager with it had been ignored."""
    monkeypatch.setenv("HTMLLM_BACKEND", "onnx")
    monkeypatch.setenv("HTMLLM_ATTENTION", "eager")
    assert api_main.main(["--model-path", str(tiny_checkpoint), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: invalid settings: attention 'eager' is the torch backend's"), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    "env",
    [
        {"HTMLLM_BACKEND": "onnx", "HTMLLM_ATTENTION": "sdpa"},
        {"HTMLLM_DTYPE": "float16"},
        {"HTMLLM_BACKEND": "onnx", "HTMLLM_DTYPE": "bfloat16"},
    ],
    ids=["onnx-attention", "float16-on-cpu", "onnx-dtype"],
)
def test_a_refused_combination_names_no_flag_serve_lacks(
    tiny_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
) -> None:
    """The engine's refusal of an attention with the onnx backend offered `--attention`, which only
    `htmllm embed` has: `htmllm serve` reads HTMLLM_ATTENTION alone."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert api_main.main(["--model-path", str(tiny_checkpoint), "--device", "cpu", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: invalid settings: ") and "Traceback" not in err
    assert err.count("\n") == 1, err  # one line, as every other refused setting
    parser = argparse.ArgumentParser()
    api_main.add_serve_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", err))
    assert named <= flags, (named - flags, err)


def test_a_checkpoint_the_inference_process_cannot_load_is_one_line(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in process: `checkpoint_invalid` and exit 1, not the child's error as a traceback."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    assert api_main.serve(Settings(model_path=broken, inference_process=True, port=0)) == 1
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: checkpoint_invalid: ") and "Traceback" not in err


def test_an_onnx_graph_that_can_be_written_nowhere_is_one_line(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """HTMLLM_ONNX_PATH stale or missing on a read-only volume, and no writable temporary directory: the
    start ended in `PermissionError` / `OSError: [Errno 30]` tracebacks (exit 1, every new pod crash-looping);
    now one typed line naming both places and the command that writes the graph. (Where the temporary
    directory can be written, the graph is exported there: tests/engine/test_onnx_read_only.py.)"""
    import errno
    import os
    import tempfile

    graph_dir = tmp_path / "models" / "graph"
    graph_dir.mkdir(parents=True)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    mkstemp = tempfile.mkstemp

    def read_only(*args: object, dir: str | None = None, **kwargs: object) -> tuple[int, str]:
        if dir is not None and (Path(dir) == graph_dir or Path(dir).is_relative_to(temporary)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), dir)
        return mkstemp(*args, dir=dir, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    settings = Settings(
        model_path=tiny_checkpoint, backend="onnx", onnx_path=graph_dir / "model.onnx", port=0
    )
    assert api_main.serve(settings) == 1
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: backend_failed: cannot export ") and err.count("\n") == 1, err
    assert f"{graph_dir / 'model.onnx'} cannot be written (Read-only file system)" in err
    assert f"htmllm export-onnx --checkpoint {tiny_checkpoint} --out {graph_dir / 'model.onnx'}" in err


def test_a_file_the_start_cannot_read_is_one_line_not_a_traceback(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError no typed error names (each known one is a CheckpointError or an OnnxExportError) still
    ends the start in one line with the file and its cause."""
    from service.api import app as api_app

    def load_engine(settings: object) -> object:
        raise PermissionError(13, "Permission denied", "/models/html-base/somewhere")

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    assert api_main.serve(Settings(model_path=tiny_checkpoint, port=0)) == 1
    assert capsys.readouterr().err == (
        "htmllm serve: backend_failed: cannot start: PermissionError: [Errno 13] Permission denied: "
        "'/models/html-base/somewhere'\n"
    )
