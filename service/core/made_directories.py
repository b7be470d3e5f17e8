"""The directories a write makes for its output, and taking them away again when it fails.

A run or a save that fails having made its output directory (with its parents) had left it, empty or
holding a lock file, to pass for a finished output whoever lists it later. What it made is known before it
makes it (`directories_to_make`) and taken away afterwards only where it is left empty (`remove_empty`):
never a directory that existed, nor one another process has written into meanwhile. `model_training`'s
outputs and `service.core.checkpoint`'s saves share these rules, each with its own error type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from pathlib import Path


def missing_before_parent_step(path: Path) -> Path | None:
    """The directory that does not exist where `..` follows it in `path` (`new` in `new/../kept`), or
    None. Such a path names its directories by a way through one the write must make first: `kept` read
    as made by it (`new/../kept` did not exist before `new` did), and a failure removed an earlier
    output in it, or the directory itself, and left `new` behind. Callers refuse such a path."""
    prefix = Path(path.anchor)
    for part in path.parts[1:] if path.anchor else path.parts:
        if part == ".." and not prefix.exists():
            return prefix
        prefix = prefix / part
    return None


def directories_to_make(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist, deepest first: what `path.mkdir(parents=True)`
    makes (`missing_before_parent_step` must have found nothing in it)."""
    made: list[Path] = []
    for directory in (path, *path.parents):
        if directory.exists() or directory.is_symlink():
            break
        made.append(directory)
    return made


def remove_empty(made: Collection[Path]) -> None:
    """Remove the directories of `made` that are empty, deepest first (by their absolute paths, so that
    one named relative and absolute goes once, and in its place among the others); a directory that is
    not empty (something the write did not put there) is kept, and so are its parents, which hold it.
    (`absolute`, not `abspath`: `..` after a symlink is the kernel's to follow, not a name to drop.)"""
    absolute = {directory.absolute() for directory in made}
    for directory in sorted(absolute, key=lambda d: len(d.parts), reverse=True):
        with contextlib.suppress(OSError):  # gone already, or not empty: kept
            directory.rmdir()
