"""`POST /v1/preprocess` leaves the pages of a failed call to reference counting.

A serving process collects reference cycles all but never (service.engine.collector), and a failed
document's task keeps its error, whose traceback keeps the frame that awaited it: a frame still naming
the tasks was a cycle that kept every page of the call. Here the collector is off.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import cast

import pytest

from service.api.routers.preprocess import _preprocess_all
from service.core.errors import HtmllmError
from service.core.preparation import Preprocessed, PreprocessError
from service.engine import Engine
from service.engine.failures import mark
from service.engine.types import Document


class _RefusingEngine:
    """Refuses the page with id "deep" (marked with it, as the engine does); keeps the others waiting."""

    async def preprocess(self, doc: Document) -> Preprocessed:
        await asyncio.sleep(0)
        if doc.id == "deep":
            raise mark(PreprocessError("the page nests too deep"), doc)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def _code_of_failure(documents: list[Document]) -> str:
    try:
        await _preprocess_all(cast(Engine, _RefusingEngine()), documents)
    except HtmllmError as exc:
        return str(exc.code)
    raise AssertionError("the failure was not raised")


@pytest.mark.usefixtures("no_collector")
async def test_the_pages_of_a_failed_call_are_freed_without_a_collection() -> None:
    documents = [Document(html=b"<p>fine</p>", id="fine"), Document(html=b"<div>" * 9000, id="deep")]
    refs = [weakref.ref(doc) for doc in documents]
    assert await _code_of_failure(documents) == "preprocess_failed"
    del documents
    for _ in range(3):  # the cancelled sibling ends on the loop's next turns
        await asyncio.sleep(0)
    alive = sum(1 for ref in refs if ref() is not None)
    assert not alive, f"{alive} pages outlived their call: a reference cycle holds them"
