"""Freezing start-up state out of the garbage collector's scans, and handing it back."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.engine.collector import freeze_loaded_state, thaw_loaded_state


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # whatever a failing test left frozen goes back to the collector


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_what_is_alive_is_frozen_out_of_collections_until_thawed() -> None:
    kept = [_Node() for _ in range(3)]
    assert _tracked(kept)

    frozen = freeze_loaded_state()

    assert frozen == gc.get_freeze_count() > 0
    assert not _tracked(kept), "a frozen object is still scanned by every collection"
    made_after = [_Node()]
    assert _tracked(made_after), "only what existed at the freeze is frozen"

    thaw_loaded_state()

    assert gc.get_freeze_count() == 0
    assert _tracked(kept)


def test_start_up_garbage_is_collected_first_not_kept_forever() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b

    freeze_loaded_state()

    assert gone() is None


def test_frozen_objects_are_still_freed_by_reference_counting() -> None:
    node = _Node()
    gone = weakref.ref(node)
    freeze_loaded_state()

    del node

    assert gone() is None
