"""The garbage collector set for serving: start-up state frozen, young collections rarer; and undone."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.engine.collector import SERVING_YOUNG_THRESHOLD, prepare_for_serving, restore


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture(autouse=True)
def _restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()  # whatever a failing test left frozen goes back to the collector
    gc.set_threshold(*thresholds)


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_what_is_alive_is_frozen_out_of_collections_until_restored() -> None:
    kept = [_Node() for _ in range(3)]
    assert _tracked(kept)

    state = prepare_for_serving()

    # (Frozen objects may die between the two counts, a logging cache's or another thread's: the count
    # only falls. A CI run saw 893,676 recorded and 893,674 counted after.)
    assert 0 < state.frozen - 1000 < gc.get_freeze_count() <= state.frozen
    assert not _tracked(kept), "a frozen object is still scanned by every collection"
    made_after = [_Node()]
    assert _tracked(made_after), "only what existed at the freeze is frozen"

    restore(state)

    assert gc.get_freeze_count() == 0
    assert _tracked(kept)


def test_young_collections_wait_for_more_allocations_until_restored() -> None:
    gc.set_threshold(700, 10, 10)

    state = prepare_for_serving()

    assert gc.get_threshold() == (SERVING_YOUNG_THRESHOLD, 10, 10)
    restore(state)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_set_by_the_host_is_kept() -> None:
    gc.set_threshold(50_000, 20, 30)

    prepare_for_serving()

    assert gc.get_threshold() == (50_000, 20, 30)


def test_start_up_garbage_is_collected_first_not_kept_forever() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b

    prepare_for_serving()

    assert gone() is None


def test_frozen_objects_are_still_freed_by_reference_counting() -> None:
    node = _Node()
    gone = weakref.ref(node)
    prepare_for_serving()

    del node

    assert gone() is None
