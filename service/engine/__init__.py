"""The inference engine: batching and model runners, usable without HTTP.

`from service.engine import Engine, EngineConfig, Document` is the public surface; the value types and
the engine's errors live in `service.engine.types`. Everything a library caller catches is importable
from here, the page's own failures raised below the engine (pruning, preprocessing) included: a caller
that had to know `service.core.prune` to catch an over-nested page caught `PreprocessError` and missed
it (docs/engine.md says which class or code means what).
"""

from service.core.errors import ErrorCode, HtmllmError
from service.core.preparation import Preprocessed, PreprocessError
from service.core.prune import InputTooLargeError, NestingTooDeepError, PruneError
from service.core.words import WordTooLongError
from service.engine.engine import Engine
from service.engine.failures import PAGE_FAILURES, ProcessLostError
from service.engine.types import (
    BackendError,
    BackendHealth,
    BatchStats,
    DeadlineExceededError,
    Document,
    DocumentResult,
    EngineConfig,
    EngineError,
    EngineObserver,
    InvalidDocumentError,
    ModelInfo,
    NotReadyError,
    OverloadedError,
    PoolHealth,
    ShuttingDownError,
    StageTimings,
    TooManyDocumentsError,
    TooManyTokensError,
    UnknownHeadError,
    WrongEventLoopError,
)

__all__ = [
    "PAGE_FAILURES",
    "BackendError",
    "BackendHealth",
    "BatchStats",
    "DeadlineExceededError",
    "Document",
    "DocumentResult",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineObserver",
    "ErrorCode",
    "HtmllmError",
    "InputTooLargeError",
    "InvalidDocumentError",
    "ModelInfo",
    "NestingTooDeepError",
    "NotReadyError",
    "OverloadedError",
    "PoolHealth",
    "PreprocessError",
    "Preprocessed",
    "ProcessLostError",
    "PruneError",
    "ShuttingDownError",
    "StageTimings",
    "TooManyDocumentsError",
    "TooManyTokensError",
    "UnknownHeadError",
    "WordTooLongError",
    "WrongEventLoopError",
]
