"""What a library caller catches is importable from `service.engine`, and the classes relate as
docs/engine.md says: a page's own failure is told by its code (`PAGE_FAILURES`), not by one base class."""

from __future__ import annotations

from pathlib import Path

import pytest

import service.engine
from service.engine import (
    PAGE_FAILURES,
    BackendError,
    DeadlineExceededError,
    Engine,
    EngineConfig,
    EngineError,
    ErrorCode,
    HtmllmError,
    InputTooLargeError,
    InvalidDocumentError,
    NestingTooDeepError,
    NotReadyError,
    OverloadedError,
    Preprocessed,
    PreprocessError,
    ProcessLostError,
    PruneError,
    ShuttingDownError,
    TooManyDocumentsError,
    TooManyTokensError,
    UnknownHeadError,
    WordTooLongError,
    WrongEventLoopError,
)


def test_everything_in_all_is_importable() -> None:
    missing = [name for name in service.engine.__all__ if not hasattr(service.engine, name)]
    assert not missing
    named = ("HtmllmError", "PreprocessError", "PruneError", "InputTooLargeError", "InvalidDocumentError")
    assert set(named) <= set(service.engine.__all__)


def test_a_pages_failures_are_told_by_their_code_not_one_base_class() -> None:
    """`except PreprocessError` misses an over-nested or huge page: those are `PruneError`s."""
    for pruned in (InputTooLargeError, NestingTooDeepError):
        assert issubclass(pruned, PruneError) and not issubclass(pruned, PreprocessError)
    page_failures = (
        PreprocessError,
        PruneError,
        InputTooLargeError,
        NestingTooDeepError,
        WordTooLongError,
        TooManyTokensError,
        InvalidDocumentError,
    )
    for page_failure in page_failures:
        assert issubclass(page_failure, HtmllmError) and page_failure.code in PAGE_FAILURES, page_failure
    engine_failures = (
        BackendError,
        DeadlineExceededError,
        NotReadyError,
        OverloadedError,
        ShuttingDownError,
        TooManyDocumentsError,
        UnknownHeadError,
        WrongEventLoopError,
    )
    for engine_failure in engine_failures:
        assert issubclass(engine_failure, EngineError) and engine_failure.code not in PAGE_FAILURES, (
            engine_failure
        )
    # the server's trouble though raised for a page: retryable, not the page's
    assert ProcessLostError.code is ErrorCode.NOT_READY and ProcessLostError.code not in PAGE_FAILURES


async def test_an_over_nested_page_is_a_prune_error_with_a_page_failure_code(tiny_checkpoint: Path) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        with pytest.raises(PruneError) as info:
            await engine.embed([b"<div>" * 10_000])
        assert isinstance(info.value, NestingTooDeepError) and info.value.code in PAGE_FAILURES
        (settled,) = await engine.embed_settled([b"<div>" * 10_000])
        assert isinstance(settled, NestingTooDeepError)
        shown = await engine.preprocess("<p>x</p>")
        assert isinstance(shown, Preprocessed) and shown.tokens_exact
