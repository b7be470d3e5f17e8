"""Teacher vectors are checked against the texts the shards hold now, not only against their row ids.

Shards prepared again from the same pages keep every row id: `data prepare --extractor none`, `teacher
embed`, then `data prepare --extractor union` into the same directory, and training took the vectors of
the pruned HTML as the teacher's view of the extracted texts, without a word.
"""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from model_training.data import NO_EXTRACTION, DataError, SamplingConfig, prepare_shards, read_manifest
from model_training.teacher import (
    TEACHER_META_FILE,
    TeacherMeta,
    embed_shards,
    load_teacher_embeddings,
    write_teacher,
)
from tests.factories.tokenizer import build_tiny_tokenizer

PAGES = (
    "<html><body><h1>Weather in Prague</h1><p>Rain today, sun tomorrow in the city.</p></body></html>",
    "<html><body><h1>Cheap laptops</h1><p>Buy a computer with a discount in our shop.</p></body></html>",
    "<html><body><h1>Football</h1><p>The home team won the match on Sunday.</p></body></html>",
)


@pytest.fixture
def prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`prepare(extractor, text=..., extraction_version=..., prune_version=...)`: the same three pages
    prepared into the same shards directory; an extractor other than none is a stand-in returning `text`
    (no extractor process), under the versions given."""
    import service.core.extract as extraction
    import service.core.prune as prune

    corpus = tmp_path / "pages.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "url": f"https://s{i}.example/", "html": h}) + "\n"
            for i, h in enumerate(PAGES)
        ),
        encoding="utf-8",
    )
    tok = tmp_path / "tok.json"
    build_tiny_tokenizer().save(tok)
    shards = tmp_path / "shards"

    def run(
        extractor: str,
        *,
        text: str = "",
        extraction_version: str = extraction.EXTRACTION_VERSION,
        prune_version: str = prune.PRUNE_VERSION,
        tokenizer: Path = tok,
    ) -> Path:
        monkeypatch.setattr(extraction, "EXTRACTION_VERSION", extraction_version)
        monkeypatch.setattr(prune, "PRUNE_VERSION", prune_version)
        monkeypatch.setattr(
            extraction,
            "extract",
            lambda html, _name: SimpleNamespace(text=f"{text} {len(html)}", extractor="resiliparse"),
        )
        prepare_shards(
            corpus, shards, tokenizer, max_length=64, sampling=SamplingConfig(holdout_fraction=0.0),
            extractor=extractor, workers=1, shard_size=2, progress=False,
        )  # fmt: skip
        return shards

    return run


def _write_zero_teacher(shards: Path, out: Path, *, view: str = "text") -> None:
    """What `teacher embed` writes, with zero vectors: the checks never look at the vectors' values."""
    manifest = read_manifest(shards)
    meta = TeacherMeta(
        model="m", model_path="", dim=4, view=view, max_seq_length=8, normalized=True,
        shards_tokenizer_sha256=str(manifest["tokenizer_sha256"]),
    )  # fmt: skip
    write_teacher(out, shards, [np.zeros((e["rows"], 4), np.float32) for e in manifest["shards"]], meta)


def test_shards_prepared_again_with_another_extractor_refuse_the_old_teacher(
    prepare: Any, tmp_path: Path
) -> None:
    shards = prepare(NO_EXTRACTION)
    teacher = tmp_path / "teacher"
    _write_zero_teacher(shards, teacher)
    recorded = json.loads((teacher / TEACHER_META_FILE).read_text(encoding="utf-8"))
    assert recorded["shards_extractor"] == NO_EXTRACTION and recorded["shards_extraction_version"] is None
    assert all(len(entry["texts_sha256"]) == 64 for entry in recorded["shards"])
    load_teacher_embeddings(teacher, shards)  # the texts it read: accepted

    prepare("union", text="the extracted words")  # same pages, same ids, other texts
    with pytest.raises(DataError) as refused:
        load_teacher_embeddings(teacher, shards)
    said = str(refused.value)
    assert "embedded other texts than" in said and "re-run `htmllm teacher embed" in said
    assert "extractor 'none' (teacher) vs 'union' (shards)" in said
    assert "extraction_version None (teacher) vs '" in said

    _write_zero_teacher(shards, teacher)  # embedded again: accepted
    load_teacher_embeddings(teacher, shards)


def test_a_new_extraction_version_that_changed_the_texts_is_refused_one_that_did_not_is_not(
    prepare: Any, tmp_path: Path
) -> None:
    shards = prepare("union", text="words", extraction_version="8")
    teacher = tmp_path / "teacher"
    _write_zero_teacher(shards, teacher)
    prepare("union", text="other words", extraction_version="9")
    with pytest.raises(DataError, match=r"extraction_version '8' \(teacher\) vs '9' \(shards\)"):
        load_teacher_embeddings(teacher, shards)
    # Texts changed under the same versions (an extractor library upgraded): the hash still tells.
    prepare("union", text="words again", extraction_version="8")
    with pytest.raises(DataError, match="same extractor 'union', extraction_version '8'"):
        load_teacher_embeddings(teacher, shards)
    # A version bump whose texts came out identical leaves the vectors right: no re-embedding needed.
    prepare("union", text="words", extraction_version="9")
    load_teacher_embeddings(teacher, shards)


def test_a_prune_version_bump_matters_only_where_the_teacher_read_pruned_html(
    prepare: Any, tmp_path: Path
) -> None:
    """The docs reuse text-view teacher vectors across prune versions (extracted text does not depend on
    the pruner); pruned-HTML vectors are refused once the pruned output differs."""
    shards = prepare("union", text="words", prune_version="7")
    _write_zero_teacher(shards, tmp_path / "text", view="text")
    _write_zero_teacher(shards, tmp_path / "pruned", view="pruned")
    prepare("union", text="words", prune_version="8")  # the same pruned output under a new version
    load_teacher_embeddings(tmp_path / "text", shards)
    load_teacher_embeddings(tmp_path / "pruned", shards)

    import service.core.prune as prune

    real = prune.prune_html
    try:  # a pruner whose output changed: forked prepare workers inherit the patch
        prune.prune_html = lambda html, *args, **kwargs: real(html, *args, **kwargs) + "<p>v9</p>"
        prepare("union", text="words", prune_version="9")
    finally:
        prune.prune_html = real
    load_teacher_embeddings(tmp_path / "text", shards)
    with pytest.raises(DataError, match=r"prune_version '7' \(teacher\) vs '9' \(shards\)"):
        load_teacher_embeddings(tmp_path / "pruned", shards)


def test_a_teacher_json_without_text_hashes_warns_once_and_loads(
    prepare: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Older runs stay usable: their teacher.json has no text hashes, as every run before this check."""
    shards = prepare(NO_EXTRACTION)
    teacher = tmp_path / "teacher"
    _write_zero_teacher(shards, teacher)
    file = teacher / TEACHER_META_FILE
    old = json.loads(file.read_text(encoding="utf-8"))
    for key in ("shards_extractor", "shards_extraction_version", "shards_prune_version"):
        del old[key]
    for entry in old["shards"]:
        del entry["texts_sha256"]
    file.write_text(json.dumps(old), encoding="utf-8")
    prepare("union", text="the extracted words")
    with caplog.at_level(logging.WARNING, logger="model_training.teacher"):
        _, arrays = load_teacher_embeddings(teacher, shards)
    assert [a.shape for a in arrays] == [(2, 4), (1, 4)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "records no hash of the texts" in warnings[0], warnings
    assert "re-run `htmllm teacher embed`" in warnings[0]
    caplog.clear()
    monkeypatch.setenv("RANK", "1")  # the other torchrun workers say nothing: one warning a run
    with caplog.at_level(logging.WARNING, logger="model_training.teacher"):
        load_teacher_embeddings(teacher, shards)
    assert not caplog.records


def _tiny_bert(root: Path) -> Path:
    """A plain Hugging Face BERT directory (sentence-transformers adds mean pooling), built in-process."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root.mkdir()
    vocab = root / "vocab.txt"
    vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase]) + "\n"
    )
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(root)
    config = BertConfig(
        vocab_size=31, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=16,
        max_position_embeddings=64,
    )  # fmt: skip
    BertModel(config).save_pretrained(root)
    return root


def test_teacher_embed_records_what_it_read_and_training_refuses_it_after_a_new_prepare(
    prepare: Any, tmp_path: Path
) -> None:
    """The engineer's sequence: prepare without extraction, embed, prepare with extraction, train."""
    from model_training.batches import load_splits

    shards = prepare(NO_EXTRACTION)
    teacher = tmp_path / "teacher"
    meta = embed_shards(shards, teacher, model=str(_tiny_bert(tmp_path / "bert")), progress=False)
    load_splits(shards, teacher)  # what `htmllm train` loads: accepted as embedded
    prepare("union", text="the extracted words")
    with pytest.raises(DataError, match="embedded other texts than"):
        load_splits(shards, teacher)
    assert meta.fallbacks == 3 and meta.shards_extractor == NO_EXTRACTION


def test_a_shard_rewritten_under_its_old_manifest_is_not_embedded(prepare: Any, tmp_path: Path) -> None:
    """teacher.json records the manifest's row-id hash: vectors of a shard whose rows are no longer the
    ones its manifest lists would have been recorded as theirs."""
    import pyarrow.parquet as pq

    shards = prepare(NO_EXTRACTION)
    path = shards / "shard-00000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.take(list(reversed(range(table.num_rows)))), path)
    with pytest.raises(DataError, match="does not hold the rows its manifest lists"):
        _write_zero_teacher(shards, tmp_path / "teacher")
    assert not (tmp_path / "teacher" / TEACHER_META_FILE).exists()


def test_shards_prepared_again_with_another_tokenizer_keep_the_teacher_whose_texts_are_the_same(
    prepare: Any, tmp_path: Path
) -> None:
    """The teacher reads texts, never token ids: a tokenizer ablation (another vocabulary, `--tags 0`) had
    been refused its teacher ("tokenizer hash differs"), the most expensive step run again for nothing.
    Other texts are still refused; a teacher.json of before the texts were recorded still goes by the
    tokenizer's hash, the one thing it can tell by."""
    shards = prepare(NO_EXTRACTION)
    teacher = tmp_path / "teacher"
    _write_zero_teacher(shards, teacher)
    other = tmp_path / "other-tok.json"
    build_tiny_tokenizer(vocab_size=384, tags=8).save(other)
    prepare(NO_EXTRACTION, tokenizer=other)
    assert (
        read_manifest(shards)["tokenizer_sha256"]
        != json.loads((teacher / TEACHER_META_FILE).read_text(encoding="utf-8"))["shards_tokenizer_sha256"]
    )
    load_teacher_embeddings(teacher, shards)  # same texts: accepted
    recorded = json.loads((teacher / TEACHER_META_FILE).read_text(encoding="utf-8"))
    for entry in recorded["shards"]:
        del entry["texts_sha256"]
    (teacher / TEACHER_META_FILE).write_text(json.dumps(recorded), encoding="utf-8")
    with pytest.raises(DataError, match=r"shards of another tokenizer.*re-run `htmllm teacher embed --input"):
        load_teacher_embeddings(teacher, shards)
