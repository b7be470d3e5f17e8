"""The server's log lines: plain text for a terminal, or one JSON object per line for a log pipeline.

Kubernetes log collectors (Fluent Bit, Vector, Promtail, Cloud Logging) read a container's output line
by line: a Python traceback in text becomes a dozen unrelated entries, and fields must be parsed back
out of prose. With `HTMLLM_LOG_FORMAT=json` every record, uvicorn's included, is one line:
`{"time", "level", "logger", "message"}` plus `exception` (the whole traceback) when there is one.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages and tracebacks are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.gmtime(record.created)
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: LogFormat) -> None:
    """The root logger's handler, in `log_format` (uvicorn's own loggers: see main.uvicorn_config)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
