"""A failing disk, for the tests of pages the file system would not give (root reads a chmod 000 file)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from service.core import pages


def eio_for(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Reading a page file of one of these names fails as a failing disk does (EIO); the rest read."""
    read = pages.read_page_bytes

    def failing(path: Path) -> bytes:
        if path.name in names:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return read(path)

    monkeypatch.setattr(pages, "read_page_bytes", failing)
