"""`htmllm_tokens_processed_total` counts the tokens the model ran, not those answered from the result
cache: a hit runs no forward pass, and counted there it had made throughput dashboards read more work
than the model did. Hits are `htmllm_result_cache_hits_total`; they stay answered documents.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import page


async def _values(client: httpx.AsyncClient) -> dict[str, float]:
    """The app's unlabelled samples (and histogram sums) by name."""
    text = (await client.get("/metrics")).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def test_a_cache_hit_counts_as_a_document_answered_but_not_as_tokens_processed(
    settings_for: SettingsFactory,
) -> None:
    body = {"documents": [{"html": page(3)}]}
    async with app_client(settings_for(result_cache_documents=8)) as client:
        before = await _values(client)
        first = await client.post("/v1/embed", json=body)
        assert first.status_code == 200
        tokens = first.json()["usage"]["tokens"]
        assert tokens > 0
        missed = await _values(client)
        again = await client.post("/v1/embed", json=body)
        assert again.status_code == 200 and again.json()["usage"]["tokens"] == tokens
        hit = await _values(client)

    def moved(after: dict[str, float], since: dict[str, float], name: str) -> float:
        return after[name] - since[name]

    assert moved(missed, before, "htmllm_tokens_processed_total") == tokens  # the model ran the page
    assert moved(missed, before, "htmllm_result_cache_hits_total") == 0
    assert moved(hit, missed, "htmllm_result_cache_hits_total") == 1
    assert moved(hit, missed, "htmllm_documents_processed_total") == 1  # answered all the same
    assert moved(hit, missed, "htmllm_batch_tokens_sum") == 0  # no forward pass ran
    assert moved(hit, missed, "htmllm_tokens_processed_total") == 0  # so no tokens were processed
