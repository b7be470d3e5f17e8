"""`/v1/extract` names a page's encoding as browsers and HTTP clients do (`windows-1250`, `shift_jis`),
not by Python's codec (`cp1250`, `cp932`), and reports no language for a page without text."""

from __future__ import annotations

import pytest

from service.core.encoding_labels import whatwg_codec
from tests.api.conftest import SettingsFactory, app_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

CZECH = "Příliš žluťoučký kůň úpěl ďábelské ódy. " * 20
JAPANESE = "東京は日本の首都であり、多くの人々が暮らしています。" * 10


async def test_extract_names_the_encoding_as_browsers_do(settings_for: SettingsFactory) -> None:
    czech = f"<html><body><p>{CZECH}</p></body></html>".encode("cp1250")
    japanese = f'<html><head><meta charset="shift_jis"></head><body><p>{JAPANESE}</p></body></html>'
    async with app_client(settings_for()) as client:

        async def encoding(data: bytes, content_type: str) -> object:
            response = await client.post("/v1/extract", content=data, headers={"content-type": content_type})
            assert response.status_code == 200, response.text
            (entry,) = response.json()["data"][0]["extractions"]
            assert entry["error"] is None and entry["passed"], entry
            return entry["encoding"]

        assert await encoding(czech, "text/html; charset=windows-1250") == "windows-1250"  # was cp1250
        assert await encoding(japanese.encode("cp932"), "text/html") == "shift_jis"  # was cp932
        as_json = await client.post("/v1/extract", json={"documents": [{"html": "<p>café</p>"}]})
        assert as_json.json()["data"][0]["extractions"][0]["encoding"] == "utf-8"
    assert whatwg_codec("shift_jis") == "cp932"  # a label that reads the page back as it was read


async def test_extract_reports_no_language_for_a_page_without_text(settings_for: SettingsFactory) -> None:
    """docs/extraction.md says null; it was "en", the English stoplist's that stood in for none."""
    body = {"documents": [{"html": "<html><body><div></div></body></html>"}], "extractors": ["justext"]}
    async with app_client(settings_for()) as client:
        response = await client.post("/v1/extract", json=body)
    assert response.status_code == 200, response.text
    (entry,) = response.json()["data"][0]["extractions"]
    assert entry["words"] == 0 and entry["language"] is None
