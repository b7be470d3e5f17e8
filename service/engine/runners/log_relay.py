"""A child process's log records, relayed to this process's logging (the inference process's).

The child's log records travel over a pipe of their own to the parent's logging, so they come out once,
in the server's format and at its level: the child's root logger had no handler, so its warnings came
through Python's bare fallback (no time, no level, never JSON) and its info lines (the ONNX export's)
were lost. In the child, `send_logs` makes a `_LogSender` its one handler; in the parent, `relay_logs`
runs on a thread of its own and hands each record to the logger of the same name.
"""

from __future__ import annotations

import copy
import logging
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)


class _LogSender(logging.Handler):
    """The child's one log handler: each record, formatted as `logging.handlers.QueueHandler` prepares
    one (arguments merged into the message, a traceback appended to it, so that it pickles), sent to the
    parent's `relay_logs`. Sends are serialised by the handler's own lock."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self._conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            sent = copy.copy(record)
            sent.message = sent.msg = message
            sent.args, sent.exc_info, sent.exc_text, sent.stack_info = None, None, None, None
            self._conn.send(sent)
        except Exception:
            self.handleError(record)


def send_logs(conn: Connection, level: int) -> None:
    """The child's logging: every record at `level` (the parent's root level when it was started) or
    above goes to the parent, and nothing is written here."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(_LogSender(conn))
    root.setLevel(level)


def relay_logs(conn: Connection) -> None:
    """The parent's end of a child's log pipe, on a thread of its own until the child exits (its end of
    the pipe closes then): each record to this process's logger of the same name, whose level decides
    and whose handlers (the server's, in its format) write it."""
    with conn:
        while True:
            try:
                record = conn.recv()
            except (EOFError, OSError):  # the child exited
                return
            except Exception:  # one record that does not unpickle: the next may
                logger.exception("a log record of the inference process could not be read")
                continue
            target = logging.getLogger(record.name)
            if target.isEnabledFor(record.levelno):
                target.handle(record)
