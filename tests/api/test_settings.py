"""Settings from HTMLLM_* variables, and their mapping onto the Engine's configuration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.api import documents as documents_module
from service.api.documents import parse_json
from service.api.schemas import EmbedRequest
from service.api.settings import Settings, default_model_path, largest_json_charge
from service.core import cpus
from service.core.cpus import CpuBudget
from tests.api.conftest import SettingsFactory, app_client

JSON_TYPE = {"content-type": "application/json"}


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


def test_a_budget_below_the_costliest_json_body_of_the_cap_is_warned_of() -> None:
    """A JSON body is charged its bytes and its strings, up to 4 bytes a character: with both at 1 MiB
    (accepted, being equal), a 600 KB JSON page got 413 on an idle server where the same page raw got
    200, and nothing had said so. Below what one body of the cap can be charged, the start warns, saying
    what would do (a warning: configurations that started keep starting)."""
    mib = 1024 * 1024
    needed = largest_json_charge(mib, 64)
    assert 5 * mib < needed < 5 * mib + 64 * 1024  # the body's 5x, and each string's own bytes
    assert Settings(max_body_bytes=mib, max_inflight_bytes=needed).json_budget_warning() is None
    for budget in (mib, 2 * mib, needed - 1):
        message = Settings(max_body_bytes=mib, max_inflight_bytes=budget).json_budget_warning()
        assert message is not None
        assert f"HTMLLM_MAX_INFLIGHT_BYTES ({budget}) is below {needed}, " in message
        suggested = re.fullmatch(
            rf".*raise HTMLLM_MAX_INFLIGHT_BYTES to {needed} or lower HTMLLM_MAX_BODY_BYTES to (\d+)", message
        )
        assert suggested is not None, message
        smaller = int(suggested[1])  # the other way out works too, and is the largest that does
        assert Settings(max_body_bytes=smaller, max_inflight_bytes=budget).json_budget_warning() is None
        assert Settings(max_body_bytes=smaller + 1, max_inflight_bytes=budget).json_budget_warning()
    # It counts the documents a request may carry (each has strings); the defaults need no warning.
    assert largest_json_charge(mib, 1000) > needed
    assert Settings().json_budget_warning() is None


def _costliest_json_body(size: int, documents: int) -> bytes:
    """An embedding request of `size` bytes charged as much as any: every string holds a character
    outside the BMP (4 bytes a character), its other characters ASCII (one byte of body each)."""
    docs = [{"html": "\N{GRINNING FACE}", "id": "\N{GRINNING FACE}", "url": "\N{GRINNING FACE}"}] * documents
    short = len(json.dumps({"documents": docs}, ensure_ascii=False).encode())
    fill, extra = divmod(size - short, documents)
    docs = [
        {**doc, "html": doc["html"] + "a" * (fill + (extra if i == 0 else 0))} for i, doc in enumerate(docs)
    ]
    body = json.dumps({"documents": docs}, ensure_ascii=False).encode()
    assert len(body) == size
    return body


def test_the_bound_is_what_the_json_path_charges() -> None:
    """The bound is the route's own charge (`service.api.documents`: the body, then `sys.getsizeof` of each
    string parsed from it) of the costliest body: never above it, and past 5x the body, as it says."""
    size, documents = 64 * 1024, 4
    body = _costliest_json_body(size, documents)
    charged = len(body) + documents_module._text_bytes(parse_json(EmbedRequest, body))
    bound = largest_json_charge(size, documents)
    assert 5 * size < charged <= bound


async def test_an_idle_server_at_the_smallest_budget_takes_the_costliest_body(
    settings_for: SettingsFactory,
) -> None:
    """At the least budget the settings allow, the JSON body that costs the most is served, not 413."""
    size, documents = 64 * 1024, 4
    budget = largest_json_charge(size, documents)
    settings = settings_for(max_body_bytes=size, max_documents=documents, max_inflight_bytes=budget)
    async with app_client(settings) as client:
        response = await client.post(
            "/v1/embed", content=_costliest_json_body(size, documents), headers=JSON_TYPE
        )
        assert response.status_code == 200, response.text[:300]
        assert len(response.json()["data"]) == documents


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
