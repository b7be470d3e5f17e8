"""Service settings: one pydantic-settings class read from `HTMLLM_*` environment variables.

Built in `service.api.main` (or by a caller of `create_app`), never at import, so importing the package
reads no environment and tests construct settings explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.api.api_keys import key_problem
from service.core.attention import AUTO_ATTENTION, Attention, attention_option
from service.core.cpus import pool_workers
from service.core.extract import DEFAULT_TIMEOUT_S
from service.core.quantization import NO_QUANTIZATION, Quantization, quantization_option

if TYPE_CHECKING:
    from service.engine import EngineConfig


# The most workers each pool gets by default; fewer under a smaller CPU budget (`pool_workers`).
DEFAULT_POOL_WORKERS = 2
# The longest any setting in seconds (`*_s`) may be: a day. A request's deadline is its timeout from now,
# and the Engine refuses one more than a year ahead (`MAX_DEADLINE_AHEAD_S`: a time.time() given for a
# time.monotonic()), so HTMLLM_REQUEST_TIMEOUT_S=1e12 was taken at start and answered every embedding
# request 422; HTMLLM_DRAIN_TIMEOUT_S=inf crashed the start after the model had loaded. Nothing a server
# waits for takes a day, and where a setting has "never" it is 0: past the bound a value is refused at
# start (exit 2), as any other setting's wrong value is.
MAX_DURATION_S = 86_400
# What the in-flight budget (`service.api.limits`) charges a JSON body, as `service.api.documents` does:
# its bytes, then `sys.getsizeof` of every string parsed from it. A character takes at least one byte of
# the body and at most 4 of a string (one character outside the BMP, an emoji, makes Python store the
# whole string so; an em dash, 2 bytes a character): 5 bytes charged a byte of body, plus each string's
# own part (`STRING_OVERHEAD_BYTES`). A raw page is charged its bytes alone.
JSON_CHARGE_PER_BODY_BYTE = 5
# sys.getsizeof's part of a str whatever its length: at most 76 bytes of header and a 4-byte terminator.
STRING_OVERHEAD_BYTES = 80
# The strings of a request: a document's html, id and url, and a few of the request's own (a model or
# user name, a language, head and extractor names).
STRINGS_PER_DOCUMENT = 3
STRINGS_PER_REQUEST = 64


def largest_json_charge(max_body_bytes: int, max_documents: int) -> int:
    """The most the in-flight budget charges one JSON body of at most `max_body_bytes` carrying at most
    `max_documents` documents: what `max_inflight_bytes` must hold for an idle server to take it."""
    strings = STRINGS_PER_DOCUMENT * max_documents + STRINGS_PER_REQUEST
    return JSON_CHARGE_PER_BODY_BYTE * max_body_bytes + STRING_OVERHEAD_BYTES * strings


def _default_workers(data: dict[str, Any]) -> int:
    """A worker pool's default: the forward pass's threads (the same CPU budget), at most 2, at least 1."""
    return pool_workers(data.get("intra_op_threads"), cap=DEFAULT_POOL_WORKERS)


def default_model_path() -> Path:
    """The bundled default model, `service/assets/default-model` inside the installed package."""
    return Path(__file__).resolve().parents[1] / "assets" / "default-model"


class Settings(BaseSettings):
    """Everything the HTTP service is configured by; every field is `HTMLLM_<FIELD>` in the environment."""

    # hide_input_in_errors: pydantic's text of an error quotes the value refused, the API key's included,
    # into a traceback; `errors()` keeps them for `main.settings_errors`, which shows all but the key.
    model_config = SettingsConfigDict(
        env_prefix="HTMLLM_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    # The model and how it runs.
    model_path: Path = Field(default_factory=default_model_path, description="checkpoint directory")
    backend: Literal["torch", "onnx"] = "torch"
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="bfloat16 on CUDA or on a CPU with AMX/AVX512-BF16; float16 on CUDA"
    )
    onnx_quantize: Quantization = Field(
        NO_QUANTIZATION, description="onnx backend on CPU: int8 runs the dynamically quantised graph"
    )
    onnx_path: Path | None = Field(
        None,
        description="onnx backend: the graph file, used when up to date with the checkpoint, else written "
        "there; default <checkpoint>/model.onnx, or the temporary directory when the checkpoint is read-only",
    )
    attention: Attention = Field(
        AUTO_ATTENTION,
        description="torch backend: auto takes, on CUDA in half precision, the flash-attn package when "
        "installed, else torch's own varlen kernel (packed batches, no padding computed) when it passes a "
        "probe on the GPU, else SDPA with padded batches (always on CPU)",
    )
    max_length: int | None = Field(None, ge=2, description="tokens per document; default the model's")
    intra_op_threads: int | None = Field(
        None,
        gt=0,
        description="CPU threads per forward pass; default OMP_NUM_THREADS, else the container's CPU limit "
        "or affinity (service.core.cpus)",
    )

    # The dynamic batcher (see service.engine).
    max_batch_tokens: int = Field(16384, gt=0)
    max_batch_requests: int = Field(64, gt=0, description="documents per forward pass")
    # At most a day, as every setting in seconds (`MAX_DURATION_S`): `inf` had started and answered every
    # request 504. A lone document waits this long for batch mates: at the request timeout or past it,
    # a quiet server's every request times out (milliseconds are what it is for).
    max_wait_ms: float = Field(2.0, ge=0, le=MAX_DURATION_S * 1000)
    max_queue_documents: int = Field(1024, gt=0, description="beyond it a request gets 429")
    preprocess_workers: int = Field(
        default_factory=_default_workers,
        gt=0,
        description="prune/tokenize workers; default 2, or fewer when the forward pass runs fewer threads "
        "(intra_op_threads: the same CPU budget), at least 1",
    )
    preprocess_pool: Literal["thread", "process"] = Field(
        "process",
        description="process: the preprocess workers are processes: pruning holds the GIL, so threads "
        "prune about 1.1x as fast as one, and a process can be stopped and held to a memory limit, a "
        "thread cannot; thread: no processes (about 50-65 MB resident each), no limits",
    )
    preprocess_timeout_s: float = Field(
        20.0,
        gt=0,
        le=MAX_DURATION_S,
        description="process pool: a page still preprocessing after this long has its worker killed and "
        "fails as preprocess_failed (the request timeout bounds it too)",
    )
    preprocess_memory_limit_mb: int = Field(
        1024,
        ge=0,
        description="process pool: each worker's data (heap, private mappings; Linux RLIMIT_DATA) in MiB; "
        "a page whose parse needs more fails typed (about 170 MiB idle, 200 for a 16 MiB page); 0: none",
    )
    inference_process: bool = Field(
        False,
        description="run the model in a child process with a GIL of its own, so that the event loop's "
        "work never delays a forward pass (on a GPU, whose kernels take microseconds, it can dominate); "
        "a child that dies fails its batch and is started again",
    )
    warmup: bool = Field(True, description="run one full-size batch before /ready says ready")
    result_cache_documents: int = Field(
        0, ge=0, description="an LRU of this many finished documents, reused for byte-identical pages; 0: off"
    )

    # Per-request limits.
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="413 beyond it, before parsing")
    max_documents: int = Field(64, gt=0, description="documents per request; 422 beyond it")
    max_inflight_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="request bodies the server holds at once (received, not yet answered); a body that "
        "would pass it gets 429 with Retry-After, so a burst of large pages cannot exhaust memory; at "
        "least max_body_bytes; below what one JSON body of max_body_bytes can be charged (5x it, and 80 "
        "bytes a string: largest_json_charge) the server warns at start",
    )
    request_timeout_s: float = Field(30.0, gt=0, le=MAX_DURATION_S, description="504 beyond it")
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        le=MAX_DURATION_S,
        description="408 when a request's body takes longer than this to arrive",
    )
    head_timeout_s: float = Field(
        30.0,
        gt=0,
        le=MAX_DURATION_S,
        description="a connection that sends no request head (request line and headers) within this long "
        "of opening, or of the head's first byte, is closed (408 head_timeout where part of one came); "
        "one whose answers stay unread this long is aborted",
    )
    truncate: bool = Field(True, description="default policy: truncate long documents, or reject (422)")
    retry_after_s: int = Field(1, ge=0, le=MAX_DURATION_S, description="Retry-After on 429 and 503")

    # The backend's health as the probes report it (a CUDA fault, a child that cannot restart).
    unready_after_failures: int = Field(
        3,
        ge=1,
        description="/ready answers 503 after this many forward passes failed in a row (and probes the "
        "backend until one succeeds)",
    )
    unhealthy_after_s: float = Field(
        300.0,
        ge=0,
        le=MAX_DURATION_S,
        description="/health answers 503 (a liveness probe restarts the server) when every forward pass "
        "has failed for this long, one pass has run this long, the warm-up has failed (and been "
        "retried) for this long, no preprocessing or extractor process could start for this long, or "
        "one preprocessing job on a thread has run this long; 0: never",
    )
    unready_after_pass_s: float | None = Field(
        None,
        ge=0,
        le=MAX_DURATION_S,
        description="/ready answers 503 while one forward pass has run this long (a hung device), until "
        "passes finish again; default request_timeout_s: every document in such a pass has timed out "
        "already, so it serves no one and new requests would only queue behind it; also one page's job "
        "on a preprocessing thread (HTMLLM_PREPROCESS_POOL=thread); 0: never",
    )

    # Text extraction (/v1/extract) runs in its own thread pool, off the event loop.
    extract_workers: int = Field(
        default_factory=_default_workers,
        gt=0,
        description="extractor processes for /v1/extract; default as preprocess_workers: 2, or fewer under "
        "a smaller CPU budget, at least 1",
    )
    extract_timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_DURATION_S,
        description="each extractor's time on one page (/v1/extract); past it that extraction is an "
        "extraction_failed error, and the others keep theirs; the request timeout bounds it too",
    )
    extract_memory_limit_mb: int = Field(
        2048,
        ge=0,
        description="each extractor worker's data (heap, private mappings; Linux RLIMIT_DATA) in MiB; an "
        "extraction that needs more is an extraction_failed error (about 110 MiB idle, at most 554 "
        "measured on 16 MiB pages); 0: none",
    )

    # Access and serving.
    api_key: SecretStr | None = Field(
        None,
        description="when set, model routes need `Bearer <key>`; visible ASCII (letters, digits, "
        "punctuation; spaces inside it), surrounding white space (a file's last newline) not part of it",
    )
    api_key_file: Path | None = Field(
        None,
        description="a file of API keys, one per line (# comments), re-read when it changes: rotate keys "
        "without a restart; model routes then need one of them (or HTMLLM_API_KEY)",
    )
    host: str = Field(
        "0.0.0.0",
        description="the address to bind: 0.0.0.0 every IPv4 address; :: every IPv6 address and only those "
        "(asyncio's and uvloop's servers set IPV6_V6ONLY whatever net.ipv6.bindv6only says); an empty "
        "string both families, one socket each (0.0.0.0 and ::)",
    )
    port: int = Field(8000, ge=0, le=65535)
    keep_alive_timeout_s: int = Field(
        75,
        ge=1,
        le=MAX_DURATION_S,
        description="an idle keep-alive connection is closed after this long; keep it longer than the idle "
        "timeout of the proxy or load balancer in front (60 s for AWS ALB and ingress-nginx, 600 s for "
        "Google's): one that pools connections longer reuses a connection the server has just closed, and "
        "the request on it fails (a 502, or a reset)",
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, le=MAX_DURATION_S, description="graceful shutdown: time to drain the queue"
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text", description="json: one JSON object per log line (uvicorn's too), for log pipelines"
    )
    access_log: bool = Field(
        False,
        description="one log line per request, at info whatever log_level says: request id, method, path "
        "(never the query string), status, milliseconds, client address; in log_format",
    )
    connection_max_requests: int = Field(
        10_000,
        ge=0,
        description="a keep-alive connection's answer to its this-many-th request carries Connection: "
        "close, so clients reconnect and a Service's per-connection balancing reaches new pods; 0: no limit",
    )
    connection_max_age_s: float = Field(
        300.0,
        ge=0,
        le=MAX_DURATION_S,
        description="the first answer on a keep-alive connection open this long carries Connection: "
        "close (as connection_max_requests); 0: no limit",
    )
    gzip_min_bytes: int = Field(
        1024,
        ge=0,
        description="responses this large are gzipped for clients that send Accept-Encoding: gzip; 0: never",
    )

    @field_validator("api_key")
    @classmethod
    def _sendable_key(cls, key: SecretStr | None) -> SecretStr | None:
        # Checked here, not first by ApiKeys, so that it is one line of the settings' errors (exit 2).
        if key is None:
            return None
        stripped = key.get_secret_value().strip()
        problem = key_problem(stripped)
        if problem is not None:
            raise ValueError(problem + (" (unset it to turn auth off)" if not stripped else ""))
        return SecretStr(stripped)

    @model_validator(mode="after")
    def _one_body_fits(self) -> Settings:
        # A smaller budget would refuse every body between the two sizes forever, idle server or not.
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(
                f"HTMLLM_MAX_INFLIGHT_BYTES ({self.max_inflight_bytes}) is below HTMLLM_MAX_BODY_BYTES "
                f"({self.max_body_bytes}): a body of the largest accepted size could never be taken; "
                "raise the first"
            )
        return self

    def json_budget_warning(self) -> str | None:
        """What to warn of at start where the in-flight budget holds a raw body of the cap but not every
        JSON one (`largest_json_charge`), or None: such a JSON body gets 413 even on an idle server. A
        warning, not a refusal: configurations that started before keep starting, and a crawler that
        sends raw bodies, or ASCII pages, never meets it; but with both at 1 MiB a 600 KB JSON page got
        413 where the same page raw got 200, and nothing had said so."""
        needed = largest_json_charge(self.max_body_bytes, self.max_documents)
        if self.max_inflight_bytes >= needed:
            return None
        overhead = needed - JSON_CHARGE_PER_BODY_BYTE * self.max_body_bytes
        body_fits = (self.max_inflight_bytes - overhead) // JSON_CHARGE_PER_BODY_BYTE
        lower = f" or lower HTMLLM_MAX_BODY_BYTES to {body_fits}" if body_fits > 0 else ""
        return (
            f"HTMLLM_MAX_INFLIGHT_BYTES ({self.max_inflight_bytes}) is below {needed}, the most one JSON "
            f"body of HTMLLM_MAX_BODY_BYTES ({self.max_body_bytes}) can be charged (its bytes and its "
            "strings at up to 4 bytes a character, plus 80 bytes a string for "
            f"HTMLLM_MAX_DOCUMENTS={self.max_documents}): a JSON body near the cap may get 413 even on an "
            "idle server (a raw body of the cap is taken); raise HTMLLM_MAX_INFLIGHT_BYTES to "
            f"{needed}{lower}"
        )

    @property
    def stalled_pass_s(self) -> float | None:
        """How long one forward pass may run before /ready turns 503 (None: never)."""
        limit = self.request_timeout_s if self.unready_after_pass_s is None else self.unready_after_pass_s
        return limit or None

    @property
    def extract_limit_s(self) -> float:
        """Each extractor's time on one page as /v1/extract runs it (and /info reports it): within the
        request's, so a stuck page cannot outlive its request."""
        return min(self.extract_timeout_s, self.request_timeout_s)

    def engine_config(self) -> EngineConfig:
        """The Engine's configuration; the settings are the one place both are read from."""
        from service.engine import EngineConfig

        return EngineConfig(
            backend=self.backend,
            device=self.device,
            dtype=self.dtype,
            onnx_quantize=quantization_option(self.onnx_quantize),
            onnx_path=None if self.onnx_path is None else str(self.onnx_path),
            attn_implementation=attention_option(self.attention),
            max_length=self.max_length,
            intra_op_threads=self.intra_op_threads,
            max_batch_tokens=self.max_batch_tokens,
            max_batch_requests=self.max_batch_requests,
            max_wait_ms=self.max_wait_ms,
            max_queue_documents=self.max_queue_documents,
            preprocess_workers=self.preprocess_workers,
            preprocess_pool=self.preprocess_pool,
            # A page whose request has timed out is not worth its worker.
            preprocess_timeout_s=min(self.preprocess_timeout_s, self.request_timeout_s),
            preprocess_memory_limit_mb=self.preprocess_memory_limit_mb or None,
            truncate=self.truncate,
            result_cache_documents=self.result_cache_documents,
            inference_process=self.inference_process,
        )
