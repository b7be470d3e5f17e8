"""Whether the code a server runs was replaced on disk under it (`CodeStamp`): what tells a fault that may
pass from one that only a restart cures, when no preprocessing process can start any more."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# The distribution whose code the stamp covers, and the package it falls back on where its metadata
# cannot be read (a source tree run without being installed).
DISTRIBUTION = "htmllm"
_OWN_PACKAGE = __name__.split(".")[0]
# What Python imports a module from: sources and compiled extensions (not bytecode, which it writes).
_CODE_SUFFIXES = tuple(importlib.machinery.SOURCE_SUFFIXES + importlib.machinery.EXTENSION_SUFFIXES)
# A directory changed this recently (or later) when it was listed may change again within its clock's
# granularity without its mtime moving (a coarse file-system clock): such a listing is not reused.
_RACY_NS = 2_000_000_000

_FileKey = tuple[int, int, int]  # inode, size, mtime (ns)


@dataclass(frozen=True)
class _Listing:
    """A directory's code files and subdirectories as listed, and its (inode, mtime) then: while both
    stay, no entry was added, removed or renamed in it, and the listing is reused (None: never)."""

    key: tuple[int, int] | None
    files: tuple[str, ...]
    dirs: tuple[str, ...]


class CodeStamp:
    """The module files of the code a server runs, as they were when it started (inode, size, mtime of
    each), so that it can tell when they were replaced under it: an in-place package upgrade changes
    nothing in the running process, but every process it starts from then on (a preprocessing process
    from a new forkserver, a model process, which import the code anew) runs the new code, and may fail
    to start against the old server, for ever. A restart is the cure, and `changed` says so.

    It covers every module file under `packages` (top-level package directories under `root`, their
    subpackages included; None: all of `root`), imported yet or not: a process started later may import
    one the server has not. Names are relative to `root`. A look (`changed`) costs one `stat` per file
    and directory: a directory is listed again only where its own stat changed (an entry added, removed
    or renamed in it), so a probe that calls it every few seconds walks no tree."""

    def __init__(self, root: Path, packages: Sequence[str] | None = None) -> None:
        self.root = root
        self._tops = [root] if packages is None else [root / package for package in packages]
        self._listings: dict[Path, _Listing] = {}
        self._taken = self._stat()

    @classmethod
    def of_running(cls) -> CodeStamp:
        """The stamp of the `htmllm` distribution's packages this process has imported: `service` (what
        each process the server starts imports), and the others loaded with it (`model_training`, the
        command line's plug-in, where it is installed). About 160 files: a millisecond of `stat`."""
        dirs = sorted(
            Path(file).parent
            for name in _distribution_packages()
            if (file := getattr(sys.modules.get(name), "__file__", None)) is not None
        )
        root = Path(os.path.commonpath([directory.parent for directory in dirs]))  # names: "service/..."
        return cls(root, [directory.relative_to(root).as_posix() for directory in dirs])

    @property
    def files(self) -> list[str]:
        """The files the stamp covers as it was taken (sorted, relative to `root`)."""
        return sorted(self._taken)

    def changed(self) -> list[str]:
        """The files replaced, added or removed since the stamp was taken (sorted); [] when none."""
        now = self._stat()
        return sorted(
            name for name in self._taken.keys() | now.keys() if self._taken.get(name) != now.get(name)
        )

    def _stat(self) -> dict[str, _FileKey]:
        found: dict[str, _FileKey] = {}
        listings: dict[Path, _Listing] = {}
        pending = list(self._tops)
        while pending:
            directory = pending.pop()
            try:
                stat = directory.stat()
            except OSError:  # removed: missing from the stamp, as it is from the code
                continue
            key = (stat.st_ino, stat.st_mtime_ns)
            listing = self._listings.get(directory)
            if listing is None or listing.key != key:
                listing = _listed(directory, key)
            listings[directory] = listing
            for name in listing.files:
                path = directory / name
                try:
                    file = path.stat()
                except OSError:  # removed while looked at
                    continue
                found[path.relative_to(self.root).as_posix()] = (file.st_ino, file.st_size, file.st_mtime_ns)
            pending.extend(directory / name for name in listing.dirs)
        self._listings = listings  # those of directories gone are dropped
        return found


def _listed(directory: Path, key: tuple[int, int]) -> _Listing:
    """`directory`'s code files and subdirectories (but bytecode caches), listed now."""
    listed_at = time.time_ns()
    files: list[str] = []
    dirs: list[str] = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__" and not entry.name.startswith("."):
                        dirs.append(entry.name)
                elif entry.name.endswith(_CODE_SUFFIXES):
                    files.append(entry.name)
    except OSError:  # removed (or unreadable) under the listing: nothing in it, and listed again next time
        return _Listing(None, (), ())
    fresh = key[1] >= listed_at - _RACY_NS
    return _Listing(None if fresh else key, tuple(files), tuple(dirs))


def _distribution_packages() -> list[str]:
    """The top-level packages of the `htmllm` distribution (its `top_level.txt`); this module's own
    where its metadata cannot be read."""
    try:
        listed = metadata.distribution(DISTRIBUTION).read_text("top_level.txt")
    except metadata.PackageNotFoundError:
        listed = None
    names = [] if listed is None else [line.strip() for line in listed.splitlines() if line.strip()]
    return names if _OWN_PACKAGE in names else [*names, _OWN_PACKAGE]
