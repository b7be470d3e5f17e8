"""`/v1/extract` takes jusText's language (`language`, in the JSON body or a raw body's query string), as
`htmllm extract --language` and the Python API do; one neither jusText nor the detector knows is a 422."""

from __future__ import annotations

import pytest

from tests.api.conftest import SettingsFactory, app_client
from tests.core.test_extract_language import german_page_behind_a_menu

pytestmark = pytest.mark.asyncio(loop_scope="module")

RAW = {"content-type": "text/html; charset=utf-8"}


async def test_extract_takes_justext_s_language_and_refuses_an_unknown_one(
    settings_for: SettingsFactory,
) -> None:
    html = german_page_behind_a_menu()
    async with app_client(settings_for()) as client:

        async def language(**fields: object) -> object:
            body = {"documents": [{"html": html}], "extractors": ["justext"], **fields}
            response = await client.post("/v1/extract", json=body)
            assert response.status_code == 200, response.text
            return response.json()["data"][0]["extractions"][0]["language"]

        assert await language() == "de"  # detected
        assert await language(language="EN") == "en"  # given, normalised
        raw = await client.post("/v1/extract?extractors=justext&language=en-GB", content=html, headers=RAW)
        assert raw.status_code == 200, raw.text
        assert raw.json()["data"][0]["extractions"][0]["language"] == "en"

        for request in (
            client.post("/v1/extract", json={"documents": [{"html": html}], "language": "xx"}),
            client.post("/v1/extract?language=ger", content=html, headers=RAW),
            client.post("/v1/extract", json={"documents": [{"html": html}], "language": "English!"}),
        ):
            response = await request
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "validation_error" and "language" in error["message"], error
        typed = await client.post("/v1/extract", json={"documents": [{"html": html}], "language": 7})
        assert typed.status_code == 422 and "language" in typed.text
