"""The heads stage: how `save_heads` replaces htmllm.json and head files together, and how readers read.

`save_heads` changes two things a reader reads together: htmllm.json (the heads' labels and metrics) and
the head files in heads/. Written in place, a kill between them left heads htmllm.json did not list, or a
replaced head's new weights under its old labels. So the new files are staged in heads/.pending/,
htmllm.json last (its arrival there is the commit point), and then moved into place. What this module
guarantees:

- a kill at any point leaves the old checkpoint or the new one: a stage without htmllm.json is ignored
  (and discarded by the next save); a committed one is completed by the next reader or save;
- saves and readers completing a stage take turns on one flock (heads/.pending.lock), so no reader moves
  a save's uncommitted weights under the old labels, and two saves never mix;
- readers of a checkpoint without a committed stage take no lock and need no write access; a lock-free
  read overtaken by a save (htmllm.json replaced meanwhile) reads again;
- on a read-only checkpoint (the Helm chart mounts models read-only) a committed stage is read through:
  its htmllm.json and head files take the place of those it would replace.

The checkpoint's format and strict loading are `service.core.checkpoint`'s; this module owns the names
of the files the stage governs and the error they raise, so that it imports nothing from there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from service.core.errors import CheckpointError

META_FILE = "htmllm.json"
HEADS_DIR = "heads"
# Where save_heads stages new head files and htmllm.json; htmllm.json written there is its commit point.
PENDING_DIR = ".pending"
# In heads/: the flock every save_heads and every completion of a stage holds (see heads_lock).
LOCK_FILE = ".pending.lock"
# mkstemp creates files 0600; a checkpoint is read by other users (a container's uid mounting it).
FILE_MODE = 0o644

logger = logging.getLogger(__name__)
# The committed stages read through (checkpoint, staged htmllm.json's mtime) that were warned about.
_warned_stages: set[tuple[str, int]] = set()


# Errors that mean "this process may not write here" (a read-only volume, another owner's files).
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_T = TypeVar("_T")
# How often a lock-free load is retried when a concurrent `save_heads` changed the heads meanwhile.
_LOAD_ATTEMPTS = 4


@contextlib.contextmanager
def heads_lock(root: Path) -> Iterator[None]:
    """The checkpoint's heads/.pending.lock, held exclusively (flock: threads and processes alike).

    Every `save_heads` holds it for its whole save, and a reader completing a committed stage for the
    whole completion: a reader that moved files and removed heads/.pending while a save reused that
    path had put the save's uncommitted new weights under the old labels. Readers of a checkpoint
    without a committed stage never take it (nor need write access). Raises OSError where the
    directory cannot be written.
    """
    heads_dir = root / HEADS_DIR
    heads_dir.mkdir(exist_ok=True)
    fd = os.open(heads_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def committed_stage(root: Path) -> Path | None:
    """heads/.pending when it holds a committed save (its htmllm.json written), else None.

    Raises CheckpointError where that cannot be told (heads/ not searchable by this user: a root-owned
    0700 directory on a volume another uid serves): `Path.is_file` raises there, and its PermissionError
    had ended the server's start in a traceback. Not None: a committed stage would then go unseen, and
    the old heads be read as the checkpoint."""
    pending = root / HEADS_DIR / PENDING_DIR
    try:
        committed = (pending / META_FILE).is_file()
    except OSError as exc:
        raise unreadable(pending / META_FILE, exc) from exc
    return pending if committed else None


def unreadable(file: Path, exc: OSError) -> CheckpointError:
    """The error for a checkpoint file this process may not read or look up.

    Said as the file system says it ("Permission denied"), naming the file, with what to do where that
    is the cause: a checkpoint written by another user with mode 0600 or 0700 cannot be served by the
    container's uid, and a reader's own wording had hidden that (safetensors reports EACCES as "No such
    file or directory"). Here, not in `service.core.checkpoint`, as the heads stage raises it too."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        reason += (
            f" (this process runs as uid {os.getuid()}: make the checkpoint readable to it, `chmod -R a+rX` "
            "its directory)"
        )
    return CheckpointError(f"{file} cannot be read: {reason}")


def finish_locked(root: Path) -> None:
    """Move a committed stage into place; the caller holds `heads_lock`. Head files go before
    htmllm.json, so while htmllm.json is still staged every head file left beside it is still to be
    moved (a reader killed halfway leaves a stage the next one completes)."""
    pending = committed_stage(root)
    if pending is None:  # none, or completed by the lock's previous holder
        return
    for staged in sorted(pending.glob("*.safetensors")):
        os.replace(staged, root / HEADS_DIR / staged.name)
    os.replace(pending / META_FILE, root / META_FILE)
    shutil.rmtree(pending, ignore_errors=True)


@dataclass(frozen=True)
class View:
    """The files a reader reads: htmllm.json and each head's file (name -> path). The checkpoint's own,
    or, where a committed stage cannot be completed (read-only), the staged ones in their place."""

    meta_file: Path
    head_files: dict[str, Path]


def _head_files(directory: Path) -> dict[str, Path]:
    return {file.stem: file for file in directory.glob("*.safetensors")}


def view(path: str | Path) -> View:
    """What a reader reads, after completing a committed `save_heads` stage where it can.

    Where it cannot (a read-only mount, as the Helm chart mounts models) the stage is read through:
    the staged htmllm.json and head files take the place of those in heads/ and beside it, which is the
    checkpoint its completion gives. Refusing had crash-looped every replica at once.
    """
    root = Path(path)
    heads_dir = root / HEADS_DIR
    pending = committed_stage(root)
    if pending is None:
        return View(root / META_FILE, _head_files(heads_dir))
    try:
        with heads_lock(root):
            finish_locked(root)
        return View(root / META_FILE, _head_files(heads_dir))
    except OSError as exc:
        if exc.errno not in _NOT_WRITABLE:
            raise CheckpointError(
                f"checkpoint {root}: an interrupted `save_heads` left {HEADS_DIR}/{PENDING_DIR}, and "
                f"completing it failed ({exc.strerror or exc}); move {HEADS_DIR}/{PENDING_DIR}/*.safetensors "
                f"into {HEADS_DIR}/ and then {HEADS_DIR}/{PENDING_DIR}/{META_FILE} over {META_FILE}"
            ) from exc
        reason = exc.strerror or str(exc)
    try:
        stamp = (str(root), (pending / META_FILE).stat().st_mtime_ns)
    except OSError as exc:
        raise CheckpointError(f"checkpoint {root}: cannot read {HEADS_DIR}/{PENDING_DIR}: {exc}") from exc
    if stamp not in _warned_stages:  # once per stage, not on every read of it
        _warned_stages.add(stamp)
        logger.warning(
            "checkpoint %s: a `save_heads` was committed but not finished (%s/%s), and it cannot be finished "
            "here (%s); reading the staged heads and %s through it. Load it once where it is writable.",
            root,
            HEADS_DIR,
            PENDING_DIR,
            reason,
            META_FILE,
        )
    try:
        return View(pending / META_FILE, _head_files(heads_dir) | _head_files(pending))
    except OSError as exc:
        raise CheckpointError(f"checkpoint {root}: cannot read {HEADS_DIR}/{PENDING_DIR}: {exc}") from exc


def _generation(root: Path) -> tuple[object, ...]:
    """What changes whenever a `save_heads` may be moving files: whether a committed stage exists, and
    htmllm.json's identity (every save replaces it by a new file). A lock-free load that sees the same
    generation before and after read no head file a concurrent save moved."""
    try:
        stat = (root / META_FILE).stat()
    except OSError:
        return (committed_stage(root) is not None, None)
    return (committed_stage(root) is not None, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)


def consistently(root: Path, read: Callable[[View], _T]) -> _T:
    """`read(view)` of a checkpoint no `save_heads` changed meanwhile, without a lock (readers of a
    checkpoint need no write access): retried when the generation moved while it read, since a save
    finishing then may have replaced a head file after its old htmllm.json was read (new weights under
    old labels), or moved a staged file away from a reader reading through the stage."""
    for _ in range(_LOAD_ATTEMPTS):
        before = _generation(root)
        seen = view(root)
        if _generation(root) != before:  # this reader completed a stage, or a save moved on: look again
            continue
        try:
            result = read(seen)
        except CheckpointError:
            if _generation(root) == before:
                raise
            continue
        if _generation(root) == before:
            return result
    raise CheckpointError(f"checkpoint {root} kept changing while it was read (heads being saved meanwhile)")


def finish_pending_heads(path: str | Path) -> None:
    """Complete a `save_heads` that was killed after its commit point (heads/.pending/htmllm.json
    written), so that the checkpoint is the new one. Every reader does this first (holding the heads
    lock while it does); where the checkpoint cannot be written, a warning is logged and readers read
    through the stage. A stage without htmllm.json is left alone (its writer may be running; the
    checkpoint is the old one, and the next `save_heads` discards it).
    """
    view(path)
