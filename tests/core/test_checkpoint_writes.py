"""`save_checkpoint` over an existing checkpoint: the old one or the new one, never a mix, and never
written through a symlink."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import torch

from service.core.checkpoint import (
    SAVE_STAGE_PREFIX,
    CheckpointError,
    CheckpointMeta,
    checkpoint_fingerprint,
    load_checkpoint,
    save_checkpoint,
)
from service.core.prune import PRUNE_VERSION
from tests.factories.checkpoint import TINY_MAX_LENGTH, build_tiny_model
from tests.factories.tokenizer import build_tiny_tokenizer

FILES = ("config.json", "model.safetensors", "tokenizer.json", "htmllm.json")


def _meta(name: str) -> CheckpointMeta:
    return CheckpointMeta(
        name=name,
        pooling="cls",
        prune_version=PRUNE_VERSION,
        tokenizer_sha256=build_tiny_tokenizer().sha256,
        max_length=TINY_MAX_LENGTH,
        embedding_dim=build_tiny_model(heads=False).embedding_dim,
    )


def _contents(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def test_a_save_that_fails_while_writing_leaves_the_old_checkpoint_as_it_was(ckpt: Path) -> None:
    """The disk filling up while the heads were written had left the new encoder under the old heads
    and htmllm.json, and that loaded without a word."""
    before = _contents(ckpt)
    fingerprint = checkpoint_fingerprint(ckpt)
    from service.core.checkpoint import _save_tensors as real

    def disk_full(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        if metadata.get("head") is not None:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, tensors, metadata)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("service.core.checkpoint._save_tensors", disk_full)
        with pytest.raises(OSError, match="No space left"):
            save_checkpoint(ckpt, build_tiny_model(seed=1), build_tiny_tokenizer(), _meta("retrained"))
    assert _contents(ckpt) == before
    assert checkpoint_fingerprint(ckpt) == fingerprint and load_checkpoint(ckpt).meta.name == "tiny-test"
    assert not list(ckpt.glob(f"{SAVE_STAGE_PREFIX}*"))


def test_a_save_stopped_among_the_renames_leaves_a_checkpoint_load_refuses(ckpt: Path) -> None:
    """htmllm.json goes first and comes back last: between the two, no reader takes the directory for
    a checkpoint (here the rename of the weights fails, after config.json's)."""
    real = os.replace

    def fail_at_the_weights(source: str | Path, target: str | Path) -> None:
        if Path(target) == ckpt / "model.safetensors":
            raise OSError(errno.EIO, "Input/output error")
        real(source, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", fail_at_the_weights)
        with pytest.raises(OSError, match="Input/output"):
            save_checkpoint(ckpt, build_tiny_model(seed=1), build_tiny_tokenizer(), _meta("retrained"))
    with pytest.raises(CheckpointError, match=r"htmllm\.json"):
        load_checkpoint(ckpt)
    save_checkpoint(ckpt, build_tiny_model(seed=1), build_tiny_tokenizer(), _meta("retrained"))
    assert load_checkpoint(ckpt).meta.name == "retrained"


def test_symlinked_files_are_replaced_not_written_through(ckpt: Path, tmp_path: Path) -> None:
    """A Hugging Face cache snapshot links its files to shared blobs: saving over it wrote config.json
    and tokenizer.json through the links, into blobs other snapshots read."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in (*FILES, "heads/page_type.safetensors", "heads/quality.safetensors"):
        data = (ckpt / name).read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (ckpt / name).unlink()
        (ckpt / name).symlink_to(blob)
    blob_bytes = {blob.name: blob.read_bytes() for blob in blobs.iterdir()}
    save_checkpoint(ckpt, build_tiny_model(seed=1), build_tiny_tokenizer(), _meta("retrained"))
    assert {blob.name: blob.read_bytes() for blob in blobs.iterdir()} == blob_bytes
    assert not [p for p in ckpt.rglob("*") if p.is_symlink()]
    assert load_checkpoint(ckpt).meta.name == "retrained"


def test_a_killed_saves_stage_is_ignored_by_readers_and_removed_by_the_next_save(ckpt: Path) -> None:
    """Files beside the checkpoint's own (a model.onnx) are left, as before."""
    fingerprint = checkpoint_fingerprint(ckpt)
    stage = ckpt / f"{SAVE_STAGE_PREFIX}k3x9abzq"
    stage.mkdir()
    (stage / "model.safetensors").write_bytes(b"half a file")
    (ckpt / "model.onnx").write_bytes(b"graph")
    assert checkpoint_fingerprint(ckpt) == fingerprint
    assert load_checkpoint(ckpt).meta.name == "tiny-test"
    save_checkpoint(ckpt, build_tiny_model(), build_tiny_tokenizer(), _meta("saved again"))
    assert not stage.exists() and (ckpt / "model.onnx").read_bytes() == b"graph"
    assert load_checkpoint(ckpt).meta.name == "saved again"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([*FILES, "heads", "model.onnx"])
