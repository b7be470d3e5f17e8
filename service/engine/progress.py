"""Where each document of a call is (preprocessing, waiting for a copy, queued, in a forward pass, done),
so that a passed deadline can say what the time went on: the first thing to read about a 504.

Apart from the Engine because it is per-call bookkeeping that reads the batcher but owns none of the
Engine's state.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from service.engine.batcher import Batcher, BatchRow

# Where a document of a call can be (besides done); `Progress` says which, for a passed deadline.
PREPROCESSING = "preprocessing"  # waiting for a worker thread, pruning or tokenizing
AWAITING_COPY = "waiting for an identical page in flight"  # the result cache
QUEUED = "queued"  # in the batcher, not yet in a forward pass
IN_PASS = "in a forward pass"
DONE = "done"


@dataclass
class Progress:
    """Where one document of a call is, so that a passed deadline can say what the time went on."""

    stage: str = PREPROCESSING
    since: float = field(default_factory=time.monotonic)
    future: asyncio.Future[BatchRow] | None = None  # its row of a batch, once queued

    def enter(self, stage: str) -> None:
        self.stage, self.since = stage, time.monotonic()


def describe(track: Progress, now: float, batcher: Batcher | None) -> str:
    """One document's stage and how long it has been in it, e.g. "queued (29.7 s)"."""
    stage, seconds = stage_of(track, now, batcher)
    return f"{stage} ({seconds:.1f} s)"


def stage_of(track: Progress, now: float, batcher: Batcher | None) -> tuple[str, float]:
    if track.stage == QUEUED and track.future is not None and batcher is not None:
        started = batcher.pass_started(track.future)
        if started is not None:
            return IN_PASS, now - started
    return track.stage, now - track.since


def whereabouts(progress: Sequence[Progress], batcher: Batcher | None) -> str:
    """Where a call's documents were when its deadline passed, e.g. "2 queued (longest 29.7 s),
    1 in a forward pass (longest 12.0 s), 1 done": the first thing to read about a 504."""
    now = time.monotonic()
    counts: Counter[str] = Counter()
    longest: dict[str, float] = {}
    for track in progress:
        stage, seconds = stage_of(track, now, batcher)
        counts[stage] += 1
        longest[stage] = max(longest.get(stage, 0.0), seconds)
    return ", ".join(
        f"{n} {stage}" if stage == DONE else f"{n} {stage} (longest {longest[stage]:.1f} s)"
        for stage, n in counts.items()
    )
