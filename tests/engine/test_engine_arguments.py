"""A library caller's arguments of the wrong type fail as typed 4xx errors, before any work is done.

`Document` is a dataclass, which checks no types: an int `id` had passed until a message named the page
(an internal error with a traceback), an int `encoding` until the decoder (the page's
`preprocess_failed`), and `heads=[1]` had raised a bare TypeError from the message about it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from service.core.errors import ErrorCode, HtmllmError
from service.engine.engine import Engine
from service.engine.types import (
    Document,
    EngineConfig,
    InvalidDocumentError,
    UnknownHeadError,
    as_document,
    as_documents,
)
from tests.factories.tokenizer import WORDS

PAGE = "<html><body><p>hello world</p></body></html>"


@pytest.mark.parametrize(
    ("document", "field", "given"),
    [
        (Document(html=PAGE, id=7), "id", "int"),  # type: ignore[arg-type]
        (Document(html=PAGE, url=b"https://example.com/"), "url", "bytes"),  # type: ignore[arg-type]
        (Document(html=PAGE.encode(), encoding=123), "encoding", "int"),  # type: ignore[arg-type]
        (Document(html=None), "html", "NoneType"),  # type: ignore[arg-type]
        (Document(html=["<p>x</p>"]), "html", "list"),  # type: ignore[arg-type]
    ],
)
def test_a_document_field_of_the_wrong_type_is_a_validation_error(
    document: Document, field: str, given: str
) -> None:
    with pytest.raises(InvalidDocumentError, match=rf"{field} is .* not {given}") as single:
        as_document(document)
    assert single.value.code is ErrorCode.VALIDATION
    with pytest.raises(InvalidDocumentError, match=rf"not {given} \(the document at index 1\)"):
        as_documents([PAGE, document])


def test_documents_of_the_right_types_pass_as_they_are() -> None:
    full = Document(html=PAGE.encode(), id="p1", url="https://example.com/", encoding="windows-1250")
    loose = Document(html=bytearray(PAGE.encode()))  # type: ignore[arg-type]  # taken as the pruner takes it
    assert as_documents([full, loose]) == [full, loose]
    assert as_documents([PAGE]) == [Document(html=PAGE)]
    bare = bytearray(PAGE.encode())  # as a Document's html is: had been refused "not bytearray"
    assert as_documents([bare]) == [Document(html=bare)]  # type: ignore[list-item,arg-type]


async def test_wrong_field_types_fail_typed_in_the_engine_without_an_error_log(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    long_page = f"<html><body><p>{' '.join(WORDS * 40)}</p></body></html>"  # over the tiny model's length
    caplog.set_level(logging.ERROR)
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        for document in (
            Document(html=long_page, id=7),  # type: ignore[arg-type]
            Document(html=PAGE.encode(), encoding=123),  # type: ignore[arg-type]
        ):
            for call in (engine.embed, engine.embed_settled):
                with pytest.raises(InvalidDocumentError) as info:
                    await call([document], truncate=False)
                assert info.value.code is ErrorCode.VALIDATION
            with pytest.raises(InvalidDocumentError):
                await engine.preprocess(document)
        assert engine.queue_size == 0
        # the right types still go through (the too-long page fails for its length, named by its id)
        with pytest.raises(HtmllmError, match="document 'p7' has") as over:
            await engine.embed([Document(html=long_page, id="p7")], truncate=False)
        assert over.value.code is ErrorCode.TOO_MANY_TOKENS
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_head_name_that_is_not_a_str_is_an_unknown_head(tiny_checkpoint: Path) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        with pytest.raises(UnknownHeadError) as info:
            await engine.embed([PAGE], heads=[1])  # type: ignore[list-item]
        assert info.value.code is ErrorCode.UNKNOWN_HEAD


@pytest.mark.parametrize(
    ("deadline", "said"),
    [
        (lambda: "5", "not str"),
        (lambda: True, "not bool"),
        (lambda: float("nan"), "NaN"),
        (lambda: float("inf"), "more than a year"),
        (lambda: time.time() + 5, "not a time.time() one"),  # the wall clock, not time.monotonic()
        (lambda: time.monotonic() + 2 * 365 * 86_400, "more than a year"),
    ],
)
async def test_a_deadline_that_is_no_monotonic_time_is_a_validation_error(
    tiny_checkpoint: Path, deadline: Callable[[], object], said: str
) -> None:
    """`"5"` had been a bare TypeError, and `time.time() + 5` (the wall clock) was taken and never
    expired."""
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        for call in (engine.embed, engine.embed_settled):
            with pytest.raises(InvalidDocumentError, match=re.escape(said)) as refused:
                await call([PAGE], deadline=deadline())  # type: ignore[arg-type]
            assert refused.value.code is ErrorCode.VALIDATION
            assert "time.monotonic()" in str(refused.value)
        assert engine.queue_size == 0


async def test_normalize_and_truncate_that_are_no_bools_are_validation_errors(tiny_checkpoint: Path) -> None:
    """`truncate="no"` had been taken as true (a non-empty string), and a 10,000-token page truncated."""
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        for options in ({"truncate": "no"}, {"normalize": "false"}, {"normalize": None}, {"truncate": 0}):
            with pytest.raises(InvalidDocumentError, match="is a bool, not") as refused:
                await engine.embed([PAGE], **options)  # type: ignore[arg-type]
            assert refused.value.code is ErrorCode.VALIDATION
        assert len(await engine.embed([PAGE], truncate=None, normalize=False)) == 1
        assert engine.queue_size == 0


async def test_a_deadline_of_any_real_number_type_is_taken(tiny_checkpoint: Path) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        ahead = time.monotonic() + 60
        for deadline in (int(ahead), np.float64(ahead), ahead):
            assert len(await engine.embed([PAGE], deadline=deadline)) == 1  # type: ignore[arg-type]
