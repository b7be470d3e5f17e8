"""Fixtures shared by the tests of `service.core`."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core import pages, warc_pages, warc_record_page  # loaded here, before any test lowers the cap
from tests.factories.checkpoint import build_tiny_checkpoint


@pytest.fixture
def cap_1_kib(monkeypatch: pytest.MonkeyPatch) -> int:
    """A page cap of 1 KiB (rows and WARC records up to 4 KiB read), so the tests need no 16 MiB pages.

    Patched in `pages`, where both readers look it up at call time; `warc_pages` and `warc_record_page`
    must not hold a copy imported by value, which the patch would miss.
    """
    assert not hasattr(warc_pages, "MAX_PAGE_BYTES")
    assert not hasattr(warc_record_page, "MAX_PAGE_BYTES")
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 1024)
    return 1024


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A tiny checkpoint of the test's own, which it may change (save_heads, stages, file modes)."""
    return build_tiny_checkpoint(tmp_path / "ckpt")
