"""Which encoder a head file records when a loaded head is saved again, and what of the encoder the
record reads.

`save_checkpoint` had stamped every head with the encoder it saved, so a head loaded from one checkpoint
and saved with another run's encoder (same width) passed the load check; and the probe read 2-D tensors
only, so an encoder fine-tuned in its LayerNorm weights alone passed for the one the heads were fit on.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from service.core.checkpoint import (
    ENCODER_PROBE_KEY,
    ENCODER_VECTORS_KEY,
    HEAD_NAME_KEY,
    CheckpointError,
    checkpoint_fingerprint,
    load_checkpoint,
    read_encoder_probe,
    save_checkpoint,
    save_heads,
    set_loaded_probe,
)
from service.core.modeling import TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint


def _metadata(file: Path) -> dict[str, str]:
    with safe_open(str(file), framework="pt") as handle:
        return dict(handle.metadata() or {})


def _rewrite_weights(ckpt: Path, change: dict[int, float], dtype: torch.dtype | None = None) -> None:
    """Scale every tensor of model.safetensors with as many dimensions as a key of `change` by its value
    (cast to `dtype`, where given), as a fine-tune or an export would leave them."""
    weights = ckpt / "model.safetensors"
    tensors = load_file(str(weights))
    tensors = {k: (v * change.get(v.dim(), 1.0)).to(dtype or v.dtype) for k, v in tensors.items()}
    save_file(tensors, str(weights), {"format": "pt"})


def _strip_vectors(ckpt: Path) -> None:
    """Head files as written before 1-D tensors were probed: their encoder_probe alone."""
    for file in (ckpt / "heads").glob("*.safetensors"):
        metadata = _metadata(file)
        metadata.pop(ENCODER_VECTORS_KEY)
        save_file(load_file(str(file)), str(file), metadata)


def test_a_loaded_head_saved_with_another_encoder_is_refused_and_the_checkpoint_kept(tmp_path: Path) -> None:
    """The Python user's swap: a checkpoint loaded, another run's encoder (same width) put in, saved with
    the old heads. Stamped with the new encoder, the heads had passed the load check; a copy of the model
    (as `TorchRunner` and pretrain's export make) keeps what its heads' files recorded."""
    a = build_tiny_checkpoint(tmp_path / "a")
    b = build_tiny_checkpoint(tmp_path / "b", seed=1)
    checkpoint = load_checkpoint(a)
    model = copy.deepcopy(checkpoint.model)
    model.encoder.load_state_dict(load_checkpoint(b).model.encoder.state_dict())
    before = checkpoint_fingerprint(a)
    with pytest.raises(
        CheckpointError, match="heads 'page_type', 'quality' were loaded from head files fit"
    ) as info:
        save_checkpoint(a, model, checkpoint.tokenizer, checkpoint.meta)
    assert "set_loaded_probe(head, None)" in str(info.value)  # the way out, for a head trained on
    assert checkpoint_fingerprint(a) == before and sorted(load_checkpoint(a).model.heads) == [
        "page_type",
        "quality",
    ]
    assert not list(a.glob(".htmllm-save.*"))


def test_a_loaded_head_saved_into_another_checkpoint_is_refused(tmp_path: Path) -> None:
    """`save_heads` of a head taken from one checkpoint into another of the same width."""
    a = build_tiny_checkpoint(tmp_path / "a")
    b = build_tiny_checkpoint(tmp_path / "b", seed=1, heads=False)
    head = load_checkpoint(a).model.heads["page_type"]
    assert isinstance(head, TaskHead)
    before = checkpoint_fingerprint(b)
    with pytest.raises(CheckpointError, match="head 'page_type' was loaded from a head file fit on"):
        save_heads(b, {"page_type": (head.spec, head)})
    assert checkpoint_fingerprint(b) == before and not (b / "heads/page_type.safetensors").exists()


def test_a_head_trained_on_in_this_process_is_saved_as_the_new_encoders_once_forgotten(
    tmp_path: Path,
) -> None:
    a = build_tiny_checkpoint(tmp_path / "a")
    b = build_tiny_checkpoint(tmp_path / "b", seed=1)
    checkpoint = load_checkpoint(a)
    checkpoint.model.encoder.load_state_dict(load_checkpoint(b).model.encoder.state_dict())
    for head in checkpoint.model.heads.values():
        set_loaded_probe(head, None)
    save_checkpoint(tmp_path / "c", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    assert sorted(load_checkpoint(tmp_path / "c").model.heads) == ["page_type", "quality"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_loaded_head_keeps_its_recorded_probe_through_casts(tmp_path: Path, dtype: torch.dtype) -> None:
    """Saved with the same encoder cast (an export in float16), a head records the probe its file did,
    not the cast's: two casts in a row then stay within the tolerance of the encoder it was fit on."""
    a = build_tiny_checkpoint(tmp_path / "a")
    recorded = _metadata(a / "heads/page_type.safetensors")
    checkpoint = load_checkpoint(a, dtype=dtype)
    save_checkpoint(tmp_path / "c", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    saved = _metadata(tmp_path / "c/heads/page_type.safetensors")
    assert saved == recorded
    assert json.loads(saved[ENCODER_PROBE_KEY]) != list(
        read_encoder_probe(tmp_path / "c/model.safetensors").matrices
    )
    assert sorted(load_checkpoint(tmp_path / "c").model.heads) == ["page_type", "quality"]


def test_heads_from_files_without_a_probe_are_saved_as_the_encoders_they_are_saved_with(
    tmp_path: Path,
) -> None:
    """Nothing recorded, nothing to keep (the bundled model's heads): as before, the encoder they are
    saved with is theirs."""
    a = build_tiny_checkpoint(tmp_path / "a")
    for file in (a / "heads").glob("*.safetensors"):
        save_file(load_file(str(file)), str(file), {HEAD_NAME_KEY: file.stem})
    checkpoint = load_checkpoint(a)
    checkpoint.model.encoder.load_state_dict(
        load_checkpoint(build_tiny_checkpoint(tmp_path / "b", seed=1)).model.encoder.state_dict()
    )
    save_checkpoint(tmp_path / "c", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    probe = read_encoder_probe(tmp_path / "c/model.safetensors")
    saved = _metadata(tmp_path / "c/heads/quality.safetensors")
    assert json.loads(saved[ENCODER_PROBE_KEY]) == list(probe.matrices)
    assert json.loads(saved[ENCODER_VECTORS_KEY]) == list(probe.vectors or ())


def test_an_encoder_fine_tuned_in_its_layer_norms_alone_is_another_encoder(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    _rewrite_weights(ckpt, {1: 1.05})  # every 1-D tensor: the LayerNorm weights
    with pytest.raises(CheckpointError, match="were fit on the embeddings of another encoder") as info:
        load_checkpoint(ckpt)
    assert "LayerNorm weights their encoder_probe_vectors metadata records differ" in str(info.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_files_of_before_keep_loading_by_their_own_rule(tmp_path: Path, dtype: torch.dtype) -> None:
    """A head file with `encoder_probe` alone is compared by its matrices: refused for another encoder
    as before, and not for a change it never recorded (nor a cast of its encoder)."""
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    _strip_vectors(ckpt)
    _rewrite_weights(ckpt, {1: 1.05}, dtype)
    assert sorted(load_checkpoint(ckpt).model.heads) == ["page_type", "quality"]
    _rewrite_weights(ckpt, {2: 1.05})
    with pytest.raises(CheckpointError, match="the weights their encoder_probe metadata records differ"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("metadata", "said"),
    [
        ({ENCODER_VECTORS_KEY: "[NaN]"}, "its encoder_probe_vectors metadata is not all finite"),
        ({ENCODER_VECTORS_KEY: "[1.0]"}, "its encoder_probe_vectors metadata holds 1 values where"),
        ({ENCODER_VECTORS_KEY: '"1.0"'}, "its encoder_probe_vectors metadata is not a list of numbers"),
        ({ENCODER_PROBE_KEY: None}, "has encoder_probe_vectors but no encoder_probe"),
    ],
)
def test_a_corrupt_vectors_record_is_said_as_such(
    tmp_path: Path, metadata: dict[str, str | None], said: str
) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    file = ckpt / "heads/quality.safetensors"
    recorded: dict[str, str | None] = {**_metadata(file), **metadata}
    save_file(load_file(str(file)), str(file), {k: v for k, v in recorded.items() if v is not None})
    with pytest.raises(CheckpointError, match=said) as info:
        load_checkpoint(ckpt)
    assert "quality.safetensors" in str(info.value) and "another encoder" not in str(info.value)
