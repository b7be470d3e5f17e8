"""Log lines: `HTMLLM_LOG_FORMAT=json` gives one JSON object per line, uvicorn's lines included."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import httpx
import pytest

from service.api.logs import JsonFormatter
from tests.api.live import server_process


def test_a_record_with_a_traceback_is_one_json_line() -> None:
    try:
        raise ValueError("bad page\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "service.engine", logging.ERROR, __file__, 1, "batch %d failed", (7,), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["logger"] == "service.engine"
    assert entry["message"] == "batch 7 failed"
    assert (
        entry["exception"].startswith("Traceback")
        and "ValueError: bad page\nsecond line" in entry["exception"]
    )
    assert entry["time"].endswith("Z") and entry["time"][10] == "T"


@pytest.mark.slow
def test_the_server_logs_json_lines_when_asked(tiny_checkpoint: Path) -> None:
    env = {"HTMLLM_MODEL_PATH": str(tiny_checkpoint), "HTMLLM_LOG_FORMAT": "json", "HTMLLM_LOG_LEVEL": "info"}
    env |= {"HTMLLM_PREPROCESS_WORKERS": "1", "HTMLLM_EXTRACT_WORKERS": "1"}
    with server_process(env) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        output = server.output()
    lines = [line for line in output.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line, or this raises
    loggers = {entry["logger"] for entry in entries}
    assert "uvicorn.error" in loggers  # uvicorn's start-up lines, through the same handler
    assert any("ready" in entry["message"] for entry in entries if entry["logger"].startswith("service"))
