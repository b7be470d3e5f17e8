"""service/engine/failures.py: a failure named after its document leaves no reference cycle holding the page.

A serving process collects reference cycles all but never (service.engine.collector), and a failure of a
page itself keeps the page (`failures.mark`): a cycle through the error kept a 12 MB refused page per
request in a soak. Here the collector is off; the page must die with the error.
"""

from __future__ import annotations

import weakref

import pytest

from service.core.errors import HtmllmError
from service.core.preparation import PreprocessError
from service.engine.failures import mark, naming_failures
from service.engine.types import Document


def _message_of_failure(documents: list[Document], failed: Document) -> str:
    """The message `naming_failures` answers for a page failure of `failed`."""
    try:
        with naming_failures(documents):
            # (Not through a local: this frame would then hold what it raised, a cycle of the test's own.)
            raise mark(PreprocessError("the page nests too deep"), failed)
    except HtmllmError as exc:
        return exc.message
    raise AssertionError("naming_failures swallowed the failure")


@pytest.mark.usefixtures("no_collector")
def test_a_failure_named_after_its_document_leaves_the_page_to_reference_counting() -> None:
    """(A failure passed on as it is leaves no cycle either: contextlib hands it back with the traceback
    it came with, without the frames of `naming_failures`.)"""
    doc = Document(html=b"<div>" * 1000, id="p1")
    page = weakref.ref(doc)

    message = _message_of_failure([Document(html=b"<p>fine</p>"), doc], doc)

    assert message == "document 'p1' (index 1): the page nests too deep"
    del doc
    assert page() is None, "the failure's page outlived it: a reference cycle holds it"
