"""What a refused save leaves, and what a refusal of heads fit on another encoder names.

A `save_checkpoint` into a new path refused for a loaded head had left a directory holding
heads/.pending.lock alone (serve and load: "not a checkpoint"), and decided so only after writing the
whole encoder; and after a fine-tune, load and save named one mismatching head per attempt, so a user
retraining the head named was refused for the next one.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from service.core.checkpoint import (
    SAVE_STAGE_PREFIX,
    Checkpoint,
    CheckpointError,
    CheckpointMeta,
    EncoderProbe,
    checkpoint_fingerprint,
    load_checkpoint,
    read_encoder_probe,
    save_checkpoint,
)
from service.core.head_files import check_heads_encoder, state_probe
from service.core.modeling import HtmlEncoderModel
from service.core.prune import PRUNE_VERSION
from tests.factories.checkpoint import TINY_MAX_LENGTH, build_tiny_checkpoint, build_tiny_model
from tests.factories.tokenizer import build_tiny_tokenizer


def _fine_tuned(ckpt: Path) -> Checkpoint:
    """The checkpoint loaded, its encoder's LayerNorm weights (every 1-D tensor) times 1.05: a fine-tune
    of the norms, as the heads loaded with it were not fit on."""
    checkpoint = load_checkpoint(ckpt)
    with torch.no_grad():
        for parameter in checkpoint.model.encoder.parameters():
            if parameter.dim() == 1:
                parameter.mul_(1.05)
    return checkpoint


def _meta(model: HtmlEncoderModel) -> CheckpointMeta:
    return CheckpointMeta(
        name="tiny-test",
        pooling="cls",
        prune_version=PRUNE_VERSION,
        tokenizer_sha256=build_tiny_tokenizer().sha256,
        max_length=TINY_MAX_LENGTH,
        embedding_dim=model.embedding_dim,
    )


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_refused_save_into_a_new_path_leaves_nothing(tmp_path: Path) -> None:
    checkpoint = _fine_tuned(build_tiny_checkpoint(tmp_path / "a"))
    with pytest.raises(
        CheckpointError, match="fit on the embeddings of another encoder than the one saved into"
    ):
        save_checkpoint(tmp_path / "new" / "n1", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    assert not (tmp_path / "new").exists()  # nor the parent it would have created


def test_the_refusal_is_decided_before_the_encoder_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = _fine_tuned(build_tiny_checkpoint(tmp_path / "a"))
    written: list[object] = []
    real = checkpoint.model.encoder.save_pretrained

    def save_pretrained(directory: Path, **kwargs: Any) -> None:
        written.append(directory)
        real(directory, **kwargs)

    monkeypatch.setattr(checkpoint.model.encoder, "save_pretrained", save_pretrained)
    with pytest.raises(CheckpointError, match="nothing was saved"):
        save_checkpoint(tmp_path / "a", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    assert written == []


def test_a_save_failing_while_writing_into_a_new_path_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk, not a refusal: the directory the save created goes with it all the same."""
    from service.core.checkpoint import _save_tensors as real

    def disk_full(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        if metadata.get("head") == "quality":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, tensors, metadata)

    checkpoint = load_checkpoint(build_tiny_checkpoint(tmp_path / "a"))
    monkeypatch.setattr("service.core.checkpoint._save_tensors", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path / "n1", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    assert not (tmp_path / "n1").exists()


def test_a_refused_save_over_a_checkpoint_or_a_directory_leaves_them_as_they_were(tmp_path: Path) -> None:
    a = build_tiny_checkpoint(tmp_path / "a")
    checkpoint = _fine_tuned(a)
    before, files = checkpoint_fingerprint(a), _files(a)
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (a, empty):
        with pytest.raises(
            CheckpointError, match="fit on the embeddings of another encoder than the one saved into"
        ):
            save_checkpoint(target, checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    assert (
        checkpoint_fingerprint(a) == before
        and _files(a) == files
        and not list(a.glob(f"{SAVE_STAGE_PREFIX}*"))
    )
    assert _files(empty) == []


def test_a_save_refusal_names_every_head_fit_on_another_encoder(tmp_path: Path) -> None:
    checkpoint = _fine_tuned(build_tiny_checkpoint(tmp_path / "a"))
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path / "c", checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    said = str(info.value)
    assert said.startswith("heads 'page_type', 'quality' were loaded from head files fit on")
    assert said.count("htmllm heads train") == 1 and said.count("set_loaded_probe") == 1


def test_a_load_refusal_names_every_head_file_fit_on_another_encoder(tmp_path: Path) -> None:
    """After a fine-tune every head is one: named all at once, `htmllm heads train` is run once."""
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    tensors = load_file(str(weights))
    save_file(
        {k: v * 1.05 if v.dim() == 1 else v for k, v in tensors.items()}, str(weights), {"format": "pt"}
    )
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    said = str(info.value)
    files = [str(ckpt / "heads" / f"{name}.safetensors") for name in ("page_type", "quality")]
    assert said.startswith(f"2 head files, {files[0]}, {files[1]}, were fit on the embeddings of another")
    assert "the LayerNorm weights their encoder_probe_vectors metadata records differ" in said
    assert said.count("htmllm heads train") == 1 and "a task for each of page_type, quality" in said


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_probe_of_the_encoder_in_memory_is_the_one_read_from_its_file(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    """What the save decides by, before writing, is what load compares with, value for value."""
    model = build_tiny_model(seed=3)
    model.place("cpu", dtype)
    model.encoder.save_pretrained(tmp_path, safe_serialization=True)
    assert state_probe(model.encoder.state_dict()) == read_encoder_probe(tmp_path / "model.safetensors")


def test_files_differing_in_other_records_are_each_said_with_their_own() -> None:
    actual = EncoderProbe((1.0, 2.0), (1.0,))
    probes = {
        Path("heads/c.safetensors"): EncoderProbe((1.0, 2.0), (1.05,)),
        Path("heads/a.safetensors"): EncoderProbe((1.5, 2.0), (1.0,)),
        Path("heads/b.safetensors"): EncoderProbe((1.0, 2.0), (1.05,)),
        Path("heads/ok.safetensors"): EncoderProbe((1.0, 2.0), None),
    }
    with pytest.raises(CheckpointError) as info:
        check_heads_encoder(probes, actual)
    said = str(info.value)
    assert said.startswith(
        "3 head files, heads/a.safetensors, heads/b.safetensors, heads/c.safetensors, were"
    )
    assert (
        "(a.safetensors: the weights its encoder_probe metadata records differ; b.safetensors, "
        "c.safetensors: the LayerNorm weights their encoder_probe_vectors metadata records differ: a "
        "fine-tune?)" in said
    )
    assert "a task for each of a, b, c)" in said


def test_an_encoder_file_unlike_the_encoder_in_memory_is_refused_and_nothing_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe the heads record is taken in memory; the file is save_pretrained's: were they apart
    (weights converted as they are saved), load would refuse every head the save wrote."""
    model, other = build_tiny_model(), build_tiny_model(seed=1)
    monkeypatch.setattr(model.encoder, "save_pretrained", other.encoder.save_pretrained)
    with pytest.raises(CheckpointError, match="holds other weights than the encoder saved"):
        save_checkpoint(tmp_path / "n1", model, build_tiny_tokenizer(), _meta(model))
    assert not (tmp_path / "n1").exists()


def test_a_failed_save_never_takes_what_another_save_wrote_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two saves into new checkpoints under one new parent: the one that fails had removed the parent it
    found missing, whole, and the other's finished checkpoint with it. It takes away what it wrote, and
    directories only where they are left empty."""
    checkpoint = load_checkpoint(build_tiny_checkpoint(tmp_path / "a"))
    real = checkpoint.model.encoder.save_pretrained
    sibling = tmp_path / "runs" / "new" / "b"

    def saved_meanwhile(directory: Path, **kwargs: Any) -> None:
        other = load_checkpoint(tmp_path / "a")  # another process's save, while this one writes
        save_checkpoint(sibling, other.model, other.tokenizer, other.meta)
        real(directory, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.model.encoder, "save_pretrained", saved_meanwhile)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(
            tmp_path / "runs" / "new" / "a", checkpoint.model, checkpoint.tokenizer, checkpoint.meta
        )
    assert [p.name for p in (tmp_path / "runs" / "new").iterdir()] == ["b"]
    load_checkpoint(sibling)  # whole


def test_a_path_through_a_directory_the_save_would_make_is_refused(tmp_path: Path) -> None:
    """`fresh/../existing/ckpt` names `existing` by a way through `fresh`, which the save makes first:
    it had been left holding heads/.pending.lock alone after a failure. Refused before anything is made;
    `..` after a directory that exists is the kernel's to follow."""
    checkpoint = load_checkpoint(build_tiny_checkpoint(tmp_path / "a"))
    (tmp_path / "existing").mkdir()
    for root in (tmp_path / "fresh" / ".." / "existing" / "c1", tmp_path / "existing" / "sub" / ".." / "c2"):
        with pytest.raises(CheckpointError, match=r"'\.\.' after .* which does not exist"):
            save_checkpoint(root, checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "existing"]
    assert list((tmp_path / "existing").iterdir()) == []
    through = tmp_path / "existing" / ".." / "c3"
    save_checkpoint(through, checkpoint.model, checkpoint.tokenizer, checkpoint.meta)
    load_checkpoint(tmp_path / "c3")
