"""The files an `htmllm embed` run keeps on disk, and the rules that make a resume safe.

Beside `<output>` lives `<output>.parts/`: `lock` (held with `flock` for the whole run, so a second run on
the same output — a scheduler retrying a job whose first attempt still lives — is refused instead of
writing every document twice), `run.json` (the settings that determine the rows: a resume with others
would mix two models in one file) and the append-only `part-NNNNNN.parquet` files. Everything is written
to a hidden temporary name and renamed, so a file is complete or absent; the temporaries of a killed run
(`.<name>.<8 random characters>.tmp`, up to the size of the output for a merge) are removed by the next
run. The merged output carries the settings in its Parquet metadata (`htmllm.run`), so a later run can
tell its own finished output from another run's, or from an unrelated file.
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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.core.atomic_files import replaced_atomically
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    import pyarrow as pa

PART_GLOB = "part-*.parquet"
RUN_FILE = "run.json"
LOCK_FILE = "lock"
RUN_METADATA_KEY = b"htmllm.run"
# mkstemp's names: the prefix, 8 characters of its alphabet, the suffix (none before this version).
_TEMP_NAME = r"\.{name}\.[a-z0-9_]{{8}}(\.tmp)?"


class RunStateError(HtmllmError):
    """The parts directory or the output is in a state this run must not touch."""

    code = ErrorCode.VALIDATION


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def changed(settings: dict[str, Any], previous: dict[str, Any]) -> str:
    """The settings that differ, for a refusal's message."""
    return ", ".join(
        sorted(k for k in settings.keys() | previous.keys() if settings.get(k) != previous.get(k))
    )


def write_table(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    with replaced_atomically(path, suffix=".tmp", durable=True) as tmp:
        pq.write_table(table, tmp)


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
        if entry.name.startswith((".part-", ".run.")):
            entry.unlink()


@contextlib.contextmanager
def run_lock(parts: Path) -> Iterator[None]:
    """Hold `parts/lock` for the whole run (creating `parts`); refuse when another run holds it.

    A run that finishes removes `parts` with the lock file in it, so a lock taken on a file no longer at
    that path is let go and taken again on the new directory.
    """
    for _ in range(5):
        parts.mkdir(parents=True, exist_ok=True)
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
    if pin.is_file() and any(parts.glob(PART_GLOB)):
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


def done_set(parts: Path) -> dict[int, str]:
    """Indices (and ids) written by the parts. A part that cannot be read is removed, and its documents
    are embedded again: parts are written to a temporary name, fsynced and renamed, so an unreadable
    one is damage from outside, and dropping it only shrinks the done-set (the merge checks the result
    holds every index once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done: dict[int, str] = {}
    for part in sorted(parts.glob(PART_GLOB)):
        try:
            table = pq.read_table(part, columns=["index", "id"])
        except (pa.ArrowException, OSError) as exc:
            print(
                f"htmllm embed: {part} cannot be read ({exc}); its documents are embedded again",
                file=sys.stderr,
            )
            part.unlink()
            continue
        for index, page_id in zip(table["index"].to_pylist(), table["id"].to_pylist(), strict=True):
            if index in done:
                raise RunStateError(f"document {index} appears twice in {parts}; delete it to start over")
            done[index] = page_id
    return done


# Indices the merge writes at a time: a run of millions of pages is merged in windows of this size, never
# read whole. Measured on 300K rows of 384-d embeddings: Arrow's peak 118 MB (65,536: 441 MB; the whole
# table at once: 1,740 MB), and the fastest of the three.
MERGE_WINDOW_ROWS = 16_384


def merge(parts: Path, output: Path, schema: pa.Schema, documents: int, settings: dict[str, Any]) -> int:
    """Merge the parts, sorted by index, into `output` with the settings in its metadata; refused unless
    they hold exactly the documents 0..documents-1, each once.

    Streamed: the index columns are read first (for the check, and each part's index range), then the
    output is written one window of `MERGE_WINDOW_ROWS` indices at a time, from the parts whose range
    meets the window. Parts are written in completion order, nearly in index order, so a window reads a
    few of them; memory stays one window whatever the run's size (a 10M-page run had needed all of its
    embeddings in memory twice, for the concatenation and the sort).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = sorted(parts.glob(PART_GLOB))
    ranges: list[tuple[int, int, Path]] = []
    indices = []
    for part in files:
        try:
            index = pq.read_table(part, columns=["index"])["index"].to_numpy()
        except (pa.ArrowException, OSError) as exc:
            raise RunStateError(
                f"{part} cannot be read ({exc}); delete it and run again to embed its documents again"
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
    metadata = {**(schema.metadata or {}), RUN_METADATA_KEY: json.dumps(settings, sort_keys=True)}
    with (
        replaced_atomically(output, suffix=".tmp", durable=True) as tmp,
        pq.ParquetWriter(tmp, schema.with_metadata(metadata)) as writer,
    ):
        if documents == 0:
            writer.write_table(schema.empty_table().replace_schema_metadata(metadata))
        for start in range(0, documents, MERGE_WINDOW_ROWS):
            end = start + MERGE_WINDOW_ROWS
            pieces = []
            for low, high, part in ranges:
                if low < end and high >= start:
                    table = pq.read_table(part, schema=schema)
                    keep = pc.and_(pc.greater_equal(table["index"], start), pc.less(table["index"], end))
                    pieces.append(table.filter(keep))
            window = pa.concat_tables(pieces).sort_by("index")
            writer.write_table(window.replace_schema_metadata(metadata))
    return documents


def output_settings(output: Path) -> dict[str, Any] | None:
    """The settings a finished output was merged with; None for a file this command did not write."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_schema(output).metadata or {}).get(RUN_METADATA_KEY)
        settings = json.loads(raw) if raw is not None else None
    except (pa.ArrowException, OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def remove_parts(parts: Path, output: Path) -> None:
    """Remove `parts` in one rename, then delete it: a kill in between leaves a temporary that the next
    run removes, never a parts directory missing some parts."""
    trash = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    os.replace(parts, trash / "parts")
    shutil.rmtree(trash)
