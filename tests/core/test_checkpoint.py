"""The checkpoint directory: round trip, strict loading, AutoModel compatibility, adding heads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModel

from service.core.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    checkpoint_fingerprint,
    load_checkpoint,
    read_meta,
    save_heads,
)
from service.core.errors import ErrorCode
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint, build_tiny_model
from tests.factories.tokenizer import build_tiny_tokenizer


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return build_tiny_checkpoint(tmp_path / "ckpt")


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def test_round_trip_gives_identical_outputs(ckpt: Path) -> None:
    original = build_tiny_model()
    loaded = load_checkpoint(ckpt)
    assert loaded.meta.format_version == FORMAT_VERSION
    assert [h.name for h in loaded.meta.heads] == ["page_type", "quality"]
    assert loaded.meta.heads[0].labels == ["article", "listing", "other"]
    assert loaded.meta.tokenizer_sha256 == build_tiny_tokenizer().sha256
    assert loaded.meta.embedding_dim == original.embedding_dim
    ids, mask = _batch(original.config.vocab_size)
    with torch.inference_mode():
        emb_a, scores_a = original(ids, mask)
        emb_b, scores_b = loaded.model(ids, mask)
    torch.testing.assert_close(emb_a, emb_b, rtol=0, atol=0)
    for name in scores_a:
        torch.testing.assert_close(scores_a[name], scores_b[name], rtol=0, atol=0)


def test_every_file_is_readable_by_other_users(ckpt: Path) -> None:
    """A checkpoint mounted into a container is read by another uid."""
    files = [p for p in ckpt.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o044 == 0o044 for p in files), [
        (str(p.relative_to(ckpt)), oct(p.stat().st_mode)) for p in files
    ]


def test_automodel_loads_the_encoder(ckpt: Path) -> None:
    encoder = AutoModel.from_pretrained(ckpt)
    assert type(encoder).__name__ == "ModernBertModel"
    ours = load_checkpoint(ckpt).model
    ids, mask = _batch(ours.config.vocab_size)
    with torch.inference_mode():
        theirs = encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        torch.testing.assert_close(theirs, ours.embed(ids, mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json", "htmllm.json"])
def test_missing_file_is_a_clear_error(ckpt: Path, name: str) -> None:
    (ckpt / name).unlink()
    with pytest.raises(CheckpointError, match=name) as info:
        load_checkpoint(ckpt)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID


def test_missing_head_file_is_a_clear_error(ckpt: Path) -> None:
    (ckpt / "heads" / "quality.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"quality\.safetensors"):
        load_checkpoint(ckpt)


def test_vocab_mismatch_is_a_clear_error(ckpt: Path) -> None:
    build_tiny_tokenizer(vocab_size=400).save(ckpt / "tokenizer.json")
    with pytest.raises(CheckpointError, match="vocab mismatch"):
        load_checkpoint(ckpt)


def test_swapped_tokenizer_of_the_same_size_is_caught_by_its_hash(ckpt: Path) -> None:
    data = json.loads((ckpt / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    # Swap two ordinary tokens: same size, same special ids, different vocabulary.
    keys = [k for k in vocab if not k.startswith("[")][:2]
    vocab[keys[0]], vocab[keys[1]] = vocab[keys[1]], vocab[keys[0]]
    (ckpt / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(ckpt)


def test_unknown_format_version_is_refused(ckpt: Path) -> None:
    meta = json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))
    meta["format_version"] = FORMAT_VERSION + 1
    (ckpt / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CheckpointError, match="format version"):
        load_checkpoint(ckpt)


def test_wrong_tensor_shapes_are_refused(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config["intermediate_size"] += 8
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(ckpt)


def test_save_heads_adds_and_replaces_without_touching_the_encoder(ckpt: Path) -> None:
    weights_before = (ckpt / "model.safetensors").read_bytes()
    dim = read_meta(ckpt).embedding_dim
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8, metrics={"f1": 0.5})
    quality = HeadSpec(name="quality", kind="regression", hidden=4, metrics={"mae": 0.1})
    save_heads(ckpt, {"topic": (topic, TaskHead(topic, dim)), "quality": (quality, TaskHead(quality, dim))})
    loaded = load_checkpoint(ckpt)
    specs = {h.name: h for h in loaded.meta.heads}
    assert set(specs) == {"page_type", "quality", "topic"}
    assert specs["quality"].hidden == 4 and specs["quality"].metrics == {"mae": 0.1}
    assert specs["topic"].metrics == {"f1": 0.5}
    assert (ckpt / "model.safetensors").read_bytes() == weights_before


def test_saving_over_a_checkpoint_removes_the_heads_the_model_no_longer_has(ckpt: Path) -> None:
    """Re-exported without its heads, a checkpoint kept their files: htmllm.json no longer listed them,
    but they changed its fingerprint (an ONNX graph re-exported, an embed run refused to resume)."""
    build_tiny_checkpoint(ckpt, heads=False)  # the same model saved again, without heads
    assert read_meta(ckpt).heads == []
    assert list((ckpt / "heads").glob("*.safetensors")) == []
    assert checkpoint_fingerprint(ckpt) == checkpoint_fingerprint(
        build_tiny_checkpoint(ckpt.parent / "fresh", heads=False)
    )


def test_mean_pooling_survives_the_round_trip(tmp_path: Path) -> None:
    path = build_tiny_checkpoint(tmp_path / "mean", pooling="mean", heads=False)
    loaded = load_checkpoint(path)
    assert loaded.model.pooling == "mean" and loaded.meta.heads == []


def _edit_meta(ckpt: Path, edit: Any) -> None:
    meta = json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))
    edit(meta)
    (ckpt / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_length", "64"),  # had been read as 64
        ("max_length", 64.7),  # had been read as 64
        ("max_length", 1),  # no room for [CLS] and [SEP]
        ("name", None),  # had been read as "None"
        ("format_version", True),  # True == 1
        ("embedding_dim", 0),
        ("pooling", "max"),  # had surfaced as an untyped ValueError from the model
        ("heads", {"page_type": {}}),
    ],
)
def test_htmllm_json_fields_of_the_wrong_type_or_value_are_refused(
    ckpt: Path, field: str, value: Any
) -> None:
    _edit_meta(ckpt, lambda meta: meta.__setitem__(field, value))
    with pytest.raises(CheckpointError, match=f"malformed.*{field}") as info:
        read_meta(ckpt)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("labels", "abc"),  # three characters: had been read as the classes a, b and c, and loaded
        ("labels", ["article", 1, "other"]),
        ("hidden", 16.5),  # had been read as 16
        ("metrics", {"f1": "high"}),
    ],
)
def test_head_fields_of_the_wrong_type_are_refused(ckpt: Path, field: str, value: Any) -> None:
    _edit_meta(ckpt, lambda meta: meta["heads"][0].__setitem__(field, value))
    with pytest.raises(CheckpointError, match=f"malformed.*{field}"):
        load_checkpoint(ckpt)


def test_a_head_listed_twice_is_refused_by_the_metadata_alone(ckpt: Path) -> None:
    # read_meta is all the onnx backend reads when its graph is current
    _edit_meta(ckpt, lambda meta: meta["heads"].append(dict(meta["heads"][0])))
    with pytest.raises(CheckpointError, match="twice"):
        read_meta(ckpt)


def test_htmllm_json_that_is_not_utf8_is_a_checkpoint_error(ckpt: Path) -> None:
    (ckpt / "htmllm.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_meta(ckpt)


@pytest.mark.parametrize(
    ("key", "value"), [("num_attention_heads", 3), ("vocab_size", "many"), ("hidden_size", None)]
)
def test_an_impossible_config_is_a_checkpoint_error(ckpt: Path, key: str, value: Any) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config[key] = value
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_checkpoint(ckpt)
