"""What `as_documents` takes as a call's documents: an ordered collection of pages, nothing else.

A dict of `{id: html}` had been iterated for its keys, each id embedded as a page with no error; a set's
results came back in an order the caller could not match; `None` or `5` raised a bare TypeError.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.core.errors import ErrorCode
from service.engine.engine import Engine
from service.engine.types import Document, EngineConfig, InvalidDocumentError, as_documents

PAGE = "<html><body><p>hello world</p></body></html>"
OTHER = "<p>other</p>"


@pytest.mark.parametrize(
    ("docs", "said"),
    [
        ({"p1": PAGE, "p2": OTHER}, r"not a dict \(its keys would be taken as the pages\)"),
        ({PAGE, OTHER}, "not a set, which has no order"),
        (frozenset({PAGE}), "not a frozenset, which has no order"),
        ({"p1": PAGE}.keys(), "not a dict_keys, which has no order"),
        (None, "documents are a list of pages, not NoneType"),
        (5, "documents are a list of pages, not int"),
    ],
)
def test_what_is_not_an_ordered_collection_of_pages_is_a_validation_error(docs: object, said: str) -> None:
    with pytest.raises(InvalidDocumentError, match=said) as refused:
        as_documents(docs)  # type: ignore[arg-type]
    assert refused.value.code is ErrorCode.VALIDATION


def test_the_refusals_of_unordered_documents_say_what_to_pass() -> None:
    for docs in ({"p1": PAGE}, {PAGE}):
        with pytest.raises(InvalidDocumentError) as refused:
            as_documents(docs)  # type: ignore[arg-type]
        assert "pass a list" in refused.value.message and "Document(html=" in refused.value.message


def test_ordered_collections_of_pages_pass_in_their_order() -> None:
    expected = [Document(html=PAGE), Document(html=OTHER)]

    def generated() -> Iterator[str]:
        yield from (PAGE, OTHER)

    assert as_documents((PAGE, OTHER)) == expected
    assert as_documents(generated()) == expected  # type: ignore[arg-type]
    assert as_documents({"p1": PAGE, "p2": OTHER}.values()) == expected  # type: ignore[arg-type]
    assert as_documents([]) == []


def test_an_iterable_that_fails_part_way_raises_its_own_error() -> None:
    """Only a value that cannot be iterated at all is the caller's wrong type; a TypeError raised while
    iterating is the iterable's own, and not hidden as a validation error."""

    def failing() -> Iterator[str]:
        yield PAGE
        raise TypeError("the caller's own bug")

    with pytest.raises(TypeError, match="the caller's own bug"):
        as_documents(failing())  # type: ignore[arg-type]


async def test_the_engine_refuses_a_dict_a_set_and_none_before_any_work(tiny_checkpoint: Path) -> None:
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1)) as engine:
        for docs in ({"p1": PAGE, "p2": OTHER}, {PAGE, OTHER}, None, 5):
            for call in (engine.embed, engine.embed_settled):
                with pytest.raises(InvalidDocumentError) as refused:
                    await call(docs)  # type: ignore[arg-type]
                assert refused.value.code is ErrorCode.VALIDATION
        assert engine.queue_size == 0
        (result,) = await engine.embed([Document(html=PAGE, id="p1")])
        assert result.id == "p1"
