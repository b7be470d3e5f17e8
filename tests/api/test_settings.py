"""Settings from HTMLLM_* variables, and their mapping onto the Engine's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.api.settings import Settings, default_model_path
from service.core import cpus
from service.core.cpus import CpuBudget


def test_defaults_point_at_the_bundled_model() -> None:
    settings = Settings()
    assert settings.model_path == default_model_path()
    assert default_model_path().parts[-3:] == ("service", "assets", "default-model")
    assert settings.api_key is None and settings.truncate is True
    assert (settings.host, settings.port) == ("0.0.0.0", 8000)


def test_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {
        "HTMLLM_MODEL_PATH": str(tmp_path),
        "HTMLLM_API_KEY": "secret",
        "HTMLLM_MAX_BATCH_TOKENS": "4096",
        "HTMLLM_MAX_BATCH_REQUESTS": "8",
        "HTMLLM_MAX_WAIT_MS": "5.5",
        "HTMLLM_MAX_QUEUE_DOCUMENTS": "32",
        "HTMLLM_MAX_BODY_BYTES": "1000",
        "HTMLLM_MAX_DOCUMENTS": "4",
        "HTMLLM_REQUEST_TIMEOUT_S": "2.5",
        "HTMLLM_BACKEND": "onnx",
        "HTMLLM_DEVICE": "cpu",
        "HTMLLM_DRAIN_TIMEOUT_S": "7",
        "HTMLLM_TRUNCATE": "false",
        "HTMLLM_INTRA_OP_THREADS": "3",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.model_path == tmp_path
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "secret"
    assert "secret" not in repr(settings)
    assert (settings.max_body_bytes, settings.max_documents, settings.request_timeout_s) == (1000, 4, 2.5)
    assert (settings.drain_timeout_s, settings.truncate) == (7.0, False)
    config = settings.engine_config()
    assert (config.backend, config.device, config.truncate) == ("onnx", "cpu", False)
    assert (config.max_batch_tokens, config.max_batch_requests, config.max_wait_ms) == (4096, 8, 5.5)
    assert config.max_queue_documents == 32
    assert config.intra_op_threads == 3
    monkeypatch.delenv("HTMLLM_INTRA_OP_THREADS")
    assert Settings().engine_config().intra_op_threads is None  # sized from the CPU budget at load
    assert config.onnx_quantize is None  # "none", the default, is the float32 graph
    monkeypatch.setenv("HTMLLM_ONNX_QUANTIZE", "int8")
    assert Settings().engine_config().onnx_quantize == "int8"
    assert config.onnx_path is None  # <checkpoint>/model.onnx, or the temporary directory if read-only
    monkeypatch.setenv("HTMLLM_ONNX_PATH", str(tmp_path / "graphs" / "model.onnx"))
    assert Settings().engine_config().onnx_path == str(tmp_path / "graphs" / "model.onnx")
    assert config.preprocess_pool == "process"  # a process can be stopped and held to a memory limit
    # A page is not worth its worker past its request's timeout (2.5 s here, under the default 20 s).
    assert (config.preprocess_timeout_s, config.preprocess_memory_limit_mb) == (2.5, 1024)
    monkeypatch.setenv("HTMLLM_PREPROCESS_POOL", "thread")
    assert Settings().engine_config().preprocess_pool == "thread"
    monkeypatch.setenv("HTMLLM_PREPROCESS_MEMORY_LIMIT_MB", "0")
    monkeypatch.setenv("HTMLLM_REQUEST_TIMEOUT_S", "60")
    limits = Settings().engine_config()
    assert limits.preprocess_memory_limit_mb is None  # 0: no limit
    assert limits.preprocess_timeout_s == 20.0
    monkeypatch.delenv("HTMLLM_PREPROCESS_MEMORY_LIMIT_MB")
    monkeypatch.setenv("HTMLLM_REQUEST_TIMEOUT_S", "2.5")
    assert config.attn_implementation is None  # auto: the runner picks for its device
    assert config.inference_process is False
    monkeypatch.setenv("HTMLLM_INFERENCE_PROCESS", "true")
    assert Settings().engine_config().inference_process is True
    monkeypatch.setenv("HTMLLM_ATTENTION", "varlen")
    with pytest.raises(ValueError, match="is the torch backend's"):  # the onnx graph has its own
        Settings().engine_config()
    for name in ("HTMLLM_BACKEND", "HTMLLM_ONNX_QUANTIZE", "HTMLLM_ONNX_PATH"):
        monkeypatch.delenv(name)
    assert Settings().engine_config().attn_implementation == "varlen"
    # Explicit values (command-line flags) win over the environment.
    assert Settings(max_documents=9).max_documents == 9


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HTMLLM_BACKEND", "tensorflow"),
        ("HTMLLM_DEVICE", "tpu"),
        ("HTMLLM_MAX_DOCUMENTS", "0"),
        ("HTMLLM_MAX_BODY_BYTES", "-1"),
        ("HTMLLM_REQUEST_TIMEOUT_S", "0"),
        ("HTMLLM_ONNX_QUANTIZE", "int4"),
        ("HTMLLM_ATTENTION", "flash"),
        ("HTMLLM_INTRA_OP_THREADS", "0"),
    ],
)
def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_the_inflight_budget_takes_at_least_one_body() -> None:
    """A budget below the body cap would refuse every body between the two, on an idle server too."""
    assert Settings(max_body_bytes=1000, max_inflight_bytes=1000).max_inflight_bytes == 1000
    with pytest.raises(ValidationError, match=r"HTMLLM_MAX_INFLIGHT_BYTES .* is below HTMLLM_MAX_BODY_BYTES"):
        Settings(max_body_bytes=1001, max_inflight_bytes=1000)


def test_worker_pools_default_to_the_cpu_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a 1-CPU limit the pools defaulted to 2 workers each beside the 1 thread the model ran;
    now they follow the budget the forward pass follows (at most 2, at least 1) unless set."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpus, "cpu_budget", lambda: CpuBudget(affinity=64, limit=1.0, limit_file="cpu.max"))
    settings = Settings()
    assert (settings.preprocess_workers, settings.extract_workers) == (1, 1)
    assert settings.engine_config().preprocess_workers == 1
    monkeypatch.setenv("HTMLLM_PREPROCESS_WORKERS", "3")
    assert (Settings().preprocess_workers, Settings().extract_workers) == (3, 1)  # set: kept
    assert Settings(intra_op_threads=4).extract_workers == 2  # the pass's threads, up to 2
    monkeypatch.setattr(cpus, "cpu_budget", lambda: CpuBudget(affinity=64))
    assert (Settings().preprocess_workers, Settings().extract_workers) == (3, 2)
    monkeypatch.setenv("HTMLLM_EXTRACT_WORKERS", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_the_stalled_pass_bound_is_the_request_timeout_unless_set() -> None:
    """A pass that has run a whole request timeout has served no one (every document in it timed out)."""
    assert Settings(request_timeout_s=12).stalled_pass_s == 12
    assert Settings(request_timeout_s=12, unready_after_pass_s=40).stalled_pass_s == 40
    assert Settings(unready_after_pass_s=0).stalled_pass_s is None  # never
    with pytest.raises(ValidationError, match="unready_after_pass_s"):
        Settings(unready_after_pass_s=-1)
