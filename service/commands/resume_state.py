"""The bookkeeping that lets a bulk command (`htmllm embed`, `htmllm extract`) resume after `kill -9`.

Beside `<output>` lives `<output>.parts/`: `lock` (held with `flock` for the whole run, so a second run on
the same output — a scheduler retrying a job whose first attempt still lives — is refused instead of
writing every document twice), `run.json` (the settings that determine the rows: a resume with others
would mix two configurations in one file) and the append-only `part-NNNNNN<suffix>` files, each holding
rows with their input position (`index`) and the page's `id`. Everything is written to a hidden
temporary name, fsynced and renamed, so a file is complete or absent; the temporaries of a killed run
(`.<name>.<8 random characters>.tmp`, up to the size of the output for a merge) are removed by the next
run. On restart the parts' indices are the done-set; the input is walked again, its done pages skipped
after a check that they are the pages that were done. When every page is done the command merges the
parts into `<output>` (a file format's own business, see `PartFormat`) and removes the directory.

A command brings its file format (`PartFormat`: Parquet for embed, JSONL for extract); the rules above
are the same for both and live only here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from service.core.atomic_files import replaced_atomically
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from service.core.pages import Page

RUN_FILE = "run.json"
LOCK_FILE = "lock"
# A part's name; temporaries start with "." and never match.
PART_PREFIX = "part-"
# mkstemp's names: the prefix, 8 characters of its alphabet, the suffix (none before this version).
_TEMP_NAME = r"\.{name}\.[a-z0-9_]{{8}}(\.tmp)?"


class RunStateError(HtmllmError):
    """The parts directory or the output is in a state this run must not touch."""

    code = ErrorCode.VALIDATION


class UnreadablePart(Exception):
    """A part file that cannot be read back (damaged from outside: parts are written whole)."""


class PartFormat(Protocol):
    """How one command's parts are written and read back. Rows are dicts with at least `index` (the
    input position) and `id` (the page's id, to tell a changed input on resume)."""

    suffix: str  # the parts' file-name suffix: ".parquet", ".jsonl"

    def write(self, rows: list[dict[str, Any]], path: Path) -> None:
        """Write `rows` to `path` (a temporary the caller fsyncs and renames)."""
        ...

    def indices(self, path: Path) -> npt.NDArray[np.int64]:
        """The part's indices, cheaply (for the merge's check); `UnreadablePart` if it cannot be read."""
        ...

    def keys(self, path: Path) -> tuple[Sequence[int], Sequence[str]]:
        """The part's indices and ids, in row order; `UnreadablePart` if it cannot be read."""
        ...


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def part_files(parts: Path, fmt: PartFormat) -> list[Path]:
    return sorted(parts.glob(f"{PART_PREFIX}*{fmt.suffix}"))


def holds_parts(parts: Path) -> bool:
    """Whether a part of any format exists: until one does, nothing depends on the settings."""
    return parts.is_dir() and any(parts.glob(f"{PART_PREFIX}*"))


def changed(settings: dict[str, Any], previous: dict[str, Any]) -> str:
    """The settings that differ, for a refusal's message."""
    return ", ".join(
        sorted(k for k in settings.keys() | previous.keys() if settings.get(k) != previous.get(k))
    )


def _write_json(settings: dict[str, Any], path: Path) -> None:
    with replaced_atomically(path, suffix=".tmp", durable=True) as tmp:
        tmp.write_text(json.dumps(settings, sort_keys=True), encoding="utf-8")


def clean_leftovers(output: Path, parts: Path) -> None:
    """Remove the temporaries of killed runs: a merge's beside the output, a part's or run.json's in
    `parts`. Only under the lock, since a live run's temporaries have the same names."""
    pattern = re.compile(_TEMP_NAME.format(name=re.escape(output.name)))
    for entry in output.parent.iterdir():
        if pattern.fullmatch(entry.name):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)  # a parts directory removed after its merge, cut short
            else:
                entry.unlink()
    for entry in parts.iterdir():
        if entry.name.startswith((f".{PART_PREFIX}", ".run.")):
            entry.unlink()


@contextlib.contextmanager
def run_lock(parts: Path, *, parents: bool = True) -> Iterator[None]:
    """Hold `parts/lock` for the whole run (creating `parts`, and its missing parent directories when
    `parents`); refuse when another run holds it.

    A run that finishes removes `parts` with the lock file in it, so a lock taken on a file no longer at
    that path is let go and taken again on the new directory.
    """
    for _ in range(5):
        parts.mkdir(parents=parents, exist_ok=True)
        lock = parts / LOCK_FILE
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "a process"
                raise RunStateError(
                    f"another run ({holder}) is writing {parts}; wait for it to end, or stop it first"
                ) from None
            try:
                current = os.stat(lock)
            except FileNotFoundError:
                continue
            if current.st_ino != os.fstat(fd).st_ino:
                continue
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n".encode(), 0)
            yield
            return
        finally:
            os.close(fd)
    raise RunStateError(f"{parts} keeps being removed while this run locks it; is another run finishing?")


def pin_settings(parts: Path, settings: dict[str, Any]) -> None:
    """Pin the run's settings in run.json; a resume with other settings is refused once a part exists
    (before that nothing depends on them, and a typo's run.json must not lock the output)."""
    pin = parts / RUN_FILE
    if pin.is_file() and holds_parts(parts):
        try:
            previous = json.loads(pin.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunStateError(f"{pin} cannot be read ({exc}); delete {parts} to start over") from exc
        if previous != settings:
            raise RunStateError(
                f"{parts} holds a run with other settings ({changed(settings, previous)}); "
                "delete it to start over"
            )
        return
    _write_json(settings, pin)


def done_set(parts: Path, fmt: PartFormat, *, command: str) -> dict[int, str]:
    """Indices (and ids) written by the parts. A part that cannot be read is removed, and its documents
    are done again: parts are written to a temporary name, fsynced and renamed, so an unreadable one is
    damage from outside, and dropping it only shrinks the done-set (the merge checks the result holds
    every index once)."""
    done: dict[int, str] = {}
    for part in part_files(parts, fmt):
        try:
            indices, ids = fmt.keys(part)
        except UnreadablePart as exc:
            print(f"{command}: {part} cannot be read ({exc}); its documents are done again", file=sys.stderr)
            part.unlink()
            continue
        for index, page_id in zip(indices, ids, strict=True):
            if index in done:
                raise RunStateError(f"document {index} appears twice in {parts}; delete it to start over")
            done[index] = page_id
    return done


class InputWalk:
    """The input's pages with their positions, less those done, each done one checked to be the page
    that was done: a resume over an input that changed would write two inputs' rows into one output."""

    def __init__(self, done: dict[int, str], parts: Path) -> None:
        self.done = done
        self.parts = parts
        self.documents = 0  # input pages seen so far, done before or not

    def todo(self, pages: Iterable[Page]) -> Iterator[tuple[int, Page]]:
        for index, page in enumerate(pages):
            self.documents = index + 1
            if index in self.done:
                if self.done[index] != page.id:
                    raise RunStateError(
                        f"input changed since the interrupted run: document {index} was "
                        f"{self.done[index]!r}, now {page.id!r}; delete {self.parts} to start over"
                    )
                continue
            yield index, page
        last = max(self.done, default=-1)
        if last >= self.documents:
            raise RunStateError(
                f"input changed since the interrupted run: it now ends after {self.documents} documents, "
                f"but document {last} ({self.done[last]!r}) was done; delete {self.parts} to start over"
            )


class PartWriter:
    """Holds rows and writes them, `part_size` at a time, as the next numbered part."""

    def __init__(self, parts: Path, fmt: PartFormat, part_size: int) -> None:
        self.parts = parts
        self.fmt = fmt
        self.part_size = part_size
        self.rows: list[dict[str, Any]] = []
        numbers = (int(p.name[len(PART_PREFIX) :].split(".")[0]) for p in part_files(parts, fmt))
        self.next_part = 1 + max(numbers, default=-1)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.part_size:
            self.flush()

    def flush(self, *, keep: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Write the rows held (those `keep` accepts) as a part: to a temporary, fsynced, renamed."""
        rows = self.rows if keep is None else [row for row in self.rows if keep(row)]
        self.rows = []
        if not rows:
            return
        path = self.parts / f"{PART_PREFIX}{self.next_part:06d}{self.fmt.suffix}"
        with replaced_atomically(path, suffix=".tmp", durable=True) as tmp:
            self.fmt.write(rows, tmp)
        self.next_part += 1


def complete_parts(parts: Path, fmt: PartFormat, documents: int, output: Path) -> list[tuple[int, int, Path]]:
    """Each part's (lowest index, highest index, path), by lowest index; refused unless the parts hold
    exactly the documents 0..documents-1, each once (the merge's precondition)."""
    import numpy as np

    ranges: list[tuple[int, int, Path]] = []
    indices = []
    for part in part_files(parts, fmt):
        try:
            index = fmt.indices(part)
        except UnreadablePart as exc:
            raise RunStateError(
                f"{part} cannot be read ({exc}); delete it and run again to do its documents again"
            ) from exc
        if len(index):
            ranges.append((int(index.min()), int(index.max()), part))
            indices.append(index)
    every = np.sort(np.concatenate(indices)) if indices else np.empty(0, dtype=np.int64)
    if not np.array_equal(every, np.arange(documents)):
        missing = documents - len(np.intersect1d(every, np.arange(documents)))
        raise RunStateError(
            f"{parts} does not hold documents 0..{documents - 1} once each ({len(every)} rows, "
            f"{missing} missing); not writing {output}: delete {parts} to start over"
        )
    return sorted(ranges)


def remove_parts(parts: Path, output: Path) -> None:
    """Remove `parts` in one rename, then delete it: a kill in between leaves a temporary that the next
    run removes, never a parts directory missing some parts."""
    trash = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    os.replace(parts, trash / "parts")
    shutil.rmtree(trash)
