"""Keeping CPython's full garbage collections off the serving path: freeze what start-up loaded.

Why: once torch, transformers, the model and the tokenizer are loaded, a process tracks hundreds of
thousands of container objects that live as long as it does (about 420,000 in a server of the tiny test
model). CPython's full collection (generation 2) walks every one of them, holding the GIL: measured in
the server, about 250 ms each, during which the event loop answers nothing and the forward-pass thread
issues nothing (on a GPU the device idles). Under load one came about every thousand requests, so a
server at a few hundred requests a second stalled for a quarter of a second every few seconds: a tail
latency no batching tunes away.

`gc.freeze()` moves every object tracked at that moment into a permanent generation that collections
skip; after it the same load ran 3 full collections costing 2.6 ms in all. Frozen objects are still
freed by reference counting; only reference cycles among them are never collected, which for start-up
state (modules, the model's weights and modules, the tokenizer) is what a server wants. Each process
that owns a loaded model calls it once, after loading and warming up: the server (after its warm-up),
the inference child process, the bulk `htmllm embed` command. A library caller of `Engine` decides for
its own process.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_loaded_state() -> int:
    """Collect start-up garbage once, then freeze every tracked object; returns how many are frozen.

    The collection first, so that garbage made while loading (import-time cycles, the warm-up batch's
    temporaries) is freed now instead of being kept forever by the freeze.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info(
        "froze %d start-up objects out of the garbage collector's scans (%.0f ms)",
        frozen,
        1000 * (time.perf_counter() - started),
    )
    return frozen


def thaw_loaded_state() -> None:
    """Hand frozen objects back to the collector: for a process that outlives what it froze (an app
    stopped inside a test run or another host), so what was frozen can be collected again."""
    gc.unfreeze()
