"""How a command's process ends once its work is over, shared by the service's and the training CLIs: the
status of a run whose reader went away (`PIPE_CLOSED`), standard output let go of after that
(`discard_stdout`), and an exit that a late Ctrl-C cannot turn into a failure (`ignore_late_stops`)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

# The status of a command whose reader went away (`htmllm extract --output - | head -1`): 141, the
# shell's for a process that SIGPIPE ended, as `cat`, `grep` or `yes` end in that pipeline, and not 0: the
# output was not all delivered, and a script under `set -o pipefail` must not take the cut-short run for a
# whole one (one without pipefail ignores it, as it ignores `yes | head`'s). Returned as a status, without
# a message, as Ctrl-C's 130 is; Python ignores SIGPIPE, so a write raises EPIPE instead, which had ended
# runs with "Broken pipe", status 1.
PIPE_CLOSED = 128 + signal.SIGPIPE

# What a Ctrl-C or a closed terminal does to a process whose command has returned: nothing.
LATE_STOPS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGHUP)
_late_stops_ignored = False


def discard_stdout() -> None:
    """Point standard output's file descriptor at devnull: what Python still buffers for a closed pipe
    is dropped at exit, not reported as an "Exception ignored" traceback and status 120 (the Python
    docs' note on SIGPIPE). Where there is no descriptor to replace, there is nothing to flush."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


def ignore_late_stops() -> None:
    """Have the interpreter's exit ignore Ctrl-C and SIGHUP (`LATE_STOPS`): once the command has
    returned, its outputs final, they cannot turn its status into 130 or 129.

    Python gives the signals their default disposition again once the Python part of its exit is over,
    and then tears its modules down (a tenth of a second and more with torch loaded): a Ctrl-C there
    killed the process, status 130 for a report written whole. Ignored from `atexit`, not when the command
    returns: a command run within a longer-lived process (the test suite calling `main`) leaves that
    process its Ctrl-C. Registered after the command ran, so it runs before the exit callbacks registered
    earlier (multiprocessing's, torch's), which then finish rather than stop half-way with a traceback.
    SIGTERM keeps its default, to end an exit that hangs. Once per process."""
    global _late_stops_ignored
    if _late_stops_ignored:
        return
    atexit.register(_ignore, LATE_STOPS)
    _late_stops_ignored = True


def _ignore(signals: tuple[signal.Signals, ...]) -> None:
    for number in signals:
        with contextlib.suppress(ValueError, OSError):  # off the main thread no handler can be set
            signal.signal(number, signal.SIG_IGN)
