"""CPython's garbage collector, set for serving once a model is loaded: frozen start-up state, fewer
young collections.

Full collections. Once torch, transformers, the model and the tokenizer are loaded, a process tracks
hundreds of thousands of container objects that live as long as it does (about 410,000 in a server of
the tiny test model). A full collection (generation 2) walks every one of them, holding the GIL:
measured in the server, 100-500 ms each, during which the event loop answers nothing and the
forward-pass thread issues nothing (on a GPU the device idles). Under load one came about every 1,500
requests. `gc.freeze()` moves every object tracked at that moment into a permanent generation that
collections skip; after it the same collections took 1-25 ms. Frozen objects are still freed by
reference counting; only reference cycles among them are never collected, which for start-up state
(modules, the model's weights and modules, the tokenizer) is what a server wants.

Young collections. CPython collects generation 0 whenever tracked allocations outnumber deallocations
by 700. A server's in-flight requests (their tasks, futures, dicts, pydantic models) cross that many
times a second although almost all of it dies young: at 150 requests a second the server ran 650
young collections and 58 of generation 1 in 20 s, 0.25-0.32 s of held GIL, about 5% of the event
loop's time. At a threshold of 10,000 the same load ran 2-3 young collections (under 10 ms in all):
what a request allocates is freed by reference counting long before the count reaches it.

Each process that owns a loaded model calls `prepare_for_serving` once, after loading and warming up:
the server (after its warm-up), the inference child process, the bulk `htmllm embed` command. A library
caller of `Engine` decides for its own process.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Net tracked allocations between young collections while serving (CPython's default is 700).
SERVING_YOUNG_THRESHOLD = 10_000


@dataclass(frozen=True)
class CollectorState:
    """What `prepare_for_serving` changed, for `restore` to undo."""

    frozen: int  # objects frozen out of collections
    thresholds: tuple[int, int, int]  # gc.get_threshold() before


def prepare_for_serving() -> CollectorState:
    """Collect start-up garbage once, freeze every tracked object, raise the young threshold.

    The collection first, so that garbage made while loading (import-time cycles, the warm-up batch's
    temporaries) is freed now instead of being kept forever by the freeze.
    """
    started = time.perf_counter()
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    gc.set_threshold(max(thresholds[0], SERVING_YOUNG_THRESHOLD), *thresholds[1:])
    logger.info(
        "froze %d start-up objects out of the garbage collector's scans (%.0f ms)",
        frozen,
        1000 * (time.perf_counter() - started),
    )
    return CollectorState(frozen=frozen, thresholds=thresholds)


def restore(state: CollectorState) -> None:
    """Hand frozen objects back to the collector and put the thresholds back: for a process that
    outlives what it prepared (an app stopped inside a test run or another host)."""
    gc.unfreeze()
    gc.set_threshold(*state.thresholds)
