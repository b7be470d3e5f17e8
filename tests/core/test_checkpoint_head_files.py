"""What a head file says of itself: the head it holds and the encoder it was fit on, checked at load;
the names `save_heads` takes; mismatches said as labels and widths rather than tensor shapes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from service.core.checkpoint import (
    ENCODER_PROBE_KEY,
    ENCODER_VECTORS_KEY,
    HEAD_NAME_KEY,
    RESERVED_HEAD_NAMES,
    CheckpointError,
    checkpoint_fingerprint,
    encoder_probe,
    load_checkpoint,
    read_encoder_probe,
    read_meta,
    save_heads,
)
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import CLASSIFICATION_HEAD, build_tiny_checkpoint

# Shaped as the tiny checkpoint's page_type head (3 outputs, hidden 16): a file of one fits the other.
TOPIC = HeadSpec(name="topic", kind="classification", labels=["news", "shop", "blog"], hidden=16)


def _with_topic(path: Path, *, seed: int = 0) -> Path:
    ckpt = build_tiny_checkpoint(path, seed=seed)
    torch.manual_seed(3)
    save_heads(ckpt, {"topic": (TOPIC, TaskHead(TOPIC, read_meta(ckpt).embedding_dim))})
    return ckpt


def _metadata(file: Path) -> dict[str, str]:
    with safe_open(str(file), framework="pt") as handle:
        return dict(handle.metadata() or {})


def _cast_weights(ckpt: Path, dtype: torch.dtype) -> None:
    weights = ckpt / "model.safetensors"
    save_file({k: v.to(dtype) for k, v in load_file(str(weights)).items()}, str(weights), {"format": "pt"})


def test_a_head_file_copied_over_another_heads_is_refused_naming_both(tmp_path: Path) -> None:
    """`cp heads/topic.safetensors heads/page_type.safetensors` (as many outputs) had loaded: page_type's
    labels and metrics in /info, topic's scores under them."""
    ckpt = _with_topic(tmp_path / "ckpt")
    shutil.copyfile(ckpt / "heads/topic.safetensors", ckpt / "heads/page_type.safetensors")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    message = str(info.value)
    assert (
        "heads/page_type.safetensors holds head 'topic'" in message and "expects head 'page_type'" in message
    )


def test_a_head_fit_on_another_encoder_of_the_same_width_is_refused(tmp_path: Path) -> None:
    """A head file and its htmllm.json entry carried over to another checkpoint of the same width had
    loaded, scoring that encoder's embeddings with a head fit on another's (its metrics a lie)."""
    source = _with_topic(tmp_path / "a")
    other = build_tiny_checkpoint(tmp_path / "b", seed=1)  # same preset and width, other weights
    shutil.copyfile(source / "heads/topic.safetensors", other / "heads/topic.safetensors")
    meta = json.loads((other / "htmllm.json").read_text(encoding="utf-8"))
    meta["heads"].append(TOPIC.to_dict())
    (other / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(
        CheckpointError, match=r"topic\.safetensors was fit on the embeddings of another encoder"
    ):
        load_checkpoint(other)
    # The heads save_checkpoint wrote with b's own encoder are b's: only the carried-over file is refused.
    meta["heads"].pop()
    (other / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")
    (other / "heads/topic.safetensors").unlink()
    assert ENCODER_PROBE_KEY in _metadata(other / "heads/page_type.safetensors")
    assert sorted(load_checkpoint(other).model.heads) == ["page_type", "quality"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_same_encoder_cast_or_copied_still_loads_its_heads(tmp_path: Path, dtype: torch.dtype) -> None:
    """The probe is of the weights, not of the file's bytes: the bundled model ships float16 weights,
    and a copy or a cast of the encoder its heads were fit on is still that encoder."""
    ckpt = _with_topic(tmp_path / "ckpt")
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    _cast_weights(copy, dtype)
    assert sorted(load_checkpoint(copy).model.heads) == ["page_type", "quality", "topic"]


def test_head_files_without_the_records_load_as_before(tmp_path: Path) -> None:
    """Head files written before heads recorded their encoder (the bundled model's) or by hand."""
    ckpt = _with_topic(tmp_path / "ckpt")
    for name in ("topic", "page_type", "quality"):
        file = ckpt / "heads" / f"{name}.safetensors"
        save_file(load_file(str(file)), str(file), {HEAD_NAME_KEY: name} if name == "topic" else None)
    _cast_weights(ckpt, torch.float16)
    shutil.copyfile(  # a checkpoint of the same width, other weights: nothing recorded, nothing refused
        build_tiny_checkpoint(tmp_path / "other", seed=1) / "model.safetensors", ckpt / "model.safetensors"
    )
    assert sorted(load_checkpoint(ckpt).model.heads) == ["page_type", "quality", "topic"]


def test_save_heads_records_the_encoder_and_refuses_heads_fit_on_another(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    other = build_tiny_checkpoint(tmp_path / "other", seed=1)
    head = {"topic": (TOPIC, TaskHead(TOPIC, read_meta(ckpt).embedding_dim))}
    before = checkpoint_fingerprint(ckpt)
    with pytest.raises(CheckpointError, match="fit on the embeddings of another encoder than"):
        save_heads(ckpt, head, fit_on=encoder_probe(other / "model.safetensors"))
    assert checkpoint_fingerprint(ckpt) == before and not (ckpt / "heads/topic.safetensors").exists()
    save_heads(ckpt, head, fit_on=encoder_probe(ckpt / "model.safetensors"))
    recorded = _metadata(ckpt / "heads/topic.safetensors")
    assert recorded[HEAD_NAME_KEY] == "topic"
    probe = read_encoder_probe(ckpt / "model.safetensors")
    assert json.loads(recorded[ENCODER_PROBE_KEY]) == list(probe.matrices)
    assert json.loads(recorded[ENCODER_VECTORS_KEY]) == list(probe.vectors or ())


@pytest.mark.parametrize("name", ["index", "embedding", "http_status", "spam v2", "späm", "a+b"])
def test_save_heads_refuses_a_name_heads_train_refuses(tmp_path: Path, name: str) -> None:
    """The Python API had saved `index`, `embedding`, `spam v2` and `späm`, which `heads train` refuses;
    `htmllm embed` then refused the checkpoint while the service served it."""
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    before = checkpoint_fingerprint(ckpt)
    spec = HeadSpec(name=name, kind="regression", hidden=8)
    with pytest.raises(CheckpointError, match=f"head {re.escape(repr(name))}: a head"):
        save_heads(ckpt, {name: (spec, TaskHead(spec, read_meta(ckpt).embedding_dim))})
    assert checkpoint_fingerprint(ckpt) == before
    assert sorted(p.name for p in (ckpt / "heads").glob("*.safetensors")) == [
        "page_type.safetensors",
        "quality.safetensors",
    ]


def test_save_heads_takes_the_names_heads_train_takes(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    specs = [HeadSpec(name=name, kind="regression", hidden=8) for name in ("spam-v2", "Spam_2", "-")]
    save_heads(ckpt, {s.name: (s, TaskHead(s, read_meta(ckpt).embedding_dim)) for s in specs})
    assert sorted(load_checkpoint(ckpt).model.heads) == ["-", "Spam_2", "page_type", "quality", "spam-v2"]


def test_the_reserved_head_names_are_the_columns_every_embed_row_has() -> None:
    from service.commands.embed import FIXED_COLUMNS

    assert set(FIXED_COLUMNS) == RESERVED_HEAD_NAMES


def test_a_head_with_another_label_count_is_said_as_such(tmp_path: Path) -> None:
    """It had been "tensor out.bias has shape (3,), config needs (6,)"."""
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    meta = json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))
    meta["heads"][0]["labels"] = [*CLASSIFICATION_HEAD.labels, "forum", "shop", "wiki"]
    (ckpt / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    assert "head 'page_type' has 3 outputs, but htmllm.json lists 6 labels for it" in str(info.value)
    assert "labels and its weights are of different trainings" in str(info.value)


def test_a_head_of_another_width_is_said_as_such(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    dim = read_meta(ckpt).embedding_dim
    save_file(TaskHead(CLASSIFICATION_HEAD, dim * 2).state_dict(), str(ckpt / "heads/page_type.safetensors"))
    with pytest.raises(CheckpointError, match=f"takes {dim * 2}-d embeddings, this encoder gives {dim}"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("probe", "said"),
    [
        ("[" + "9" * 400 + "]", "not all finite"),  # json reads it, float() overflows
        ("[NaN, 1.0]", "not all finite"),
        ("[Infinity]", "not all finite"),
        ("[1e999]", "not all finite"),
        ("[]", "empty"),
        ("[0.5, 0.25]", "holds 2 values where"),
    ],
)
def test_a_corrupt_encoder_probe_is_said_as_such(tmp_path: Path, probe: str, said: str) -> None:
    """A hand-edited probe had been a raw OverflowError traceback (a huge integer), or "fit on another
    encoder" (NaN, infinity, an empty or short list), which sent the user to retrain a head."""
    ckpt = _with_topic(tmp_path / "ckpt")
    file = ckpt / "heads/topic.safetensors"
    save_file(load_file(str(file)), str(file), {HEAD_NAME_KEY: "topic", ENCODER_PROBE_KEY: probe})
    with pytest.raises(CheckpointError, match=re.escape(said)) as info:
        load_checkpoint(ckpt)
    assert "topic.safetensors" in str(info.value) and "another encoder" not in str(info.value)
