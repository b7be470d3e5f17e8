"""A directory of pages: its one walk (`list_directory`: symlinked directories followed, each directory
once, hidden names left out, what cannot be looked at kept in its place), which of its files are pages
(`directory_page_files`), and its manifests (`corpus_manifest`, the one read; `unused_manifests`, names
a manifest may have been given that are not read).

Split out of `service.core.pages`, which reads a directory's pages through these and re-exports the
public names: the bulk commands' input identity walks a directory with the same `list_directory`, so a
run's pages and its identity see the same files.
"""

from __future__ import annotations

import errno
import heapq
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from service.core.page_files import HTML_SUFFIXES, WARC_SUFFIXES, source_mode
from service.core.page_row import PageSourceError, PageUnreadableError

# A corpus directory's manifest, by its one name, or gzipped as JSONL is read elsewhere; and the names
# of a manifest that is not read (`unused_manifests`): another case, another JSONL suffix, compressed.
MANIFEST_NAMES = ("manifest.jsonl", "manifest.jsonl.gz")
_MANIFEST_LIKE = re.compile(r"manifest\.(?:jsonl|ndjson|jsonlines)(?:\.[a-z0-9]+)?", re.IGNORECASE)


class Listed(NamedTuple):
    """One file of a directory of pages (`list_directory`), or what could not be looked at there."""

    path: Path  # as reached from the directory listed, through any symlinked directory
    # Why it could not be looked at (a directory that cannot be listed, an entry that cannot be looked
    # at): its pages are unknown, so it is a row of its own (`input_unreadable`), never skipped.
    problem: str | None = None
    directory: bool = False  # `problem` is a directory's, which cannot be listed


# Told what an entry of a directory of pages is, by its real location: the real path of the directory
# it is in (every symlink above it resolved), joined with its name. True: the entry is left out, as if
# it were not there (the bulk commands' own output, parts and temporaries, `resume_state.own_files`).
Skip = Callable[[Path], bool]


def list_directory(
    top: Path, skip: Skip | None = None, passed_over: list[Path] | None = None
) -> list[Listed]:
    """Every file under `top`, in the order it is read (sorted as paths: `a/b.html` before `a.html`),
    with what could not be looked at in its place; the one walk of a directory of pages, for its pages
    and for the bulk commands' input identity (`resume_state.input_identity`), so both see the same.

    Each directory is walked once, wherever links lead to it: its own subdirectories first, then those a
    symlink leads to, by their paths, so which path names a page does not depend on the file system's
    order. A symlink to a directory walked already (a link back up, a second link to one directory, a
    ladder of links that had made 65,535 pages of 16 files) is not followed again; one to another
    directory than those it is in (a second way to the same pages, where a link back up is a cycle, as
    ordinary as `..`) goes in `passed_over`, when given, for the commands to count. A dangling symlink
    counts as a file: one named
    as a page is read, and so becomes an `input_unreadable` row, where skipped its page was lost without a
    word. Hidden names (`.git/`, a macOS `._a.html` resource fork) and `__MACOSX/` (the resource forks of a
    zip made on a Mac) are no part of it (`hidden`): read as pages, resource forks were binary noise. A
    subdirectory that cannot be listed (permission denied, EIO) and an entry that cannot be looked at are
    `Listed` with a `problem`: `Path.rglob` passed over them in silence, its pages missing from a run that
    ended with status 0. `top` itself that cannot be listed raises `PageUnreadableError`.
    """
    try:
        top_stat = top.stat()
    except OSError as exc:
        raise PageUnreadableError(f"page source {top} cannot be read: {exc.strerror or exc}") from exc
    found: list[Listed] = []
    walked: set[tuple[int, int]] = set()  # the (device, inode) of every directory walked
    # (symlinks followed to reach it, the directory, its real path, its (device, inode), those of the
    # directories its path is in), taken fewest links first, then by path: a directory's own tree
    # before any link into it. (No two have one path, so the sets are never compared.)
    root = (top_stat.st_dev, top_stat.st_ino)
    queue = [(0, top, Path(os.path.realpath(top)), root, frozenset[tuple[int, int]]())]
    while queue:
        links, directory, real, key, ancestors = heapq.heappop(queue)
        if key in walked:
            if passed_over is not None and key not in ancestors:  # (a link back up: a cycle, no news)
                passed_over.append(directory)
            continue
        walked.add(key)
        try:
            with os.scandir(directory) as scan:
                entries = list(scan)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if directory == top:
                raise PageUnreadableError(f"page source {top} cannot be read: {why}") from exc
            why = f"cannot list the directory {directory}: {why}; its pages were not read"
            found.append(Listed(directory, why, directory=True))
            continue
        for entry in entries:
            path = directory / entry.name
            if hidden(entry.name) or (skip is not None and skip(real / entry.name)):
                continue
            try:
                if entry.is_dir():  # through a symlink too
                    st = entry.stat()  # the directory's, as `entry.is_dir` followed the link
                    inner_key, inside = (st.st_dev, st.st_ino), ancestors | {key}
                    if entry.is_symlink():
                        inner = (links + 1, path, Path(os.path.realpath(path)), inner_key, inside)
                    else:
                        inner = (links, path, real / entry.name, inner_key, inside)
                    heapq.heappush(queue, inner)
                elif entry.is_file() or (entry.is_symlink() and not os.path.exists(path)):
                    found.append(Listed(path))  # a file, or a dangling symlink
            except OSError as exc:
                if entry.is_symlink() and exc.errno == errno.ELOOP:
                    found.append(Listed(path))  # a link to itself: dangling, as `Path.exists` says
                else:  # EACCES (in a directory readable but not searchable), EIO
                    found.append(Listed(path, f"cannot look at {path}: {exc.strerror or exc}"))
    found.sort(key=lambda listed: listed.path)
    if passed_over is not None:
        passed_over.sort()
    return found


def hidden_page_files(top: Path, most: int) -> list[Path]:
    """Up to `most` files under `top` that `list_directory` leaves out as hidden (`hidden`: under `.site/`,
    `.a.html`, `__MACOSX/`) and whose names a page or WARC file has, in walk order; for the refusal of a
    directory with no other pages, which had said it held no .html file. Symlinked directories are not
    followed: a cheap look for the message, not a walk of pages."""
    found: list[Path] = []
    for directory, subdirectories, files in os.walk(top):
        subdirectories.sort()
        in_hidden = any(hidden(part) for part in Path(directory).relative_to(top).parts)
        for name in sorted(files):
            if (in_hidden or hidden(name)) and name.lower().endswith(HTML_SUFFIXES + WARC_SUFFIXES):
                found.append(Path(directory) / name)
                if len(found) >= most:
                    return found
    return found


def hidden(name: str) -> bool:
    """Whether a directory of pages leaves a file or directory of this name out (`list_directory`): a
    hidden name (`.git`, `.DS_Store`, macOS's `._a.html` AppleDouble files) or `__MACOSX`, where a zip
    made on a Mac keeps such files."""
    return name.startswith(".") or name == "__MACOSX"


def directory_page_files(path: Path, skip: Skip | None) -> tuple[list[Listed], list[Path]]:
    """A directory's HTML and WARC files, in the order they are read, with what could not be looked at
    in its place (each a row); and all its files."""
    listed = list_directory(path, skip)
    page_files = [
        entry
        for entry in listed
        if entry.problem is not None or entry.path.name.lower().endswith(HTML_SUFFIXES + WARC_SUFFIXES)
    ]
    return page_files, [entry.path for entry in listed if entry.problem is None]


def corpus_manifest(directory: Path) -> Path | None:
    """The manifest of a corpus directory, `manifest.jsonl`, else `manifest.jsonl.gz`; None for a
    directory with neither, read as a directory of pages. One that is there but cannot be read (a
    dangling symlink: a corpus whose manifest lives on a volume not mounted; not a file) refuses the
    source: read as a directory of pages, its ids had become file paths, its urls null, its rows'
    encodings ignored and the pages it names elsewhere lost, in a run that ended with status 0. Other
    names a manifest may be given (`MANIFEST.jsonl`) are not read: `unused_manifests` names them."""
    for name in MANIFEST_NAMES:
        manifest = directory / name
        mode = source_mode(manifest, directory)
        if mode is not None and stat.S_ISREG(mode):
            return manifest
        if mode is not None:
            raise PageSourceError(
                f"page source {directory} cannot be read: its manifest {manifest} is no file"
            )
        if manifest.is_symlink():
            raise PageUnreadableError(
                f"page source {directory} cannot be read: its manifest {manifest} is a symlink to "
                f"{os.readlink(manifest)}, which is gone"
            )
    return None


def unused_manifests(directory: Path) -> list[str]:
    """The names in `directory` (a directory of pages, without a manifest) that look like a corpus
    manifest but are none of `MANIFEST_NAMES`: `MANIFEST.jsonl`, `manifest.ndjson`, `manifest.jsonl.zst`,
    in sorted order, for the bulk commands to say that they were not used. A site's `manifest.json` (a web
    app's) is no such name. What cannot be listed names nothing."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(name for name in names if _MANIFEST_LIKE.fullmatch(name) and name not in MANIFEST_NAMES)
