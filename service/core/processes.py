"""How the service starts its worker processes (text extractors, preprocessing): one choice for all."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from multiprocessing.context import BaseContext


def worker_context(preload: Sequence[str]) -> BaseContext:
    """forkserver on Linux, spawn elsewhere.

    A forkserver worker never forks the server itself (whose torch threads a fork would copy
    mid-flight) and starts from a process that has imported only `preload`. That list is a hint: the
    forkserver is one per server process, started by whichever pool needs it first, and a module it did
    not preload is imported by the worker when first used (a missing one is skipped). A worker also
    imports the main module of a program run as a script (`python bench.py`; not `python -m
    service.api` or the `htmllm` command), as multiprocessing does: one that imports torch at its top
    gives every worker torch, 7-9 s of each worker's start and about 320 MiB of its memory limit
    (service.core.workers; docs/engine.md). Adding `'__main__'` to `preload` would not spare the workers
    that import: CPython never passes the server the script's path (`forkserver.ensure_running` filters
    for a `main_path` key that `spawn.get_preparation_data` names `init_main_from_path`). Only the script
    can, by importing torch under `if __name__ == "__main__":`; stripping the path from each worker's
    preparation data would mean replacing multiprocessing's private `Popen._launch`.
    """
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        return ctx
    return multiprocessing.get_context("spawn")
