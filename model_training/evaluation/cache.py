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
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

V = TypeVar("V")


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


class _Cache(ABC, Generic[V]):
    """Content key -> value for one namespace, loaded whole and saved atomically; `root=None`: memory only."""

    suffix = ""

    def __init__(self, root: Path | None, namespace: str) -> None:
        self.path = root / f"{namespace}{self.suffix}" if root is not None else None
        self._data: dict[str, V] = (
            self._load(self.path) if self.path is not None and self.path.is_file() else {}
        )
        self._dirty = False

    @abstractmethod
    def _load(self, path: Path) -> dict[str, V]:
        """Every entry stored at `path`."""

    @abstractmethod
    def _dump(self, tmp: Path) -> None:
        """Write every entry to `tmp` (renamed over the cache file afterwards)."""

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys not cached yet, once each, in first-seen order."""
        return [k for k in dict.fromkeys(keys) if k not in self._data]

    def put(self, key: str, value: V) -> None:
        self._data[key] = value
        self._dirty = True

    def get(self, key: str) -> V:
        return self._data[key]

    def save(self) -> None:
        if self.path is not None and self._dirty:
            _atomic_write(self.path, self._dump)
            self._dirty = False


class ArrayCache(_Cache[np.ndarray]):
    """Content key -> float32 vector, stored as `<namespace>.npz`."""

    suffix = ".npz"

    def _load(self, path: Path) -> dict[str, np.ndarray]:
        with np.load(path, allow_pickle=False) as stored:
            return {str(k): v for k, v in zip(stored["keys"], stored["vectors"], strict=True)}

    def _dump(self, tmp: Path) -> None:
        with tmp.open("wb") as handle:
            keys = np.asarray(list(self._data), dtype=np.str_)
            np.savez(handle, keys=keys, vectors=np.stack(list(self._data.values())))

    def put(self, key: str, value: np.ndarray) -> None:
        super().put(key, np.asarray(value, dtype=np.float32))

    def get_matrix(self, keys: Sequence[str]) -> np.ndarray:
        """(N, D) float32 rows for `keys`, all of which must be cached."""
        return np.stack([self._data[k] for k in keys]).astype(np.float32, copy=False)


class TextCache(_Cache[str]):
    """Content key -> text (pruned HTML, extracted text), stored as `<namespace>.json`."""

    suffix = ".json"

    def _load(self, path: Path) -> dict[str, str]:
        return {str(k): str(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}

    def _dump(self, tmp: Path) -> None:
        tmp.write_text(json.dumps(self._data, ensure_ascii=False), encoding="utf-8")
