"""The Engine's public value types, configuration, errors and observer hook, and how a caller's pages
become `Document`s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np

from service.core.errors import ErrorCode, HtmllmError
from service.core.modeling import HeadSpec
from service.core.quantization import QUANTIZED_ONNX_FILES
from service.core.worker_health import StartHealth

BACKENDS = ("torch", "onnx")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
PREPROCESS_POOLS = ("thread", "process")
STAGES = ("prune", "tokenize", "queue", "inference", "total")


@dataclass(frozen=True)
class Document:
    html: str | bytes
    id: str | None = None
    url: str | None = None
    encoding: str | None = None  # declared charset (e.g. from Content-Type), for bytes


# What a `Document`'s html may be: the pruner takes a bytearray as bytes (a memoryview would not pickle
# to a preprocessing process).
_HTML_TYPES = (str, bytes, bytearray)
_TEXT_FIELDS = ("id", "url", "encoding")


def as_document(doc: Document | str | bytes, index: int | None = None) -> Document:
    """`doc` as a `Document`, its fields' types checked here (`index`: its place in the call, for the
    message). A dataclass checks no types, and a wrong one had failed deep inside: an int `id` as an
    internal error with a traceback once a message named the page, an int `encoding` as the page's
    `preprocess_failed`; both are the caller's mistake, `validation_error`."""
    where = "" if index is None else f" (the document at index {index})"
    if isinstance(doc, str | bytes | bytearray):  # a bare bytearray as a Document's html is (the same page)
        return Document(html=doc)
    if not isinstance(doc, Document):
        raise InvalidDocumentError(f"a document is HTML as str or bytes, not {type(doc).__name__}{where}")
    if not isinstance(doc.html, _HTML_TYPES):
        raise InvalidDocumentError(f"a document's html is str or bytes, not {type(doc.html).__name__}{where}")
    for name in _TEXT_FIELDS:
        value = getattr(doc, name)
        if value is not None and not isinstance(value, str):
            raise InvalidDocumentError(
                f"a document's {name} is a str or None, not {type(value).__name__}{where}"
            )
    return doc


def as_documents(docs: Sequence[Document | str | bytes]) -> list[Document]:
    """The documents of a call, in the order their results come back. Refused, as the caller's mistake:
    one page passed bare (a str is a sequence of characters, each would have been embedded as a page of
    its own); a mapping (its keys, the ids of `{id: html}`, had been embedded as the pages, in silence);
    a set (no order: its results could not be told apart); anything not iterable (`None`, `5` had been
    a bare TypeError)."""
    if isinstance(docs, str | bytes | bytearray | Document):
        raise InvalidDocumentError(
            f"documents are a list (one page: [page]), not a single {type(docs).__name__}"
        )
    if isinstance(docs, Mapping):
        raise InvalidDocumentError(
            f"documents are a list, not a {type(docs).__name__} (its keys would be taken as the pages): "
            "pass a list; to keep each key, [Document(html=html, id=key) for key, html in pages.items()]"
        )
    if isinstance(docs, AbstractSet):  # set, frozenset, a mapping's keys() or items()
        raise InvalidDocumentError(
            f"documents are a list, not a {type(docs).__name__}, which has no order for the results to "
            "come back in: pass a list; to tell the results apart, Document(html=..., id=key)"
        )
    try:
        pages = iter(docs)
    except TypeError as exc:
        raise InvalidDocumentError(f"documents are a list of pages, not {type(docs).__name__}") from exc
    return [as_document(d, index) for index, d in enumerate(pages)]


@dataclass(frozen=True)
class StageTimings:
    prune_s: float
    tokenize_s: float
    queue_s: float  # from entering the batcher's queue to the start of its forward pass
    inference_s: float  # the forward pass of the batch it ran in
    total_s: float  # from `embed` being called to the result being ready


@dataclass(frozen=True)
class DocumentResult:
    id: str | None
    embedding: np.ndarray  # float32 (D,), L2-normalised when asked
    scores: dict[str, dict[str, float] | float]  # head -> {label: p} or value
    tokens: int  # tokens the model saw (with [CLS]/[SEP], after truncation)
    truncated: bool
    timings: StageTimings


@dataclass(frozen=True)
class ModelInfo:
    name: str
    embedding_dim: int
    max_length: int
    pooling: str
    heads: list[HeadSpec]
    backend: str
    device: str
    dtype: str
    threads: int  # CPU threads per forward pass (torch: the count it runs now, one per process)
    attention: str  # sdpa | eager | varlen | flash_attention_2 (torch), graph (onnx)
    # Two versions, for they can differ (a checkpoint from before a pruner change is served, with a
    # warning at start-up): every page is pruned by this build's pruner, whatever the checkpoint recorded.
    prune_version: str  # the pruner this build runs on every page (service.core.prune.PRUNE_VERSION)
    checkpoint_prune_version: str  # the one the checkpoint's htmllm.json records it was trained on
    tokenizer_sha256: str
    # The fingerprint (`checkpoint_fingerprint`) of the files the model was loaded from, taken by the
    # process that loaded them (the inference child's, with `inference_process`), and htmllm.json's
    # `training.run_id` there; None for an Engine built around a runner by hand, which cannot say.
    checkpoint_sha256: str | None = None
    training_run_id: str | None = None


@dataclass(frozen=True)
class EngineConfig:
    backend: str = "torch"  # "torch" | "onnx"
    device: str = "cpu"  # "cpu" | "cuda"
    dtype: str = "float32"  # "bfloat16" (CUDA, or a CPU with AMX/AVX512-BF16) | "float16" (CUDA)
    max_length: int | None = None  # default: the checkpoint's
    max_batch_tokens: int = 16384  # padded tokens (or packed tokens under flash-attn) per forward pass
    max_batch_requests: int = 64  # documents per forward pass
    max_wait_ms: float = 2.0  # how long a lone document waits for company before its batch runs
    max_queue_documents: int = 1024  # bounded queue: beyond it, OverloadedError
    preprocess_workers: int = 2
    preprocess_pool: str = "thread"  # "process": the workers are processes (no GIL between pages)
    # "process" only (a thread cannot be stopped or limited): a page still preprocessing after this
    # many seconds has its worker killed and fails typed; each worker's data (heap, private mappings)
    # is capped at this many MiB, so a parse that would take gigabytes fails typed instead. None: none.
    preprocess_timeout_s: float | None = 20.0
    preprocess_memory_limit_mb: int | None = 1024
    truncate: bool = True  # False: a too-long document raises TooManyTokensError
    attn_implementation: str | None = None  # torch: None picks the fastest (runners/torch.choose_attention)
    onnx_path: str | None = None  # onnx: default <checkpoint>/model.onnx, exported at start-up if missing
    onnx_quantize: str | None = None  # onnx on CPU: "int8" runs <checkpoint>/model.int8.onnx
    intra_op_threads: int | None = None  # CPU threads per pass (None: OMP_NUM_THREADS or CPU budget)
    result_cache_documents: int = 0  # an LRU of this many finished documents, reused for identical input
    inference_process: bool = False  # the runner in a child process, with a GIL of its own (runners/process)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {BACKENDS}")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not one of {DEVICES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {DTYPES}")
        if self.device == "cpu" and self.dtype == "float16":
            raise ValueError(
                "float16 is for CUDA; on CPU use float32, or bfloat16 where AMX/AVX512-BF16 exist"
            )
        if self.backend == "onnx" and self.dtype != "float32":
            raise ValueError("the onnx backend runs the float32 graph (or onnx_quantize='int8' on CPU)")
        if self.backend == "onnx" and self.attn_implementation is not None:
            # The graph runs onnxruntime's own fused Attention whatever is asked: an attention named with
            # it had been ignored in silence (a benchmark of "eager" under onnx measured the graph). No
            # setting is named: the caller's names differ (the server's HTMLLM_ATTENTION has no flag,
            # `htmllm embed --attention` no variable), and naming both had offered `htmllm serve` a flag
            # it lacks.
            raise ValueError(
                f"attention {self.attn_implementation!r} is the torch backend's: the onnx backend runs its "
                "graph's own attention; leave it at auto"
            )
        if self.onnx_quantize is not None:
            if self.onnx_quantize not in QUANTIZED_ONNX_FILES:
                choices = tuple(QUANTIZED_ONNX_FILES)
                raise ValueError(f"onnx_quantize {self.onnx_quantize!r} is not one of {choices} (or None)")
            if self.backend != "onnx" or self.device != "cpu":
                raise ValueError("onnx_quantize='int8' needs the onnx backend on CPU")
        if self.preprocess_pool not in PREPROCESS_POOLS:
            raise ValueError(f"preprocess_pool {self.preprocess_pool!r} is not one of {PREPROCESS_POOLS}")
        if self.result_cache_documents < 0:
            raise ValueError("result_cache_documents must not be negative (0 turns the cache off)")
        for name in ("max_batch_tokens", "max_batch_requests", "max_queue_documents", "preprocess_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must not be negative")
        if self.preprocess_timeout_s is not None and not self.preprocess_timeout_s > 0:
            raise ValueError("preprocess_timeout_s must be positive (None: no limit)")
        if self.preprocess_memory_limit_mb is not None and self.preprocess_memory_limit_mb < 1:
            raise ValueError("preprocess_memory_limit_mb must be positive (None: no limit)")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError("max_length must be at least 2")
        if self.intra_op_threads is not None and self.intra_op_threads < 1:
            raise ValueError("intra_op_threads must be at least 1 (None sizes it from the CPU budget)")


class InvalidDocumentError(HtmllmError):
    """A document of the wrong type, or with a field of the wrong type: the caller's mistake."""

    code = ErrorCode.VALIDATION


class EngineError(HtmllmError):
    """Base of the errors the engine itself raises."""


class OverloadedError(EngineError):
    """The queue is full; retry later (HTTP 429 with Retry-After)."""

    code = ErrorCode.OVERLOADED


class TooManyDocumentsError(EngineError):
    """One call carries more documents than the queue can ever hold."""

    code = ErrorCode.TOO_MANY_DOCUMENTS


class DeadlineExceededError(EngineError):
    code = ErrorCode.TIMEOUT


class ShuttingDownError(EngineError):
    """The engine has stopped accepting documents (draining or stopped)."""

    code = ErrorCode.SHUTTING_DOWN


class NotReadyError(EngineError):
    """The engine cannot serve now: `embed` before `start`, or a runner that refuses every pass until the
    server restarts (a model process not started again on a checkpoint changed under it)."""

    code = ErrorCode.NOT_READY


class TooManyTokensError(EngineError):
    code = ErrorCode.TOO_MANY_TOKENS


class UnknownHeadError(EngineError):
    code = ErrorCode.UNKNOWN_HEAD


class BackendError(EngineError):
    """The model runner raised; the message carries the cause."""

    code = ErrorCode.BACKEND_FAILED


class WrongEventLoopError(EngineError):
    """The engine was called from an event loop other than the one `start` ran on: its batcher's tasks
    and futures belong to that loop, and a call from another would wait for them forever."""

    code = ErrorCode.INTERNAL


@dataclass(frozen=True)
class BackendHealth:
    """How the forward passes have gone lately: what readiness and liveness probes read. A failed pass
    is one whose runner raised (or answered rows that cannot be read); any pass that succeeds, a probe
    included, ends a run of failures (a check pass, or a restarted model process's own pass, keeps it
    aside for a failure before the next success to resume). Times are `time.monotonic()` values."""

    failures: int = 0  # consecutive failed passes (0 after a success)
    failing_since: float | None = None  # when the first of those failed
    last_error: str | None = None  # the latest failure's message
    pass_started: float | None = None  # when the pass on the inference thread now began, if one runs
    last_failed_at: float | None = None  # when the latest of the failures was counted (None without any)


# How starting the preprocessing processes has gone lately (`Engine.preprocessing_health`): the record
# both served pools keep (`worker_health.StartHealth`: tries in a row refused for want of a process, the
# pages refused together once), under the name the Engine's API has given it.
PoolHealth = StartHealth


@dataclass(frozen=True)
class BatchStats:
    documents: int
    tokens: int  # real tokens in the batch
    padded_tokens: int  # tokens the forward pass computed (== tokens when packed)
    prepare_s: float  # collation and host-side tensor building (overlapped with the previous batch)
    inference_s: float
    host_s: float | None = None  # CUDA: the part of inference_s the host spent issuing the pass


class EngineObserver:
    """Hooks the HTTP layer turns into metrics. The default does nothing; override what you need.

    Every hook runs on the event loop and must be cheap; an exception from a hook is logged and dropped,
    never allowed to fail a request.
    """

    def batch_done(self, stats: BatchStats) -> None:
        """A forward pass finished (batch size, batch tokens, inference time)."""

    def documents_skipped(self, documents: int) -> None:
        """Documents dropped before their forward pass (caller gone, deadline passed), when dropped."""

    def stage(self, name: str, seconds: float) -> None:
        """One document's time in a stage of STAGES."""

    def queue_size(self, documents: int) -> None:
        """Documents accepted and not yet answered, after every change."""

    def documents_done(self, documents: int, tokens: int) -> None:
        """Documents answered with a result, and their tokens."""

    def documents_failed(self, code: ErrorCode, documents: int) -> None:
        """Documents answered with an error of `code` (skipped, timed out, backend failure...)."""

    def cache_hit(self) -> None:
        """A document answered from the result cache (no prune, tokenize or forward pass)."""

    def worker_replaced(self, pool: str, reason: str) -> None:
        """A worker process of the Engine's pool `pool` was lost or replaced, for one of
        `service.core.worker_health.REPLACEMENT_REASONS` (the kernel's OOM killer, a page past its time
        limit...): each is also a warning in the log."""
