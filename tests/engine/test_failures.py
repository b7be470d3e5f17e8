"""Failures of a page itself: named after the document they fail on, in an all-or-nothing call."""

from __future__ import annotations

from service.core.errors import ErrorCode, HtmllmError
from service.core.prune import InputTooLargeError, NestingTooDeepError
from service.core.workers import WorkerTimeoutError
from service.engine.failures import (
    OverLimitError,
    document_name,
    failed_document,
    for_copy,
    mark,
    naming,
    worker_failure,
)
from service.engine.types import Document, OverloadedError


def test_document_names() -> None:
    assert document_name("a", 3) == "document 'a' (index 3)"
    assert document_name(None, 3) == "the document at index 3"
    assert document_name("a", None) == "document 'a'"
    assert document_name(None, None) == "a document"
    assert document_name("x" * 500, 0) == f"document {'x' * 100!r}... (index 0)"


def test_a_marked_page_failure_is_named_by_id_and_index_with_its_code() -> None:
    docs = [Document(html="<p>ok</p>", id="good"), Document(html="<div>", id="bad-doc")]
    failure = mark(NestingTooDeepError("page nests more than 8192 elements deep (the cap)"), docs[1])
    named = naming(failure, docs)
    assert named.code is ErrorCode.PREPROCESS_FAILED
    assert named.message == "document 'bad-doc' (index 1): page nests more than 8192 elements deep (the cap)"
    too_large = naming(mark(InputTooLargeError("too many tags"), docs[0]), docs)
    assert too_large.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert too_large.message == "document 'good' (index 0): too many tags"


def test_a_page_without_id_is_named_by_its_index() -> None:
    docs = [Document(html="<p>a</p>"), Document(html="<p>b</p>")]
    named = naming(mark(NestingTooDeepError("too deep"), docs[1]), docs)
    assert named.message == "the document at index 1: too deep"
    over = naming(mark(OverLimitError(None, "600", 512), docs[0]), docs)
    assert over.code is ErrorCode.TOO_MANY_TOKENS and isinstance(over, OverLimitError)
    assert over.message.startswith("the document at index 0 has 600 tokens, over the model's 512")


def test_the_token_limit_names_id_and_index_once() -> None:
    docs = [Document(html="<p>a</p>", id="long")]
    named = naming(mark(OverLimitError("long", "600", 512), docs[0]), docs)
    assert named.message.startswith("document 'long' (index 0) has 600 tokens")


def test_other_failures_pass_unnamed() -> None:
    docs = [Document(html="<p>a</p>", id="a")]
    overloaded = OverloadedError("the queue is full")
    assert mark(overloaded, docs[0]) is overloaded and failed_document(overloaded) is None
    assert naming(overloaded, docs) is overloaded
    stranger = mark(NestingTooDeepError("too deep"), Document(html="<p>a</p>", id="a"))  # another call's
    assert naming(stranger, docs) is stranger
    internal = HtmllmError("bug", code=ErrorCode.INTERNAL)
    assert naming(internal, docs) is internal


def test_a_copy_waiting_in_the_cache_is_named_after_its_own_document() -> None:
    first, copy = Document(html="<div>", id="first"), Document(html="<div>", id="copy")
    failure = mark(NestingTooDeepError("too deep"), first)
    own = for_copy(failure, copy)
    assert own is not failure and failed_document(own) is copy and failed_document(failure) is first
    assert naming(own, [first, copy]).message == "document 'copy' (index 1): too deep"
    over = for_copy(mark(OverLimitError("first", "600", 512), first), copy)
    assert failed_document(over) is copy and over.message.startswith("document 'copy' has")


def test_the_time_limit_is_named_as_a_library_caller_and_a_server_operator_set_it() -> None:
    """A library caller sets `EngineConfig.preprocess_timeout_s`; the message had named only the HTTP
    service's environment variable, which does nothing for an Engine."""
    failure = worker_failure(WorkerTimeoutError("ran past its limit", elapsed_s=0.6), 0.5)
    assert failure.code is ErrorCode.PREPROCESS_FAILED
    assert failure.message == (
        "preprocessing this page took more than 0.5 s (EngineConfig.preprocess_timeout_s, "
        "HTMLLM_PREPROCESS_TIMEOUT_S in the service); its worker was stopped"
    )
