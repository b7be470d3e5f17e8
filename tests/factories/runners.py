"""Fake runners for the batcher's tests: no model, passes held where a test wants them."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from service.engine.runners import PreparedBatch, RunnerOutput

# How long a pass is held at most, so that a regression fails instead of hanging: never a timing.
HOLD_BOUND_S = 30


class BlockingRunner:
    """A runner whose forward passes wait for `release`: a slow model held mid-pass (or a warm-up batch of
    a large checkpoint on CPU, which nothing in the process can stop: `abort` only records the call, as
    the torch runner's does nothing). `started` and `finished` tell where the pass is."""

    backend = "fake"
    device = "cpu"
    dtype = "float32"
    threads = 1
    attention = "none"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.finished = threading.Event()
        self.aborted = False

    def cost(self, lengths: Sequence[int]) -> int:
        return sum(lengths)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        tokens = sum(len(ids) for ids in batch)
        return PreparedBatch(payload=len(batch), documents=len(batch), tokens=tokens, padded_tokens=tokens)

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.started.set()
        self.release.wait(HOLD_BOUND_S)
        self.finished.set()
        rows = int(prepared.payload)  # type: ignore[call-overload]
        return RunnerOutput(embeddings=np.zeros((rows, 4), dtype=np.float32), scores={})

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass
