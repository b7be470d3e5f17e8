"""SIGTERM during load: the server stops accepting, and every request it accepted is answered."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from service.core.errors import ErrorCode
from tests.api.live import server_process
from tests.api.pages import page
from tests.api.test_server import metric

pytestmark = pytest.mark.slow

REQUESTS = 24


async def test_sigterm_drains_accepted_requests(tiny_checkpoint: Path) -> None:
    env = {
        "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
        # The in-flight documents (48) never fill a batch (64), so the batcher holds them for max_wait_ms:
        # SIGTERM lands while every request is certainly still waiting for its answer.
        "HTMLLM_MAX_WAIT_MS": "2000",
        "HTMLLM_DRAIN_TIMEOUT_S": "30",
        "HTMLLM_PREPROCESS_WORKERS": "1",
        "HTMLLM_EXTRACT_WORKERS": "1",
    }
    with server_process(env) as server:
        # One connection per request (no keep-alive), so "accepted" is unambiguous.
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            bodies = [
                {"documents": [{"id": f"{i}-{j}", "html": page(i * 2 + j)} for j in range(2)]}
                for i in range(REQUESTS)
            ]
            in_flight = [asyncio.ensure_future(client.post("/v1/embed", json=body)) for body in bodies]
            deadline = time.monotonic() + 30
            while True:
                text = (await client.get("/metrics")).text
                if metric(text, "htmllm_requests_in_progress", route="/v1/embed") == REQUESTS:
                    break
                assert time.monotonic() < deadline, "the requests never reached the server"
                assert not any(t.done() for t in in_flight), "a request finished before SIGTERM was sent"
                await asyncio.sleep(0.02)

            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            with pytest.raises(httpx.ConnectError):
                await client.get("/health")  # no longer accepting
            responses = await asyncio.gather(*in_flight, return_exceptions=True)

        exit_code = server.proc.wait(timeout=60)
        lost = [r for r in responses if isinstance(r, BaseException)]
        assert not lost, f"accepted requests without an answer: {lost}\n{server.output()}"
        codes = {c.value for c in ErrorCode}
        for body, response in zip(bodies, responses, strict=True):
            assert isinstance(response, httpx.Response)
            if response.status_code == 200:
                assert [d["id"] for d in response.json()["data"]] == [d["id"] for d in body["documents"]]
            else:
                assert response.json()["error"]["code"] in codes, response.text
        assert sum(r.status_code == 200 for r in responses if isinstance(r, httpx.Response)) == REQUESTS
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown.
        assert exit_code in (0, -signal.SIGTERM), server.output()
