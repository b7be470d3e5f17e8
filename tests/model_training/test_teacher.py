"""Teacher embeddings with the bundled all-MiniLM-L6-v2 (an installed package, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model_training.data import (
    NO_EXTRACTION,
    DataError,
    SamplingConfig,
    prepare_shards,
    read_manifest,
    read_shard,
)
from model_training.teacher import (
    DEFAULT_TEACHER,
    TEACHER_META_FILE,
    embed_shards,
    load_teacher,
    load_teacher_embeddings,
    resolve_teacher,
)
from tests.factories.tokenizer import build_tiny_tokenizer

PAGES = (
    "<html><body><h1>Weather in Prague</h1><p>Rain today, sun tomorrow in the city.</p></body></html>",
    "<html><body><h1>Prague weather</h1><p>Sunny tomorrow, rain today over the city.</p></body></html>",
    "<html><body><h1>Cheap laptops</h1><p>Buy a computer with a discount in our shop.</p></body></html>",
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("teacher")
    corpus = root / "pages.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "url": f"https://s{i}.example/", "html": h}) + "\n"
            for i, h in enumerate(PAGES)
        ),
        encoding="utf-8",
    )
    tok = root / "tok.json"
    build_tiny_tokenizer().save(tok)
    out = root / "shards"
    sampling = SamplingConfig(holdout_fraction=0.0)
    prepare_shards(
        corpus, out, tok, max_length=64, sampling=sampling, extractor=NO_EXTRACTION, workers=1, shard_size=2,
        progress=False,
    )  # fmt: skip
    return out


def test_default_teacher_resolves_to_the_bundled_model() -> None:
    path = Path(resolve_teacher(DEFAULT_TEACHER))
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert resolve_teacher(None) == str(path)
    assert resolve_teacher("/some/other/model") == "/some/other/model"


@pytest.mark.slow
def test_embed_shards_aligns_rows_and_matches_the_teacher(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "teacher"
    meta = embed_shards(shards, out, view="text", progress=False)
    # No extraction was made, so every row fell back to its pruned HTML.
    assert meta.rows == 3 and meta.fallbacks == 3 and meta.dim == 384 and meta.max_seq_length == 256
    loaded_meta, arrays = load_teacher_embeddings(out, shards)
    assert [a.shape for a in arrays] == [(2, 384), (1, 384)]
    vectors = np.concatenate(arrays)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert loaded_meta.model == DEFAULT_TEACHER

    # Row i is the teacher's own embedding of row i's pruned HTML, and similar pages are closer.
    manifest = read_manifest(shards)
    pruned = [
        r for e in manifest["shards"] for r in read_shard(shards, e, columns=["pruned"]).column(0).to_pylist()
    ]
    direct = load_teacher(None).encode(pruned, normalize_embeddings=True)
    assert np.allclose(direct, vectors, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[1, 2]


@pytest.mark.slow
def test_stale_teacher_vectors_are_refused(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "teacher"
    embed_shards(shards, out, view="pruned", max_seq_length=32, progress=False)
    meta = json.loads((out / TEACHER_META_FILE).read_text())
    assert meta["max_seq_length"] == 32 and meta["fallbacks"] == 0
    meta["shards"][0]["ids_sha256"] = "0" * 64
    (out / TEACHER_META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DataError, match="not aligned"):
        load_teacher_embeddings(out, shards)


def test_bad_view_and_missing_teacher_are_typed_errors(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="view"):
        embed_shards(shards, tmp_path / "t", view="screenshot")
    with pytest.raises(DataError, match="teacher embed"):
        load_teacher_embeddings(tmp_path / "nothing", shards)
