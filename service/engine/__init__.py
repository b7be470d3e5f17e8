"""The inference engine: batching and model runners, usable without HTTP.

`from service.engine import Engine, EngineConfig, Document` is the public surface; the value types and
errors live in `service.engine.types`.
"""

from service.engine.engine import Engine
from service.engine.types import (
    BackendError,
    BackendHealth,
    BatchStats,
    DeadlineExceededError,
    Document,
    DocumentResult,
    EngineConfig,
    EngineObserver,
    ModelInfo,
    NotReadyError,
    OverloadedError,
    ShuttingDownError,
    StageTimings,
    TooManyDocumentsError,
    TooManyTokensError,
    UnknownHeadError,
    WrongEventLoopError,
)

__all__ = [
    "BackendError",
    "BackendHealth",
    "BatchStats",
    "DeadlineExceededError",
    "Document",
    "DocumentResult",
    "Engine",
    "EngineConfig",
    "EngineObserver",
    "ModelInfo",
    "NotReadyError",
    "OverloadedError",
    "ShuttingDownError",
    "StageTimings",
    "TooManyDocumentsError",
    "TooManyTokensError",
    "UnknownHeadError",
    "WrongEventLoopError",
]
