"""`answer_or_cancel` leaves a failed request's error (and the page it names) to reference counting.

A serving process collects reference cycles all but never (service.engine.collector), and an error of a
page keeps the page (`service.engine.failures.mark`): a cycle through the error kept a refused page per
failed request in a soak that grew the server by gigabytes. Here the collector is off.
"""

from __future__ import annotations

import asyncio
import weakref

import pytest
from fastapi import Request
from starlette.types import Message

from service.api.runtime import answer_or_cancel
from service.core.errors import ErrorCode, HtmllmError


class _Page:
    """Stands for the page an error names."""


def _refusal(page: _Page) -> HtmllmError:
    error = HtmllmError("the page nests too deep", code=ErrorCode.PREPROCESS_FAILED)
    error.page = page  # type: ignore[attr-defined]  # as `failures.mark` keeps the Document
    return error


async def _refuse(page: _Page) -> None:
    await asyncio.sleep(0)
    raise _refusal(page)  # (not through a local: this frame would hold what it raised, a cycle of its own)


async def _connected() -> Message:
    """A client that stays connected: `receive` has nothing more to say."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _code_of_failure(page: _Page) -> str:
    """The code `answer_or_cancel` raised for work failing on `page`; the error itself is let go."""
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, _connected)
    try:
        await answer_or_cancel(request, _refuse(page), timeout_s=60)
    except HtmllmError as exc:
        return str(exc.code)
    raise AssertionError("the work's failure was not raised")


@pytest.mark.usefixtures("no_collector")
async def test_a_failed_work_leaves_its_page_to_reference_counting() -> None:
    page = _Page()
    ref = weakref.ref(page)
    assert await _code_of_failure(page) == ErrorCode.PREPROCESS_FAILED
    del page
    for _ in range(3):  # the disconnect watcher, cancelled, ends on the loop's next turns
        await asyncio.sleep(0)
    assert ref() is None, "the failed work's page outlived the request: a reference cycle holds it"
