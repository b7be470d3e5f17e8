"""Checkpoint files the serving user may not read: "Permission denied", naming the file, as a CheckpointError.

A checkpoint written by root with mode 0600 files or 0700 directories, mounted into a pod that runs as
uid 10001, had failed as `model.safetensors is not a valid safetensors file: FileNotFoundError: No such
file or directory` (safetensors reports EACCES as ENOENT), and a 0700 heads/ as an uncaught
PermissionError from `Path.is_file`. The tests run as root, for whom file modes are no obstacle, so the
file system's refusal is patched in where Python meets it (`Path.stat`, `Path.open`) and, for the reader
that misreports it, as safetensors reports it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from service.core import checkpoint
from service.core.checkpoint import (
    CheckpointError,
    checkpoint_fingerprint,
    load_checkpoint,
    read_meta,
)

DENIED = os.strerror(errno.EACCES)


def deny_reading(monkeypatch: pytest.MonkeyPatch, file: Path) -> None:
    """`file` as a 0600 file of another user: it can be looked up, not opened. safetensors, which opens
    it itself, says that it does not exist."""
    real_open = Path.open

    def path_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == file:
            raise PermissionError(errno.EACCES, DENIED, str(self))
        return real_open(self, *args, **kwargs)

    def misreported(real: Any) -> Any:
        def read(name: str, *args: Any, **kwargs: Any) -> Any:
            if Path(name) == file:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")
            return real(name, *args, **kwargs)

        return read

    monkeypatch.setattr(Path, "open", path_open)
    for reader in ("safe_open", "load_file"):  # the names checkpoint imported them as
        monkeypatch.setattr(checkpoint, reader, misreported(getattr(checkpoint, reader)))


def deny_searching(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """`directory` as a 0700 directory of another user: nothing inside it can even be looked up."""
    real_stat = Path.stat

    def stat(self: Path, *args: Any, **kwargs: Any) -> os.stat_result:
        if directory in self.parents:
            raise PermissionError(errno.EACCES, DENIED, str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)


def test_weights_the_user_may_not_read_are_said_to_be_so(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = ckpt / "model.safetensors"
    deny_reading(monkeypatch, weights)
    with pytest.raises(CheckpointError, match=f"{weights} cannot be read: {DENIED}") as raised:
        load_checkpoint(ckpt)
    assert f"uid {os.getuid()}" in str(raised.value) and "chmod -R a+rX" in str(raised.value)
    assert "No such file" not in str(raised.value)


@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer.json", "htmllm.json", "heads/quality.safetensors"]
)
def test_any_checkpoint_file_the_user_may_not_read_is_said_to_be_so(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """config.json had read as "not a valid ModernBERT config: PermissionError ..."."""
    deny_reading(monkeypatch, ckpt / name)
    with pytest.raises(CheckpointError, match=f"{ckpt / name} cannot be read: {DENIED} \\(this process"):
        load_checkpoint(ckpt)
    if name != "tokenizer.json":  # not fingerprinted: htmllm.json pins it by its hash
        with pytest.raises(CheckpointError, match=f"{ckpt / name} cannot be read: {DENIED}"):
            checkpoint_fingerprint(ckpt)


def test_a_heads_directory_the_user_may_not_search_is_a_checkpoint_error(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`committed_stage` asked `Path.is_file` about heads/.pending/htmllm.json, which raises EACCES in a
    directory that cannot be searched: a PermissionError traceback from every reader."""
    deny_searching(monkeypatch, ckpt / "heads")
    pending_meta = ckpt / "heads" / ".pending" / "htmllm.json"
    for read in (read_meta, load_checkpoint, checkpoint_fingerprint):
        with pytest.raises(CheckpointError, match=f"{pending_meta} cannot be read: {DENIED}"):
            read(ckpt)


def test_the_engine_without_the_weights_says_so_of_the_tokenizer_too(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The onnx backend and the inference process read the metadata and tokenizer alone
    (`loading._meta_and_tokenizer`): the tokenizer library had reported it in its own words."""
    from service.engine import loading

    deny_reading(monkeypatch, ckpt / "tokenizer.json")
    with pytest.raises(CheckpointError, match=f"{ckpt / 'tokenizer.json'} cannot be read: {DENIED}"):
        loading._meta_and_tokenizer(ckpt)
