"""service/core/progress.py: tqdm's bar on a terminal, whole lines in a log."""

from __future__ import annotations

import io

from service.core import progress
from service.core.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_state_is_a_line_of_its_own() -> None:
    """A log (Kubernetes', Slurm's) splits on newlines: tqdm's carriage-return redraws made one line
    that grew for the whole run."""
    log = io.StringIO()
    bar = progress_bar(file=log, total=3, desc="embed", unit="doc", mininterval=0)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("embed:   0%") and lines[-1].startswith("embed: 100%")
    assert len(lines) == 4 and not lines[-2].startswith("embed: 100%")  # the close did not repeat it
    assert all(line.isascii() and line.strip() == line for line in lines)
    # A bar that clears itself (leave=False) leaves no blank line behind.
    log = io.StringIO()
    with progress_bar(file=log, total=2, leave=False, mininterval=0) as bar:
        bar.update(2)
    assert all(line.strip() for line in log.getvalue().splitlines())


def test_off_a_terminal_lines_come_at_most_every_interval() -> None:
    log = io.StringIO()
    bar = progress_bar(file=log, total=1000)
    for _ in range(1000):
        bar.update(1)
    assert len(log.getvalue().splitlines()) == 1  # the first state; the next after LOG_INTERVAL_S
    assert bar.mininterval == progress.LOG_INTERVAL_S
    bar.close()


def test_a_terminal_gets_tqdms_bar_and_disable_writes_nothing() -> None:
    terminal = _Terminal()
    with progress_bar(file=terminal, total=2, mininterval=0) as bar:
        bar.update(2)
    assert "\r" in terminal.getvalue()
    quiet = io.StringIO()
    with progress_bar(file=quiet, total=2, disable=True) as bar:
        bar.update(2)
    assert quiet.getvalue() == ""
