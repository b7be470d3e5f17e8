"""The content-hash cache: entries survive a reload, namespaces are separate, writes leave no debris."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from model_training.evaluation.cache import ArrayCache, TextCache, content_key, namespace_key


def test_arrays_round_trip_by_content_key(tmp_path: Path) -> None:
    a, b = content_key(b"<p>a</p>"), content_key(b"<p>b</p>")
    cache = ArrayCache(tmp_path, namespace_key("ckpt", "weights-1"))
    assert cache.missing([a, b, a]) == [a, b]
    cache.put(a, np.arange(4, dtype=np.float64))
    cache.put(b, np.ones(4))
    cache.save()
    again = ArrayCache(tmp_path, namespace_key("ckpt", "weights-1"))
    assert again.missing([a, b]) == []
    matrix = again.get_matrix([b, a])
    assert matrix.dtype == np.float32 and matrix.tolist() == [[1, 1, 1, 1], [0, 1, 2, 3]]
    assert len(ArrayCache(tmp_path, namespace_key("ckpt", "weights-2"))) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{namespace_key('ckpt', 'weights-1')}.npz"]


def test_texts_round_trip_and_memory_only_mode(tmp_path: Path) -> None:
    cache = TextCache(tmp_path, "pruned-v1")
    cache.put("k", "<p>é</p>")
    cache.save()
    assert TextCache(tmp_path, "pruned-v1").get("k") == "<p>é</p>"
    memory = TextCache(None, "pruned-v1")
    memory.put("k", "x")
    memory.save()
    assert "k" not in TextCache(None, "pruned-v1")


def test_namespaces_differ_by_every_part() -> None:
    assert namespace_key("ckpt", 1, "html") != namespace_key("ckpt", 1, "text")
    assert namespace_key("a b/c", 1).startswith("a-b-c-")
