"""`unservable_heads`: which task heads of a checkpoint the service would refuse, decided as its loader
decides, with the checkpoint's shared parts (the encoder's weights above all) read once.

Loaded once per head, plus twice more, an evaluation of a checkpoint with N heads had read its encoder's
weights up to N+2 times before the first page was embedded.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import service.core.checkpoint as checkpoint_module
from model_training.evaluation.runner import unservable_heads
from service.core.checkpoint import WEIGHTS_FILE, load_checkpoint, read_meta
from service.core.errors import HtmllmError
from tests.factories.checkpoint import build_tiny_checkpoint

HEADS = ("page_type", "quality")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny checkpoints of the same shapes and other weights (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("unservable")
    build_tiny_checkpoint(root / "a", seed=0)
    build_tiny_checkpoint(root / "b", seed=1)
    return root


def _copy(sources: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sources / "a", ckpt)
    return ckpt


def _refusal(ckpt: Path, *, without_heads: list[str] | None = None) -> str | None:
    """Why the service's loader refuses `ckpt` (loaded without `without_heads`), or None."""
    try:
        load_checkpoint(ckpt, without_heads=without_heads or [])
    except HtmllmError as exc:
        return str(exc)
    return None


def _the_loaders_verdict(ckpt: Path) -> list[dict[str, str | None]]:
    """What the service's loader says of each head loaded as the checkpoint's only one: the oracle."""
    names = [spec.name for spec in read_meta(ckpt).heads]
    verdict: list[dict[str, str | None]] = []
    for name in names:
        reason = _refusal(ckpt, without_heads=[other for other in names if other != name])
        if reason is not None:
            verdict.append({"checkpoint": str(ckpt), "head": name, "reason": reason})
    return verdict


def _other_encoders_head(ckpt: Path, sources: Path, name: str) -> None:
    """The head file of the other checkpoint: the same head, fit on another encoder's embeddings."""
    shutil.copyfile(sources / "b" / "heads" / f"{name}.safetensors", ckpt / "heads" / f"{name}.safetensors")


def _nan_head(ckpt: Path, sources: Path, name: str) -> None:
    file = ckpt / "heads" / f"{name}.safetensors"
    with safe_open(str(file), framework="pt") as handle:
        metadata = dict(handle.metadata() or {})
    tensors = load_file(str(file))
    tensors["out.bias"] = torch.full_like(tensors["out.bias"], float("nan"))
    save_file(tensors, str(file), metadata)


def _corrupt_head(ckpt: Path, sources: Path, name: str) -> None:
    (ckpt / "heads" / f"{name}.safetensors").write_bytes(b"not a safetensors file")


def _missing_head(ckpt: Path, sources: Path, name: str) -> None:
    (ckpt / "heads" / f"{name}.safetensors").unlink()


def _swapped_head(ckpt: Path, sources: Path, name: str) -> None:
    """Another head's file under this head's name (its metadata names the other head)."""
    other = next(head for head in HEADS if head != name)
    shutil.copyfile(ckpt / "heads" / f"{other}.safetensors", ckpt / "heads" / f"{name}.safetensors")


BREAKAGES: dict[str, Callable[[Path, Path, str], None]] = {
    "fit on another encoder": _other_encoders_head,
    "nan weights": _nan_head,
    "not safetensors": _corrupt_head,
    "missing": _missing_head,
    "another head's file": _swapped_head,
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_broken_head_is_named_as_the_loader_refuses_it(
    sources: Path, tmp_path: Path, breakage: str
) -> None:
    ckpt = _copy(sources, tmp_path)
    BREAKAGES[breakage](ckpt, sources, "page_type")
    found = unservable_heads(ckpt)
    assert [entry["head"] for entry in found] == ["page_type"]
    assert found == _the_loaders_verdict(ckpt)


def test_two_heads_broken_apart_are_both_named(sources: Path, tmp_path: Path) -> None:
    ckpt = _copy(sources, tmp_path)
    _other_encoders_head(ckpt, sources, "page_type")
    _corrupt_head(ckpt, sources, "quality")
    found = unservable_heads(ckpt)
    assert [entry["head"] for entry in found] == ["page_type", "quality"]
    assert found == _the_loaders_verdict(ckpt)


def test_a_sound_checkpoint_has_none(sources: Path, tmp_path: Path) -> None:
    ckpt = _copy(sources, tmp_path)
    assert unservable_heads(ckpt) == [] == _the_loaders_verdict(ckpt)
    load_checkpoint(ckpt)  # and the service loads it whole


def test_what_the_heads_share_failing_is_the_checkpoints_reason(sources: Path, tmp_path: Path) -> None:
    """A head file htmllm.json does not list, or an encoder that does not load, is no one head's fault:
    said once, with head None, as the loader says it, and not blamed on a broken head beside it."""
    ckpt = _copy(sources, tmp_path)
    shutil.copyfile(ckpt / "heads" / "quality.safetensors", ckpt / "heads" / "spare.safetensors")
    (entry,) = unservable_heads(ckpt)
    # The server's own words, which name the heads htmllm.json lists (a load without them lists none).
    assert entry == {"checkpoint": str(ckpt), "head": None, "reason": _refusal(ckpt)}
    assert "spare.safetensors" in str(entry["reason"]) and "'page_type'" in str(entry["reason"])

    ckpt = _copy(sources, tmp_path / "nan")
    weights = load_file(str(ckpt / WEIGHTS_FILE))
    first = sorted(weights)[0]
    weights[first] = torch.full_like(weights[first], float("nan"))
    save_file(weights, str(ckpt / WEIGHTS_FILE), {"format": "pt"})
    _corrupt_head(ckpt, sources, "page_type")  # what a whole load fails on first: not the reason
    (entry,) = unservable_heads(ckpt)
    assert entry == {
        "checkpoint": str(ckpt),
        "head": None,
        "reason": _refusal(ckpt, without_heads=list(HEADS)),
    }
    assert "NaN" in str(entry["reason"])


@pytest.fixture
def encoder_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of every model.safetensors the checkpoint module reads whole (its weights loaded)."""
    reads: list[str] = []
    real = checkpoint_module.load_file

    def counted(filename: Any, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        if Path(filename).name == WEIGHTS_FILE:
            reads.append(str(filename))
        return real(filename, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "load_file", counted)
    yield reads


def test_the_encoders_weights_are_read_once_however_many_heads_fail(
    sources: Path, tmp_path: Path, encoder_reads: list[str]
) -> None:
    """Both heads fit on another encoder: each is refused only after its encoder check, which had taken
    a load of the whole checkpoint per head, the encoder's weights read four times for two heads."""
    ckpt = _copy(sources, tmp_path)
    for name in HEADS:
        _other_encoders_head(ckpt, sources, name)
    found = unservable_heads(ckpt)
    assert [entry["head"] for entry in found] == list(HEADS)
    assert len(encoder_reads) == 1
    encoder_reads.clear()
    sound = _copy(sources, tmp_path / "sound")
    assert unservable_heads(sound) == []
    assert len(encoder_reads) == 1
