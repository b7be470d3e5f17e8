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
    gives every worker torch, about 300 MiB of the memory limit (service.core.workers).
    """
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        return ctx
    return multiprocessing.get_context("spawn")
