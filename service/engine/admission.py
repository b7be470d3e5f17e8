"""How fast the engine drains its queue, so that a request it cannot serve in time is refused at once.

The queue is bounded in documents (`max_queue_documents`), but what a full queue costs depends on the
pages and the hardware: on two CPU cores the chart's 1,024 documents are 30 to 66 seconds of work, so at
saturation most accepted requests were answered 504 at their 30-second deadline, having held a place in
the queue (and the client) the whole time. With a measured drain rate the engine refuses, with 429 and
`Retry-After`, a request whose documents would wait past its deadline: the client learns at once and can
retry elsewhere, and the requests accepted are the ones that can be answered.

The rate is measured only while the model has work: the batcher calls `busy` when it takes a document
while it held none and ran no pass, `finished` at each batch's end and `idle` once it holds none and runs
none, so idle time never reads as slowness. Counted from the Engine's admissions instead, time with no
batch behind it had: cache hits, /v1/preprocess calls, pages failing in preprocessing (after 10 s of
cache-hit traffic the rate read 1.2 documents a second for 10, and calls were refused at once that would
have been answered in half their deadline). At light load it is the rate of small batches, which
underestimates what a full queue drains at; the estimate then errs towards refusing, and only where the
queue holds more than a deadline's worth at that rate.

Nor does the time a pass waits for its model to load (an inference process restarted after a crash,
the runner's `load_wait_s`) read as slowness: the batcher `exclude`s it. Counted, the wait for a new
process (about 50 s) read as one pass that slow, and for a while after it served at full speed requests
were refused with 429 ("52.9 s of work ... at 0.1 a second").
"""

from __future__ import annotations

import math


class DrainRate:
    """Documents finished per second of busy time, smoothed over about `horizon_s` seconds."""

    def __init__(self, *, horizon_s: float = 5.0) -> None:
        self._horizon_s = horizon_s
        self._rate: float | None = None  # documents per second; None until a batch ends while busy
        self._since: float | None = None  # start of the interval being measured; None while idle

    @property
    def rate(self) -> float | None:
        return self._rate

    def busy(self, now: float) -> None:
        """The queue stopped being empty: measuring starts (or goes on, if it was already busy)."""
        if self._since is None:
            self._since = now

    def idle(self) -> None:
        """The queue emptied: the time until the next document arrives is no work done."""
        self._since = None

    def exclude(self, seconds: float) -> None:
        """`seconds` of the interval being measured were no work of the model's (a pass waiting for it
        to load again): they do not count."""
        if self._since is not None and seconds > 0:
            self._since += seconds

    def finished(self, now: float, documents: int) -> None:
        """A batch of `documents` ended at `now`."""
        if self._since is None or documents <= 0:
            return
        interval = max(now - self._since, 1e-6)
        sample = documents / interval
        if self._rate is None:
            self._rate = sample
        else:
            # Time-weighted: a burst of quick batches counts as much as one slow batch of the same span.
            weight = 1.0 - math.exp(-interval / self._horizon_s)
            self._rate += weight * (sample - self._rate)
        self._since = now

    def seconds_for(self, documents: int) -> float | None:
        """How long `documents` take to drain at the measured rate; None before any measurement."""
        if self._rate is None or self._rate <= 0:
            return None
        return documents / self._rate
