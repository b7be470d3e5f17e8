"""The service's log lines as JSON (`HTMLLM_LOG_FORMAT=json`, or `--log-format json`): one object per line,
`{"time", "level", "logger", "message"}` and the fields a record names, for log collectors that read a
container's output line by line.

The server's root handler writes them (`JsonFormatter`, installed by `service.api.logs`), and so does a
process that writes a line of its own outside that handler: the workers' forkserver, whose end is one line
(`service.core.forkserver_exit`). It is a fresh interpreter (`python -c`, launched by multiprocessing) that
runs none of the server's logging set-up, so it is told the format in its environment at its launch
(`FORMAT_VARIABLE`, `service.core.processes.start_forkserver`): the format of the server's own lines
(`json_in_use`), whether it came from the environment, the flag or `serve(settings)`. Its line had been
plain text in a stream of JSON objects.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

# The record attribute (`extra={FIELDS: {...}}`) whose fields a JSON line carries beside the message.
FIELDS: Final = "htmllm_fields"
# The variable the forkserver is launched with, saying the format of the server's lines: "json" or "text".
FORMAT_VARIABLE: Final = "HTMLLM_LOG_FORMAT"


def json_line(
    created: float, level: str, logger: str, message: str, fields: Mapping[str, Any] | None = None
) -> str:
    """One log line as a JSON object: the time (UTC, milliseconds) `created` (seconds since the epoch),
    the level's name (lowercase), the logger's name, the message, and `fields` beside them (none of them
    replacing those four)."""
    seconds = time.gmtime(created)
    milliseconds = int((created - int(created)) * 1000)  # (as `logging.LogRecord.msecs`)
    entry: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{milliseconds:03d}Z",
        "level": level.lower(),
        "logger": logger,
        "message": message,
    }
    if fields:
        entry.update({name: value for name, value in fields.items() if name not in entry})
    return json.dumps(entry, ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (`json_line`; newlines in messages and tracebacks are
    escaped): `exception` carries the whole traceback, `stack` the stack where a record asked for it."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, FIELDS, None)
        extra = dict(fields) if isinstance(fields, dict) else {}
        if record.exc_info:
            extra["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            extra["stack"] = self.formatStack(record.stack_info)
        return json_line(record.created, record.levelname, record.name, record.getMessage(), extra)


def json_in_use() -> bool:
    """Whether the server's lines are JSON: a handler of the root logger formats them so."""
    return any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers)
