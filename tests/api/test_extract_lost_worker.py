"""`POST /v1/extract` when the extractor process holding a page is killed from outside (the kernel's OOM
killer): retried in a fresh process, then a retryable 503 `not_ready`, never a 200 whose entry says the
extractor failed on the page (or whose union took another extractor's text). The kills are real."""

from __future__ import annotations

import pytest

from service.core.extract.pool import LOST_WORKER_RETRIES
from tests.api.conftest import SettingsFactory, app_client
from tests.factories.worker_kills import kill_workers_holding

MARKER = "the kernel picks the process extracting this page"
PAGE = (
    "<html><body><article>"
    + "".join(f"<p>Sentence {i} says that {MARKER}, though nothing in it is wrong.</p>" for i in range(12))
    + "</article></body></html>"
)
OTHER = "<html><body><article>" + "<p>Another page, whose words nobody kills the process for.</p>" * 12


async def test_a_page_whose_extractor_process_is_killed_is_retried_then_a_retryable_503(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"documents": [{"id": "killed", "html": PAGE}, {"id": "other", "html": OTHER}]}
    async with app_client(settings_for(retry_after_s=3)) as client:
        clean = await client.post("/v1/extract", json=body)
        assert clean.status_code == 200, clean.text
        with monkeypatch.context() as patch:
            killed = kill_workers_holding(patch, MARKER.encode(), kills=LOST_WORKER_RETRIES)
            retried = await client.post("/v1/extract", json=body)
        assert len(set(killed)) == LOST_WORKER_RETRIES
        assert retried.status_code == 200 and retried.json() == clean.json()
        assert {e["chosen"] for d in clean.json()["data"] for e in d["extractions"]} == {"resiliparse"}

        with monkeypatch.context() as patch:
            killed = kill_workers_holding(patch, MARKER.encode(), kills=LOST_WORKER_RETRIES + 1)
            lost = await client.post("/v1/extract", json=body)
        assert len(set(killed)) == LOST_WORKER_RETRIES + 1
        assert lost.status_code == 503 and lost.headers["retry-after"] == "3", lost.text
        error = lost.json()["error"]
        assert error["code"] == "not_ready" and "killed from outside" in error["message"], error
        assert (await client.post("/v1/extract", json=body)).json() == clean.json()  # served on
