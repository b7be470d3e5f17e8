"""Removing and renaming a checkpoint's heads (`remove_head`, `rename_head`): htmllm.json and heads/
changed as one commit through the heads stage, never a mix after a kill, read through on a read-only
mount; refusals typed, and leaving the checkpoint as it was."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from service.core.checkpoint import (
    ENCODER_PROBE_KEY,
    HEAD_NAME_KEY,
    CheckpointError,
    checkpoint_fingerprint,
    load_checkpoint,
    loaded_probe,
    read_meta,
    save_heads,
    set_loaded_probe,
)
from service.core.errors import ErrorCode
from service.core.head_files import remove_head, rename_head
from service.core.modeling import TaskHead

_FORMAT_FILES = ["config.json", "heads", "htmllm.json", "model.safetensors", "tokenizer.json"]


class _Killed(BaseException):
    """A kill, as far as the code under test can tell: nothing catches it, nothing after it runs."""


def _files(root: Path) -> list[str]:
    return sorted(str(file.relative_to(root)) for file in root.rglob("*"))


def _metadata(file: Path) -> dict[str, str]:
    with safe_open(str(file), framework="pt") as handle:
        return dict(handle.metadata() or {})


def _state(path: Path) -> tuple[list[tuple[str, list[str]]], dict[str, dict[str, torch.Tensor]]]:
    """(name, labels) of each head in htmllm.json's order, and each head's weights, as a load reads them."""
    loaded = load_checkpoint(path)
    specs = [(spec.name, spec.labels) for spec in loaded.meta.heads]
    return specs, {name: head.state_dict() for name, head in loaded.model.heads.items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_removing_a_head_takes_its_entry_and_its_file(ckpt: Path) -> None:
    specs, states = _state(ckpt)
    remove_head(ckpt, "quality")
    after_specs, after_states = _state(ckpt)
    assert after_specs == [specs[0]] and _same(after_states["page_type"], states["page_type"])
    assert _files(ckpt) == sorted([*_FORMAT_FILES, "heads/page_type.safetensors"])  # no stage, no lock


def test_renaming_a_head_keeps_its_weights_labels_metrics_and_place(ckpt: Path, tmp_path: Path) -> None:
    """The file's metadata names its head (load refuses a file naming another): rewritten with the new
    name, the rest of the file as it was, so that it is the file a save under that name writes, and a
    rename back gives the checkpoint's fingerprint back."""
    fingerprint = checkpoint_fingerprint(ckpt)
    before = read_meta(ckpt).heads
    old_metadata = _metadata(ckpt / "heads" / "page_type.safetensors")
    _, states = _state(ckpt)
    rename_head(ckpt, "page_type", "kind")
    after = read_meta(ckpt).heads
    assert [spec.name for spec in after] == ["kind", "quality"]
    assert (after[0].kind, after[0].labels, after[0].hidden, after[0].metrics) == (
        before[0].kind,
        before[0].labels,
        before[0].hidden,
        before[0].metrics,
    )
    assert _same(_state(ckpt)[1]["kind"], states["page_type"])
    assert _metadata(ckpt / "heads" / "kind.safetensors") == {**old_metadata, HEAD_NAME_KEY: "kind"}
    assert old_metadata[ENCODER_PROBE_KEY]  # the probe of the encoder it was fit on, kept
    assert _files(ckpt) == sorted([*_FORMAT_FILES, "heads/kind.safetensors", "heads/quality.safetensors"])

    # The bytes a save of the same head under the new name writes (its probe as its file recorded it).
    saved = tmp_path / "saved"
    shutil.copytree(ckpt, saved)
    loaded = load_checkpoint(saved)
    head = loaded.model.heads["kind"]
    assert isinstance(head, TaskHead)
    again = TaskHead(after[0], loaded.meta.embedding_dim)
    again.load_state_dict(head.state_dict())
    set_loaded_probe(again, loaded_probe(head))
    save_heads(saved, {"kind": (after[0], again)})
    renamed = (ckpt / "heads" / "kind.safetensors").read_bytes()
    assert (saved / "heads" / "kind.safetensors").read_bytes() == renamed

    rename_head(ckpt, "kind", "page_type")
    assert checkpoint_fingerprint(ckpt) == fingerprint


_EDITS: dict[str, Callable[[Path], None]] = {
    "remove": lambda root: remove_head(root, "page_type"),
    "rename": lambda root: rename_head(root, "page_type", "kind"),
}


@pytest.mark.parametrize("edit", sorted(_EDITS))
def test_an_edit_killed_at_any_write_leaves_the_old_or_the_new_checkpoint(
    edit: str, ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By hand (htmllm.json first, or the file first) a kill between the two left a checkpoint load
    refuses: a head file htmllm.json does not list, or a listed head without its file."""
    old = _state(ckpt)
    reference = tmp_path / "reference"
    shutil.copytree(ckpt, reference)
    _EDITS[edit](reference)
    new = _state(reference)
    outcomes = []
    for writes in range(10):
        work = tmp_path / f"killed-{writes}"
        shutil.copytree(ckpt, work)
        with monkeypatch.context() as patch:
            _kill_after(patch, writes)
            try:
                _EDITS[edit](work)
                finished = True
            except _Killed:
                finished = False
        specs, states = _state(work)  # completes a committed stage
        expected = new if specs == new[0] else old
        assert specs == expected[0], writes
        assert all(_same(states[name], expected[1][name]) for name in states), writes
        assert not (work / "heads" / ".pending" / "htmllm.json").exists()  # none committed left
        outcomes.append("new" if expected is new else "old")
        if finished:
            break
    assert outcomes[0] == "old" and outcomes[-1] == "new" and finished, outcomes


def _kill_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """Make the `writes`+1-th rename or unlink of a file (each atomic write ends in a rename; a head
    file goes by an unlink) kill the process."""
    done = [0]

    def killing(real: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:
            if done[0] >= writes:
                raise _Killed
            done[0] += 1
            real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "replace", killing(os.replace))
    real_unlink = os.unlink
    killing_unlink = killing(real_unlink)

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith("page_type.safetensors"):  # a head file, not a temporary's clean-up
            killing_unlink(path, *args, **kwargs)
        else:
            real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)


def _refused(code: ErrorCode, edit: Callable[[], None], match: str) -> None:
    with pytest.raises(CheckpointError, match=match) as refused:
        edit()
    assert refused.value.code == code


def test_unknown_heads_and_taken_or_refused_names_are_refused_and_nothing_changes(ckpt: Path) -> None:
    fingerprint, files = checkpoint_fingerprint(ckpt), _files(ckpt)
    shutil.copyfile(ckpt / "heads" / "quality.safetensors", ckpt / "heads" / "stray.safetensors")
    unknown, invalid = ErrorCode.UNKNOWN_HEAD, ErrorCode.VALIDATION
    _refused(
        unknown, lambda: remove_head(ckpt, "topic"), r"has no head 'topic' \(its heads: page_type, quality"
    )
    _refused(unknown, lambda: rename_head(ckpt, "topic", "kind"), "has no head 'topic'")
    _refused(unknown, lambda: rename_head(ckpt, "stray", "kind"), "has no head 'stray'")  # unlisted
    _refused(invalid, lambda: rename_head(ckpt, "quality", "page_type"), "has a head 'page_type' already")
    # Its own name: "remove it first" had advised removing the head being renamed.
    _refused(invalid, lambda: rename_head(ckpt, "quality", "quality"), "is called so already")
    # A name only a case apart from a head's: one file on a case-insensitive file system.
    _refused(invalid, lambda: rename_head(ckpt, "quality", "Page_Type"), "differs from head 'page_type' only")
    _refused(invalid, lambda: rename_head(ckpt, "quality", "Quality"), "differs from head 'quality' only")
    # Past a file name's length: HeadSpec's rule, which had been a traceback from deep inside.
    _refused(invalid, lambda: rename_head(ckpt, "quality", "x" * 201), "at most 200 characters")
    _refused(invalid, lambda: rename_head(ckpt, "quality", "stray"), "has a head 'stray' already")
    _refused(invalid, lambda: rename_head(ckpt, "quality", "q.v2"), "ASCII letters")
    _refused(invalid, lambda: rename_head(ckpt, "quality", "embedding"), "column 'embedding'")
    (ckpt / "heads" / "stray.safetensors").unlink()
    assert checkpoint_fingerprint(ckpt) == fingerprint and _files(ckpt) == files
    _refused(ErrorCode.CHECKPOINT_INVALID, lambda: remove_head(ckpt / "nothing", "quality"), "is missing")
    assert not (ckpt / "nothing").exists()


def test_a_head_that_no_longer_loads_is_removed_but_not_renamed(ckpt: Path) -> None:
    """A head file copied over another's is refused by load, whose error sends the user to remove it:
    removing reads no head file. Renaming it would launder it into one load accepts: refused."""
    shutil.copyfile(ckpt / "heads" / "page_type.safetensors", ckpt / "heads" / "quality.safetensors")
    with pytest.raises(CheckpointError, match=r"holds head 'page_type'.*`htmllm heads remove`"):
        load_checkpoint(ckpt)
    fingerprint = checkpoint_fingerprint(ckpt)
    _refused(
        ErrorCode.CHECKPOINT_INVALID, lambda: rename_head(ckpt, "quality", "q"), "holds head 'page_type'"
    )
    assert checkpoint_fingerprint(ckpt) == fingerprint
    remove_head(ckpt, "quality")
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type"]


def test_a_head_file_htmllm_json_does_not_list_is_removed(ckpt: Path) -> None:
    """Load refuses it ("list them there or remove the files"): `remove` takes it away, htmllm.json
    kept as it was."""
    meta = (ckpt / "htmllm.json").read_text(encoding="utf-8")
    shutil.copyfile(ckpt / "heads" / "quality.safetensors", ckpt / "heads" / "stray.safetensors")
    with pytest.raises(CheckpointError, match=r"stray\.safetensors that htmllm\.json does not list"):
        load_checkpoint(ckpt)
    remove_head(ckpt, "stray")
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type", "quality"]
    assert (ckpt / "htmllm.json").read_text(encoding="utf-8") == meta


def test_a_read_only_checkpoint_with_a_committed_removal_is_read_without_the_head(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal killed after its commit, on a mount that cannot be written (the lock file cannot be
    made): read through, the head file it removes is left out, as its completion would leave it, rather
    than refused as a head htmllm.json does not list."""
    finished = tmp_path / "finished"
    shutil.copytree(ckpt, finished)
    remove_head(finished, "page_type")
    with monkeypatch.context() as patch:
        _kill_after(patch, 2)  # removed.json and htmllm.json staged; the head file not yet removed
        with pytest.raises(_Killed):
            remove_head(ckpt, "page_type")
    assert (ckpt / "heads" / "page_type.safetensors").is_file()
    real_open = os.open

    def open_read_only(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and Path(file).is_relative_to(ckpt):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(file, flags, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", open_read_only)
        assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["quality"]
        assert checkpoint_fingerprint(ckpt) == checkpoint_fingerprint(finished)
    assert (ckpt / "heads" / ".pending" / "htmllm.json").is_file()  # read through, not completed
    load_checkpoint(ckpt)  # writable again: completed
    assert _files(ckpt) == _files(finished)


def test_a_stage_naming_a_file_outside_heads_is_refused_and_removes_nothing(ckpt: Path) -> None:
    """removed.json is written by `commit_locked` alone; a hand-made one naming `../model` must not make
    every reader unlink the encoder's weights."""
    pending = ckpt / "heads" / ".pending"
    pending.mkdir()
    (pending / "removed.json").write_text(json.dumps(["../model"]), encoding="utf-8")
    shutil.copyfile(ckpt / "htmllm.json", pending / "htmllm.json")
    with pytest.raises(CheckpointError, match=r"removed\.json is not a list of head names"):
        load_checkpoint(ckpt)
    assert (ckpt / "model.safetensors").is_file()


def test_a_stage_removing_a_head_its_own_htmllm_json_keeps_is_refused_and_removes_nothing(ckpt: Path) -> None:
    """Completing it had unlinked the head's weights for good: every later load failed on the file."""
    pending = ckpt / "heads" / ".pending"
    pending.mkdir()
    shutil.copyfile(ckpt / "htmllm.json", pending / "htmllm.json")
    (pending / "removed.json").write_text(json.dumps(["quality"]), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"removes heads its stage's htmllm\.json keeps \['quality'\]"):
        load_checkpoint(ckpt)
    assert (ckpt / "heads" / "quality.safetensors").is_file()
    shutil.rmtree(pending)  # what the message says to do
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type", "quality"]


def test_a_head_saved_a_case_apart_from_another_is_refused(ckpt: Path) -> None:
    """`Page_Type` beside `page_type`: one file on a case-insensitive file system (macOS, a Windows share),
    so a copy there would lose one head. `heads rename` refused it; a save had not."""
    meta = read_meta(ckpt)
    spec = dataclasses.replace(meta.heads[0], name="Page_Type")
    fingerprint = checkpoint_fingerprint(ckpt)
    with pytest.raises(CheckpointError, match="'page_type' and 'Page_Type' differ only in case"):
        save_heads(ckpt, {spec.name: (spec, TaskHead(spec, meta.embedding_dim))})
    assert checkpoint_fingerprint(ckpt) == fingerprint
    # Replacing the head under its own name is no clash.
    same = meta.heads[0]
    save_heads(ckpt, {same.name: (same, TaskHead(same, meta.embedding_dim))})
