"""Log lines: `HTMLLM_LOG_FORMAT=json` gives one JSON object per line, uvicorn's lines included."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.api.logs import ACCESS_LOGGER, JsonFormatter
from service.api.main import uvicorn_config
from tests.api.conftest import SettingsFactory, app_client
from tests.api.live import server_process
from tests.api.pages import page


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


def _access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == ACCESS_LOGGER]


async def test_the_access_log_names_each_request(
    settings_for: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """One line per request with its id, method, path, status, milliseconds and client; never the query
    string (a client may put a key there, as uvicorn's access log wrote it), and a client's path escaped
    (a newline in it forged a line of its own in text logs)."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with app_client(settings_for(access_log=True)) as client:
        caplog.clear()
        answer = await client.post(
            "/v1/embed?id=sekrit",
            content=page(0),
            headers={"content-type": "text/html", "x-request-id": "crawler-9"},
        )
        assert answer.status_code == 200
        assert (await client.get("/nowhere%0Aforged line")).status_code == 404
    embed, missing = _access_records(caplog)
    assert "sekrit" not in caplog.text
    assert embed.levelno == logging.INFO
    assert embed.getMessage().startswith("POST /v1/embed 200 ") and "request crawler-9" in embed.getMessage()
    entry = json.loads(JsonFormatter().format(embed))  # under JSON logs the fields stand apart
    assert {k: entry[k] for k in ("request_id", "method", "path", "status", "client")} == {
        "request_id": "crawler-9",
        "method": "POST",
        "path": "/v1/embed",
        "status": 200,
        "client": "127.0.0.1:123",  # httpx's in-process transport
    }
    assert entry["duration_ms"] > 0
    assert "\n" not in missing.getMessage() and "GET /nowhere%0Aforged%20line 404 " in missing.getMessage()


async def test_no_access_log_unless_asked(
    settings_for: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with app_client(settings_for()) as client:
        assert (await client.get("/health")).status_code == 200
    assert not _access_records(caplog)


def test_uvicorn_writes_no_access_log_of_its_own(settings_for: SettingsFactory) -> None:
    """uvicorn's came with HTMLLM_LOG_LEVEL=debug, with each query string and no request id."""
    settings = settings_for(log_level="debug")
    assert uvicorn_config(object(), settings).access_log is False


@pytest.mark.slow
def test_a_json_server_writes_the_access_log_at_any_level(tiny_checkpoint: Path) -> None:
    env = {
        "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
        "HTMLLM_LOG_FORMAT": "json",
        "HTMLLM_LOG_LEVEL": "warning",
    }
    env |= {"HTMLLM_PREPROCESS_WORKERS": "1", "HTMLLM_EXTRACT_WORKERS": "1", "HTMLLM_ACCESS_LOG": "true"}
    with server_process(env) as server:
        headers = {"x-request-id": "probe-1"}
        assert httpx.get(server.url + "/health?key=sekrit", headers=headers).status_code == 200
        # The line is written once the response's last byte is sent, which the client may see first:
        # read until it is there (a bound for a lost line, not a timing).
        deadline = time.monotonic() + 60
        while '"probe-1"' not in server.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        output = server.output()
    entries = [json.loads(line) for line in output.splitlines() if line.strip()]
    access = [entry for entry in entries if entry["logger"] == ACCESS_LOGGER]
    assert [
        (e["request_id"], e["method"], e["path"], e["status"]) for e in access if e["request_id"] == "probe-1"
    ] == [("probe-1", "GET", "/health", 200)]
    assert "sekrit" not in output


def test_the_access_log_client_is_the_peer_whatever_x_forwarded_for_says(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn's proxy headers (on by default, trusting 127.0.0.1: a sidecar's address, and any client's
    on the same host) had written a client's own `X-Forwarded-For` as the `client` of the line, which the
    docs say is the peer; `server: uvicorn` named the stack to whoever asked."""
    from tests.api.conftest import tiny_settings
    from tests.api.live import live_server

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with live_server(tiny_settings(tiny_checkpoint, access_log=True)) as live:
        caplog.clear()
        forged = {"x-forwarded-for": "evil host", "x-forwarded-proto": "https", "x-request-id": "xff-1"}
        answer = httpx.get(live.url + "/health", headers=forged)
        assert answer.status_code == 200 and "server" not in answer.headers
    (record,) = [r for r in _access_records(caplog) if "request xff-1" in r.getMessage()]
    entry = json.loads(JsonFormatter().format(record))
    assert entry["client"].startswith("127.0.0.1:"), entry
