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


async def test_a_language_no_extractor_asked_for_reads_is_a_422(settings_for: SettingsFactory) -> None:
    """`language` is jusText's: with extractors that never run it (resiliparse, trafilatura) it was
    dropped in silence, a 200, where `htmllm extract --extractor resiliparse --language de` is a usage
    error. The union runs jusText (last in its order), so it takes a language, as jusText does."""
    html = "<p>x</p>"
    async with app_client(settings_for()) as client:
        for request in (
            client.post(
                "/v1/extract",
                json={"documents": [{"html": html}], "extractors": ["resiliparse"], "language": "de"},
            ),
            client.post(
                "/v1/extract",
                json={
                    "documents": [{"html": html}],
                    "extractors": ["resiliparse", "trafilatura"],
                    "language": "de",
                },
            ),
            client.post("/v1/extract?extractors=trafilatura&language=de", content=html, headers=RAW),
        ):
            response = await request
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["code"] == "validation_error", error
            assert error["message"].startswith("language is jusText's, which none of extractors"), error
        for extractors in (["union"], ["resiliparse", "justext"]):
            body = {"documents": [{"html": html}], "extractors": extractors, "language": "de"}
            response = await client.post("/v1/extract", json=body)
            assert response.status_code == 200, (extractors, response.text)
        default = await client.post("/v1/extract", json={"documents": [{"html": html}], "language": "de"})
        assert default.status_code == 200, default.text  # the default is the union
