"""The progress bars of the libraries the training commands call into: transformers' ("Loading weights"
when a teacher or baseline loads, "Writing model shards" at every checkpoint) and, through the same
switch, huggingface_hub's download bars.

They are plain tqdm bars on stderr, out of reach of `service.core.progress.progress_bar`: off a terminal
(`2> run.log`, a CI job, a cluster's captured output) each is carriage-return redraws a log collector
reads as one growing line, and `--no-progress` did not reach them at all. So they are shown only where
our own bars are drawn as bars: progress asked for, and stderr a terminal.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


def drawn_as_bars(show: bool) -> bool:
    """Whether progress shown on stderr is drawn as a bar (`show`, and stderr a terminal)."""
    if not show:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # (a replaced stream without the method; a closed one)
        return False


@contextlib.contextmanager
def library_bars(show: bool) -> Iterator[None]:
    """Within, transformers' and huggingface_hub's bars are off unless `drawn_as_bars(show)`.

    A process-wide switch of transformers (it sets huggingface_hub's too), restored on the way out.
    """
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    turn_off = was_on and not drawn_as_bars(show)
    if turn_off:
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if turn_off:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
