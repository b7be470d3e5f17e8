"""docs/deployment.md, "CPU threads and CPU limits": what it says of the server's worker pools is what
Settings does. It said the /v1/extract pool was not sized from the CPU budget (2 processes by default),
while Settings.extract_workers defaults to the forward pass's threads, at most 2: 1 under a 1-CPU quota.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest import mock

from service.api.settings import DEFAULT_POOL_WORKERS, Settings

ROOT = Path(__file__).resolve().parents[2]


def cpu_section() -> str:
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    return text[text.index("## CPU threads and CPU limits") :].split("\n## ", 1)[0]


def test_the_extract_pool_is_documented_as_sized_from_the_cpu_budget() -> None:
    (paragraph,) = [p for p in cpu_section().split("\n\n") if "HTMLLM_EXTRACT_WORKERS" in p]
    assert "`/v1/extract`" in paragraph
    assert f"at most {DEFAULT_POOL_WORKERS} and at least 1" in paragraph
    assert "1-CPU quota" in paragraph
    with mock.patch.dict(os.environ, {}, clear=True):
        for threads, workers in ((1, 1), (16, DEFAULT_POOL_WORKERS)):
            given: dict[str, Any] = {"intra_op_threads": threads}
            assert Settings(**given).extract_workers == workers
