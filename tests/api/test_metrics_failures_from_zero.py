"""The failure counters are exported at 0 from the start, under every value of their (closed) labels.

A series born at its first failure is invisible to rate() and increase(): a burst of 429s or 504s within
one scrape interval went from no series to 16, the documented alerts on them ("failures by code",
"shedding load": docs/deployment.md) read no increase and never fired. The worker replacements had been
exported from 0 for that reason already; these were not.
"""

from __future__ import annotations

import re
from typing import get_args

from service.api.metrics import (
    DOCUMENT_FAILURE_CODES,
    EXTRACTION_FAILURE_CODES,
    EXTRACTOR_NAMES,
    REQUEST_FAILURE_CODES,
)
from service.api.schemas import ExtractorName
from service.core.errors import ErrorCode
from tests.api.conftest import SettingsFactory, app_client


def _family(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name`, by its labels (sorted pairs)."""
    found = {}
    for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M):
        found[tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return found


async def test_a_fresh_app_exports_every_failure_series_at_0_and_a_failure_moves_only_its_own(
    settings_for: SettingsFactory,
) -> None:
    async with app_client(settings_for(warmup=False), wait_ready=False) as client:
        fresh = (await client.get("/metrics")).text
        assert (await client.get("/v2/nothing")).status_code == 404
        after = (await client.get("/metrics")).text

    requests = _family(fresh, "htmllm_request_failures_total")
    assert requests == {(("code", code.value),): 0.0 for code in REQUEST_FAILURE_CODES}
    # The alerted ones (docs/deployment.md, "Alerts") among them; the parser's answers are never counted.
    for alerted in ("timeout", "backend_failed", "internal_error", "overloaded", "unauthorized"):
        assert (("code", alerted),) in requests
    assert (("code", "headers_too_large"),) not in requests
    documents = _family(fresh, "htmllm_documents_failed_total")
    assert documents == {(("code", code.value),): 0.0 for code in DOCUMENT_FAILURE_CODES}
    assert (("code", "timeout"),) in documents and (("code", "not_found"),) not in documents
    extractions = _family(fresh, "htmllm_extractions_failed_total")
    assert extractions == {
        (("code", code.value), ("extractor", extractor)): 0.0
        for code in EXTRACTION_FAILURE_CODES
        for extractor in EXTRACTOR_NAMES
    }
    assert len(extractions) == 8

    moved = {
        labels: value
        for labels, value in _family(after, "htmllm_request_failures_total").items()
        if value != requests[labels]
    }
    assert moved == {(("code", "not_found"),): 1.0}  # the one 404, counted once


def test_the_labels_exported_from_0_are_those_the_routes_can_count() -> None:
    """The extractor names are the request schema's, and every code an answer of the app carries is
    among the request failures: a value missing here would again have no series until it first counts."""
    assert set(EXTRACTOR_NAMES) == set(get_args(ExtractorName))
    assert {code for code in ErrorCode} - set(REQUEST_FAILURE_CODES) == {
        ErrorCode.INPUT_UNREADABLE,  # the bulk commands' only
        ErrorCode.HEADERS_TOO_LARGE,  # answered by the HTTP parser, below the app: never counted
        ErrorCode.HEAD_TIMEOUT,
        ErrorCode.MALFORMED_REQUEST,  # the parser's too
        ErrorCode.UNSUPPORTED_TRANSFER_CODING,
        ErrorCode.UNHEALTHY,  # the liveness probe's alone, and a probe's 503 is no request failure
    }
    assert set(DOCUMENT_FAILURE_CODES) <= set(REQUEST_FAILURE_CODES)
