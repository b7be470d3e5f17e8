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

Cycles made while serving. With young collections that rare, garbage in a reference cycle is promoted
before it is found and waits for a full collection: 1.1 million net allocations away, one in 15 minutes
of a soak. A failed request's error, its traceback and a frame that named the error made such a cycle
and kept the request's page (12 MB refused pages: RSS 1.66 to 4.04 GB in 2 minutes, never returned).
The cycles found are broken where they are made; `collect_cycles` is the net for those made elsewhere
(a library's, or one not found yet): a full collection every second or so, which the freeze makes cheap
(measured in the server under load: 2,200 objects outside the frozen set, 1 ms a collection; 0.1 ms
idle), spaced out further should one ever cost more than 1% of the time.

Exit. `restore` hands the frozen objects back for a process that outlives what it prepared (tests,
another host), but a process that is exiting then walked all of them in the interpreter's final
collections: a second and more after uvicorn's last line, outside the drain's budget (the pod's grace
period). The first `prepare_for_serving` of a process freezes them again at exit (`atexit`, which runs
before those collections) rather than guessing, when an app stops, whether its process will go on.

Each process that owns a loaded model calls `prepare_for_serving` once, after loading and warming up:
the server (after its warm-up), the inference child process, the bulk `htmllm embed` command. A library
caller of `Engine` decides for its own process.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# Net tracked allocations between young collections while serving (CPython's default is 700).
SERVING_YOUNG_THRESHOLD = 10_000
# `collect_cycles`: a full collection this often, unless it costs more than `FULL_COLLECTION_SHARE` of
# the time, when it is spaced out to that share. A second strands at most a second's failed pages.
FULL_COLLECTION_INTERVAL_S = 1.0
FULL_COLLECTION_SHARE = 0.01

_freezes_at_exit = False  # whether this process's `atexit` freezes (`prepare_for_serving`)


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
    _freeze_at_exit()
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


def _freeze_at_exit() -> None:
    """Once per process: freeze every tracked object when it exits (the module's docstring, "Exit")."""
    global _freezes_at_exit
    if not _freezes_at_exit:
        _freezes_at_exit = True
        atexit.register(gc.freeze)


async def collect_cycles(
    interval_s: float = FULL_COLLECTION_INTERVAL_S, share: float = FULL_COLLECTION_SHARE
) -> None:
    """Until cancelled, a full collection every `interval_s`, or less often where one takes more than
    `share` of the time between them: the net for reference cycles nobody broke (the module's
    docstring). On the event loop, which a collection would hold up from any thread (it holds the GIL)."""
    wait_s = interval_s
    while True:
        await asyncio.sleep(wait_s)
        started = time.perf_counter()
        found = gc.collect()
        took = time.perf_counter() - started
        wait_s = max(interval_s, took / share)
        if found:
            logger.debug("a full collection found %d unreachable objects (%.1f ms)", found, 1000 * took)


def cancel_and_forget(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel a call's tasks still running, and drop them from `tasks`. A failed task keeps its error,
    whose traceback keeps the frame of the call that raised it: while that frame still names the task
    (the list, or a loop variable) it is a cycle, which kept every page of a failed call until a full
    collection (the module's docstring, "Cycles made while serving"). Hence a function: its loop variable
    dies with it. For the engine's `_embed_all` and the preprocess route's `_preprocess_all`."""
    for task in tasks:
        task.cancel()
    tasks.clear()
