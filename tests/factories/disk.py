"""A failing disk, for the tests of pages the file system would not give (root reads a chmod 000 file)."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from typing import Any

import pytest

from service.core import page_files


def eio_for(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Reading a page file of one of these names fails as a failing disk does (EIO); the rest read."""
    read = page_files.read_page_bytes

    def failing(path: Path) -> bytes:
        if path.name in names:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return read(path)

    monkeypatch.setattr(page_files, "read_page_bytes", failing)


def closed_directory(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Everything under `directory` is refused with EACCES, as under a directory of mode 000 for a user
    who is not root (root searches any directory, so chmod cannot make this case in a root container):
    `os.stat`, `os.lstat`, `os.scandir`, `os.listdir` and `io.open` (what `pathlib` and `os.path` call)
    raise `PermissionError` for its descendants. `directory` itself can still be looked at."""
    top = os.path.abspath(directory)

    def refuse(real: Any) -> Any:
        def patched(path: Any, *args: Any, **kwargs: Any) -> Any:
            name = os.fspath(path) if isinstance(path, str | os.PathLike) else None
            if isinstance(name, str) and os.path.abspath(name).startswith(top + os.sep):
                raise PermissionError(errno.EACCES, "Permission denied", name)
            return real(path, *args, **kwargs)

        return patched

    for module, name in ((os, "stat"), (os, "lstat"), (os, "scandir"), (os, "listdir"), (io, "open")):
        monkeypatch.setattr(module, name, refuse(getattr(module, name)))


def unlistable_directory(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """`directory` cannot be listed (`os.scandir` refuses it with EACCES, as a directory of mode 000 does
    for a user who is not root); everything else, the directory's own stat included, works."""
    scandir = os.scandir

    def closed(path: Any) -> Any:
        if path == directory:  # a Path, as the walk passes it (rmtree passes file descriptors)
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", closed)
