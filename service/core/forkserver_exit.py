"""The forkserver's own end, said in one line: the one module whose import does something.

CPython's forkserver imports its `preload` modules and nothing else of ours, so the hook that words its
end can only be installed by an import. `service.core.processes.worker_context` names this module first
in every worker context's preload, and nothing else imports it: the server's own process keeps its
`sys.excepthook`. Forked workers inherit the hook, which leaves any process but the forkserver to the
previous one.

The line is in the format of the server's log lines: one JSON object (`log_lines.json_line`) where they
are JSON, as its launch environment says (`service.core.processes.start_forkserver`); it had been plain
text in a stream of JSON objects, which a log collector reading one object a line cannot parse.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any

from service.core.log_lines import FORMAT_VARIABLE, json_line
from service.core.processes import descriptor_limit, out_of_descriptors


class ForkserverExit:
    """`sys.excepthook` in the forkserver, which CPython ends with a traceback whenever a start fails under
    it: one line instead, for the failures a server out of file descriptors causes, with the limit and how
    to raise it. A client that could not make its second pipe (EMFILE) hangs up unsent, and the
    forkserver's read of the start dies of it (EOFError); a forkserver out of descriptors itself fails its
    accept (EMFILE). Either way it exits, and the server's next start launches a new one. Any other
    error, and any error in a process it forked (whose failed start CPython reports through this hook
    too: an import that fails), keeps its traceback."""

    def __init__(self, previous: Any) -> None:
        self._previous = previous
        self._pid = os.getpid()

    def __call__(
        self, kind: type[BaseException], error: BaseException, traceback: TracebackType | None
    ) -> None:
        said = os.getpid() == self._pid and (issubclass(kind, EOFError) or out_of_descriptors(error))
        if not said:
            self._previous(kind, error, traceback)
            return
        if isinstance(error, EOFError):
            cause = "a worker start was abandoned unsent, as one out of file descriptors is"
        else:
            cause = "too many open files"
        message = (
            f"the workers' forkserver {self._pid} exits: {cause} ({descriptor_limit()}); the next start "
            "launches another"
        )
        if os.environ.get(FORMAT_VARIABLE) == "json":
            line = json_line(time.time(), "warning", __name__, message)
        else:
            line = f"htmllm: {message}"
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


sys.excepthook = ForkserverExit(sys.excepthook)
