"""A disk cache of per-page results (embeddings, extracted or pruned text) keyed by content hash.

Embedding a corpus is the expensive part of an evaluation; heads, baselines and report layouts change
far more often. Each namespace names everything that determines the result besides the page (model
weights' hash, truncation length, input mode, ...) and is one file: `<root>/<namespace>.npz` for arrays,
`<root>/<namespace>.json` for texts. A page's key is the sha256 of its raw bytes, so renamed or
duplicated pages are embedded once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np


def content_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def namespace_key(*parts: object) -> str:
    """A file-name-safe namespace: a readable prefix plus a hash of every part."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(str(p) for p in parts[:1]))[:40]
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]
    return f"{readable}-{digest}"


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class ArrayCache:
    """Content key -> float32 vector, for one namespace; `root=None` keeps it in memory only."""

    def __init__(self, root: Path | None, namespace: str) -> None:
        self.path = root / f"{namespace}.npz" if root is not None else None
        self._data: dict[str, np.ndarray] = {}
        self._dirty = False
        if self.path is not None and self.path.is_file():
            with np.load(self.path, allow_pickle=False) as stored:
                keys, vectors = stored["keys"], stored["vectors"]
                self._data = {str(k): v for k, v in zip(keys, vectors, strict=True)}

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys not cached yet, once each, in first-seen order."""
        return [k for k in dict.fromkeys(keys) if k not in self._data]

    def put(self, key: str, vector: np.ndarray) -> None:
        self._data[key] = np.asarray(vector, dtype=np.float32)
        self._dirty = True

    def get_matrix(self, keys: Sequence[str]) -> np.ndarray:
        """(N, D) float32 rows for `keys`, all of which must be cached."""
        return np.stack([self._data[k] for k in keys]).astype(np.float32, copy=False)

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        keys = np.asarray(list(self._data), dtype=np.str_)
        vectors = np.stack(list(self._data.values()))

        def write(tmp: Path) -> None:
            with tmp.open("wb") as handle:
                np.savez(handle, keys=keys, vectors=vectors)

        _atomic_write(self.path, write)
        self._dirty = False


class TextCache:
    """Content key -> text (pruned HTML, extracted text), for one namespace."""

    def __init__(self, root: Path | None, namespace: str) -> None:
        self.path = root / f"{namespace}.json" if root is not None else None
        self._data: dict[str, str] = {}
        self._dirty = False
        if self.path is not None and self.path.is_file():
            self._data = dict(json.loads(self.path.read_text(encoding="utf-8")))

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def missing(self, keys: Iterable[str]) -> list[str]:
        return [k for k in dict.fromkeys(keys) if k not in self._data]

    def put(self, key: str, text: str) -> None:
        self._data[key] = text
        self._dirty = True

    def get(self, key: str) -> str:
        return self._data[key]

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        text = json.dumps(self._data, ensure_ascii=False)

        def write(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8")

        _atomic_write(self.path, write)
        self._dirty = False
