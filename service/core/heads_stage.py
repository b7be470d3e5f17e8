"""The heads stage: how `save_heads` replaces htmllm.json and head files together, and how readers read.

`save_heads` changes two things a reader reads together: htmllm.json (the heads' labels and metrics) and
the head files in heads/. Written in place, a kill between them left heads htmllm.json did not list, or a
replaced head's new weights under its old labels. So the new files are staged in heads/.pending/,
htmllm.json last (its arrival there is the commit point), and then moved into place. What this module
guarantees:

- a kill at any point leaves the old checkpoint or the new one: a stage without htmllm.json is ignored
  (and discarded by the next save); a committed one is completed by the next reader or save;
- saves and readers completing a stage take turns on one flock (heads/.pending.lock), so no reader moves
  a save's uncommitted weights under the old labels, and two saves never mix; the lock file exists only
  while the lock is held (its holder removes it), so a finished checkpoint holds no file of the stage;
- a stage may also name head files to remove (heads/.pending/removed.json, written before its
  htmllm.json): how a head is removed or renamed (`service.core.head_files.remove_head`, `rename_head`)
  as atomically as heads are added;
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
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from service.core.atomic_files import replaced_atomically
from service.core.errors import CheckpointError

META_FILE = "htmllm.json"
HEADS_DIR = "heads"
# Where save_heads stages new head files and htmllm.json; htmllm.json written there is its commit point.
PENDING_DIR = ".pending"
# In heads/: the flock every save_heads and every completion of a stage holds (see heads_lock); removed
# by its holder when it lets go, so it is left behind only by a process killed holding it.
LOCK_FILE = ".pending.lock"
# In heads/.pending/: a JSON list of the head names whose files the stage removes (`commit_locked`).
REMOVED_FILE = "removed.json"
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


# Per thread, the heads locks it holds (`_held_locks`), so that `heads_lock` is re-entrant.
_held = threading.local()


@contextlib.contextmanager
def heads_lock(root: Path) -> Iterator[None]:
    """The checkpoint's heads/.pending.lock, held exclusively (flock: threads and processes alike).

    Every `save_heads` holds it for its whole save, and a reader completing a committed stage for the
    whole completion: a reader that moved files and removed heads/.pending while a save reused that
    path had put the save's uncommitted new weights under the old labels. Readers of a checkpoint
    without a committed stage never take it (nor need write access). Raises OSError where the
    directory cannot be written.

    Re-entrant within a thread: `htmllm heads train` holds it over `save_heads` (which takes it again)
    and the rewrite of the model card, so that the card describes the heads of the save before it
    (a second flock of the same file, on another descriptor, had waited on the first for ever).

    The lock file is removed by the holder before it lets go, so a checkpoint holds it only while a
    lock is held (a left lock file was copied by `cp -r` and image builds into every copy). Removing a
    lock file races with a process that opened it and waits: it then locks a file no longer there,
    while a third creates a new one and locks that. So each taker, once it holds the lock, checks that
    the file it locked is still the one at the path, and takes it again where it is not; the holder
    removes the file only while it is the one it locked. A file left by a process killed holding it is
    taken and removed by the next holder; no reader reads it (`checkpoint_fingerprint` hashes head
    files and htmllm.json alone; `copy_checkpoint` copies no stage or lock file).
    """
    heads_dir = root / HEADS_DIR
    heads_dir.mkdir(exist_ok=True)
    path = heads_dir / LOCK_FILE
    held = _held_locks()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    key = _identity(os.fstat(fd))
    if key in held:  # this thread holds it already, through another descriptor of the same file
        os.close(fd)
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    fd, key = _lock(path, fd)
    held[key] = 1
    try:
        yield
    finally:
        del held[key]
        try:
            if _identity(os.stat(path)) == key:  # not one a later holder made: see above
                os.unlink(path)
        except OSError:  # gone (a failed save_checkpoint removed it with its directory) or not ours to remove
            pass
        os.close(fd)  # releases the lock


def _held_locks() -> dict[tuple[int, int], int]:
    """This thread's heads locks: lock file (st_dev, st_ino) -> how many times it entered it."""
    locks: dict[tuple[int, int], int] | None = getattr(_held, "locks", None)
    if locks is None:
        locks = _held.locks = {}
    return locks


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _lock(path: Path, fd: int) -> tuple[int, tuple[int, int]]:
    """Lock `fd` (open on `path`), opening `path` again until the file locked is the one found there (the
    holder before may have removed it meanwhile): the descriptor and the file's identity."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            key = _identity(os.fstat(fd))
            try:
                current: tuple[int, int] | None = _identity(os.stat(path))
            except FileNotFoundError:
                current = None
        except BaseException:
            os.close(fd)
            raise
        if current == key:
            return fd, key
        os.close(fd)  # a file its holder removed: lock the one at the path now
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)


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
    """Move a committed stage into place; the caller holds `heads_lock`. The head files it removes go
    first, then the staged ones are moved in, then htmllm.json, so while htmllm.json is still staged
    every change left is still to be made (each is made again harmlessly: a reader killed halfway
    leaves a stage the next one completes)."""
    pending = committed_stage(root)
    if pending is None:  # none, or completed by the lock's previous holder
        return
    heads_dir = root / HEADS_DIR
    for name in _removed(pending):
        (heads_dir / f"{name}.safetensors").unlink(missing_ok=True)
    for staged in sorted(pending.glob("*.safetensors")):
        os.replace(staged, heads_dir / staged.name)
    os.replace(pending / META_FILE, root / META_FILE)
    shutil.rmtree(pending, ignore_errors=True)


def commit_locked(
    root: Path, meta_text: str, files: Mapping[str, bytes], removed: Collection[str] = ()
) -> None:
    """Stage and commit a change of the heads, then complete it; the caller holds `heads_lock` and has
    completed any stage committed before (`finish_locked`). `files`: head name -> the bytes of its new
    file; `removed`: heads whose files go (a head removed, or the old name of one renamed); `meta_text`:
    the new htmllm.json, written last: its arrival in the stage is the commit point."""
    pending = root / HEADS_DIR / PENDING_DIR
    shutil.rmtree(pending, ignore_errors=True)  # a stage never committed: its writer was killed
    pending.mkdir(parents=True)
    for name, data in files.items():
        with replaced_atomically(pending / f"{name}.safetensors", mode=FILE_MODE) as staged:
            staged.write_bytes(data)
    if removed:
        with replaced_atomically(pending / REMOVED_FILE, mode=FILE_MODE) as staged:
            staged.write_text(json.dumps(sorted(removed)), encoding="utf-8")
    with replaced_atomically(pending / META_FILE, mode=FILE_MODE) as staged:  # the commit point
        staged.write_text(meta_text, encoding="utf-8")
    finish_locked(root)


def _removed(pending: Path) -> list[str]:
    """The heads whose files a committed stage removes: none where it has no removed.json (every stage
    `save_heads` writes). Raises CheckpointError for a list that is not one of plain file names (a
    name such as `../config` must never make a reader unlink a file outside heads/), and for one naming
    a head the stage's own htmllm.json keeps: no stage this code writes does, and completing it had
    unlinked that head's weights for good, every later load failing on the missing file."""
    file = pending / REMOVED_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise unreadable(file, exc) from exc
    except ValueError as exc:  # not UTF-8
        raise CheckpointError(f"{file} cannot be read: {exc}") from exc
    try:
        names = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{file} cannot be read: {exc}") from exc
    if not isinstance(names, list) or not all(
        isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name
        for name in names
    ):
        raise CheckpointError(f"{file} is not a list of head names (a hand edit, or a corrupt file){_DROP}")
    kept = _staged_heads(pending)
    if kept is None or kept & set(names):
        keeps = "cannot be read" if kept is None else f"keeps {sorted(kept & set(names))}"
        raise CheckpointError(
            f"{file} removes heads its stage's {META_FILE} {keeps}: nothing was removed{_DROP}"
        )
    return names


# What a stage that cannot be completed leaves its owner to do: nothing of it is moved before its list.
_DROP = f"; delete {HEADS_DIR}/{PENDING_DIR} to keep the checkpoint as it was before the stage"


def _staged_heads(pending: Path) -> set[str] | None:
    """The head names a committed stage's htmllm.json lists, or None where it cannot be read as one."""
    try:
        meta = json.loads((pending / META_FILE).read_text(encoding="utf-8"))
        return {str(head["name"]) for head in meta.get("heads", [])}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


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
    the staged htmllm.json and head files take the place of those in heads/ and beside it, and the head
    files it removes are left out, which is the checkpoint its completion gives. Refusing had
    crash-looped every replica at once.
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
        removed = set(_removed(pending))
        kept = {name: file for name, file in _head_files(heads_dir).items() if name not in removed}
        return View(pending / META_FILE, kept | _head_files(pending))
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
