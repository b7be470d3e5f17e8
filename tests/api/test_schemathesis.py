"""Property-based requests generated from /openapi.json against a real server: never a 5xx, and every
answer as the document says (its status documented for the operation, its content type, headers and
body conforming, an error's code one of its status').

Every operation gets schema-conforming (positive) and schema-violating (negative) cases; the number of
examples is bounded and the generation derandomized, so the run is fast and reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.api.errors import STATUS
from service.core.errors import ErrorCode
from tests.api.conftest import tiny_settings
from tests.api.live import live_server

pytestmark = pytest.mark.slow

EXAMPLES = 10
# Checks of the answer alone (none sends another request), so they cost next to nothing.
CONFORMANCE = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def no_server_errors(operation: Any, mode: GenerationMode, base_url: str) -> Callable[[], None]:
    """A Hypothesis test of one operation: every generated request is answered below 500."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=60)
        where = f"{case.method} {case.formatted_path} ({mode.value})"
        assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
        content_type = response.headers.get("content-type") or [""]  # schemathesis: name -> [values]
        if response.status_code >= 400 and content_type[0].startswith("application/json"):
            assert set(response.json()) == {"error"}, f"{where}: {response.text[:500]}"
            code = ErrorCode(response.json()["error"]["code"])
            assert STATUS[code] == response.status_code, f"{where}: {response.text[:500]}"
        case.validate_response(response, checks=CONFORMANCE)

    return check


def test_no_server_errors(tiny_checkpoint: Path) -> None:
    with live_server(tiny_settings(tiny_checkpoint, max_documents=8, max_body_bytes=256 * 1024)) as live:
        schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
        checked: list[str] = []
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    no_server_errors(operation, mode, live.url)()
                except Unsatisfiable:
                    # Nothing to violate (no parameters, no body): only positive cases exist.
                    assert mode is GenerationMode.NEGATIVE
            checked.append(f"{operation.method.upper()} {operation.path}")
    assert {"POST /v1/embed", "POST /v1/embeddings", "POST /embed", "POST /v1/extract"} <= set(checked)
