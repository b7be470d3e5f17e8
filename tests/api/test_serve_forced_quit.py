"""A forced quit (a second Ctrl-C while requests are in flight) of a server started from Python,
`service.api.main.serve(settings)`, as a program that embeds the server calls it: the same one warning
line and status 130 as `htmllm serve`, and no traceback."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.api.live import server_process
from tests.api.test_shutdown import forced_quit, server_env

pytestmark = pytest.mark.slow

# A program that serves through `serve` (not `main`, which ends the process itself) and exits with what
# it returns, after saying it got it: the process ends because `serve` returned.
SERVE = """
import sys
from service.api.main import serve
from service.api.settings import Settings

status = serve(Settings())
print(f"serve returned {status}", flush=True)
sys.exit(status)
"""


async def test_a_forced_quit_of_serve_says_what_it_dropped_and_returns_130(tiny_checkpoint: Path) -> None:
    """uvicorn's force quit returns with the requests running and the lifespan not shut down;
    `asyncio.run` then cancelled their tasks: uvicorn logged each cancellation as an ERROR with a
    `CancelledError` traceback after the warning (the lifespan's too) and answered the requests 500, where
    `htmllm serve` (which ends its process from within the loop) drops them with the warning alone. The
    app is then shut down as a stop does (its engine and extractor pool closed): the caller goes on."""
    env = server_env(tiny_checkpoint, max_wait_ms="20000", drain_timeout_s="30", log_level="info")
    with server_process(env, script=SERVE) as server:
        responses, exit_code, output = await forced_quit(server, 2, signal.SIGINT)
    assert all(isinstance(r, httpx.TransportError) for r in responses), (responses, output)
    assert exit_code == 130, output
    said = (
        "SIGINT (Ctrl-C) again: forced quit before the drain was done: 2 requests in flight are dropped "
        "without an answer (4 documents not yet embedded, 0 extraction jobs not yet done) and the engine is "
        "not drained; exiting with status 130"
    )
    assert said in output, output
    assert "Traceback" not in output and "CancelledError" not in output, output
    assert output.rstrip().endswith("Application shutdown complete.\nserve returned 130"), output
