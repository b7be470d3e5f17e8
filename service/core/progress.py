"""Progress bars for the long commands (`htmllm embed`, `htmllm extract`, data preparation, tokenizer
training, pretraining): tqdm's bar on a terminal, and a plain line now and then anywhere else.

tqdm redraws its bar in place, with a carriage return, up to ten times a second. Where stderr is a log
(Kubernetes' and Slurm's captured output, `2> run.log`, a CI job) nothing redraws: a log collector, which
splits on newlines, saw one line that grew for the whole run (an hour of `htmllm embed` is some 36,000
redraws). Off a terminal the bar is written as whole lines instead, one at most every `LOG_INTERVAL_S`
seconds, in ASCII, and the last state when it closes.
"""

from __future__ import annotations

import sys
import time
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm

# Off a terminal: the fewest seconds between two progress lines.
LOG_INTERVAL_S = 30.0


# A state drawn again this soon with the same count is the close repeating the last update's line.
_REPEAT_WITHIN_S = 1.0


class _Lines:
    """A stream that writes each state tqdm draws as a line of its own: its carriage returns and the
    blanks it clears a bar with are dropped, and so is a state drawn again within `_REPEAT_WITHIN_S`
    with the same count (tqdm draws the last update, then the same state again when it closes: the log
    ended with the final line twice). A state repeated later (a stalled run's heartbeat) is kept."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._last: tuple[str, float] | None = None

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            count = line.split(" [", 1)[0]  # the description, bar and n/total; not the timings
            now = time.monotonic()
            if self._last is None or self._last[0] != count or now - self._last[1] > _REPEAT_WITHIN_S:
                self._stream.write(line + "\n")
            self._last = (count, now)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # (no such method; a closed stream)
        return False


def progress_bar(*, file: IO[str] | None = None, **options: Any) -> tqdm[Any]:
    """A tqdm bar (`options` are tqdm's) on `file` (stderr by default): as tqdm draws it on a terminal,
    as a line every `LOG_INTERVAL_S` seconds elsewhere."""
    from tqdm import tqdm

    stream = sys.stderr if file is None else file
    if _is_terminal(stream):
        return tqdm(file=stream, **options)
    options.setdefault("mininterval", LOG_INTERVAL_S)
    # (tqdm's monitor thread redraws a bar not drawn for `maxinterval`, 10 s by default)
    options.setdefault("maxinterval", max(options["mininterval"], 10.0))
    options.setdefault("ascii", True)
    return tqdm(file=_Lines(stream), **options)
