"""service/api/app.py: once ready, the app runs the periodic full collection (service.engine.collector),
the net for reference cycles nobody broke, and hands the frozen objects back when it stops.

A soak of refused 12 MB pages grew a server by gigabytes that were never returned: each failed request
left its page in a reference cycle, and a serving process collects those all but never. Here the
automatic collections are off altogether, so only the app's own collections can free such a page.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from service.engine.types import Document
from tests.api.conftest import SettingsFactory, app_client


def _documents_alive() -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is Document)


@pytest.mark.usefixtures("no_collector")
async def test_the_page_of_a_failed_request_does_not_outlive_it_for_long(
    settings_for: SettingsFactory,
) -> None:
    async with app_client(settings_for()) as client:
        assert gc.get_freeze_count() > 0, "the ready app froze its start-up objects"
        before = _documents_alive()
        response = await client.post(
            "/v1/embed", content=b"<div>" * 9000, headers={"content-type": "text/html"}
        )
        assert response.status_code == 422 and response.json()["error"]["code"] == "preprocess_failed"
        del response
        for _ in range(600):  # a collection comes every second; this waits up to a minute for one
            if _documents_alive() <= before:
                break
            await asyncio.sleep(0.1)
        assert _documents_alive() <= before, "the failed request's page is still held"
    assert gc.get_freeze_count() == 0, "a stopped app hands the frozen objects back to the collector"
