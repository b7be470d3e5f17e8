"""What `htmllm embed` keeps on disk beyond the shared resume rules (`resume_state`): Parquet parts and the
merged output, which carries the run's settings in its metadata (`htmllm.run`), so a later run can tell
its own finished output from another run's, or from an unrelated file, and the devices its rows were
embedded on (`htmllm.devices`, each part's own: --device is not a setting, see `embed._say_other_devices`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.commands.resume_state import TEMP_SUFFIX, RunStateError, UnreadablePart, complete_parts
from service.core.atomic_files import replaced_atomically

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

RUN_METADATA_KEY = b"htmllm.run"
# The --device values a file's rows were embedded on, a JSON list: one in a part, each of its parts' in the
# output. Apart from `htmllm.run`, which a run compares whole: a device is recorded, never pinned.
DEVICES_METADATA_KEY = b"htmllm.devices"
# What a part or output from before devices were recorded counts as.
UNRECORDED_DEVICE = "unrecorded"


class ParquetParts:
    """Parts as Parquet files of the output's schema (`PartFormat`)."""

    suffix = ".parquet"

    def __init__(self, schema: pa.Schema, device: str | None = None) -> None:
        self.schema = schema
        self.device = device  # where this run's rows are embedded: recorded in each part it writes

    def write(self, rows: list[dict[str, Any]], path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(rows, schema=self.schema)
        if self.device is not None:
            devices = {DEVICES_METADATA_KEY: json.dumps([self.device])}
            table = table.replace_schema_metadata({**(self.schema.metadata or {}), **devices})
        pq.write_table(table, path)

    def indices(self, path: Path) -> npt.NDArray[np.int64]:
        import numpy as np

        return np.asarray(self._read(path, ["index"])["index"].to_numpy(), dtype=np.int64)

    def keys(self, path: Path) -> tuple[Sequence[int], Sequence[str]]:
        table = self._read(path, ["index", "id"])
        return table["index"].to_pylist(), table["id"].to_pylist()

    @staticmethod
    def _read(path: Path, columns: list[str]) -> pa.Table:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path, columns=columns)
        except (pa.ArrowException, OSError) as exc:
            raise UnreadablePart(str(exc)) from exc


def part_devices(path: Path) -> list[str]:
    """The devices `path`'s rows were embedded on (a part's, or a finished output's), from its footer
    alone; `[UNRECORDED_DEVICE]` for a file written before they were recorded, or one whose record
    cannot be read (the rows' own reader says what is wrong with such a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_metadata(path).metadata or {}).get(DEVICES_METADATA_KEY)
        devices = json.loads(raw) if raw is not None else None
    except (pa.ArrowException, OSError, ValueError):
        devices = None
    if not isinstance(devices, list) or not all(isinstance(name, str) for name in devices):
        return [UNRECORDED_DEVICE]
    return devices


# Indices the merge writes at a time: a run of millions of pages is merged in windows of this size, never
# read whole. Measured on 300K rows of 384-d embeddings: Arrow's peak 118 MB (65,536: 441 MB; the whole
# table at once: 1,740 MB), and the fastest of the three.
MERGE_WINDOW_ROWS = 16_384


def merge(parts: Path, output: Path, schema: pa.Schema, documents: int, settings: dict[str, Any]) -> int:
    """Merge the parts, sorted by index, into `output` with the settings and the parts' devices in its
    metadata; refused unless they hold exactly the documents 0..documents-1, each once.

    Streamed: the index columns are read first (for the check, and each part's index range), then the
    output is written one window of `MERGE_WINDOW_ROWS` indices at a time, from the parts whose range
    meets the window. Parts are written in completion order, nearly in index order, so a window reads a
    few of them; memory stays one window whatever the run's size (a 10M-page run had needed all of its
    embeddings in memory twice, for the concatenation and the sort). Of a part, only the row groups
    whose index range meets the window are read (Parquet's statistics): a finished output of a smaller
    --limit, taken whole as a part, is a window per row group (read whole for each window, 200K rows
    of 384-d embeddings took 7.8 s; 0.45 s so).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    ranges = complete_parts(parts, ParquetParts(schema), documents, output)
    devices = sorted({name for _, _, part in ranges for name in part_devices(part)})
    metadata = {
        **(schema.metadata or {}),
        RUN_METADATA_KEY: json.dumps(settings, sort_keys=True),
        DEVICES_METADATA_KEY: json.dumps(devices),
    }
    with (
        replaced_atomically(output, suffix=TEMP_SUFFIX, durable=True) as tmp,
        pq.ParquetWriter(tmp, schema.with_metadata(metadata)) as writer,
    ):
        if documents == 0:
            writer.write_table(schema.empty_table().replace_schema_metadata(metadata))
        for start in range(0, documents, MERGE_WINDOW_ROWS):
            end = start + MERGE_WINDOW_ROWS
            pieces = []
            for low, high, part in ranges:
                if low < end and high >= start:
                    window_rows = [("index", ">=", start), ("index", "<", end)]
                    pieces.append(pq.read_table(part, schema=schema, filters=window_rows))
            window = pa.concat_tables(pieces).sort_by("index")
            writer.write_table(window.replace_schema_metadata(metadata))
    return documents


class OutputUnreadable(RunStateError):
    """An existing output this process cannot read: whether it is this run's finished output, another
    run's, or no output of this command at all is unknown."""


def output_settings(output: Path) -> dict[str, Any] | None:
    """The settings a finished output was merged with; None for a file this command did not write.
    `OutputUnreadable` for one that cannot be read (permission denied, EIO): taken for "not written by
    this command", it was an invitation to --overwrite a file its owner may have locked away."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with output.open("rb") as handle:
            raw = (pq.read_schema(handle).metadata or {}).get(RUN_METADATA_KEY)
    except (pa.ArrowException, OSError, ValueError) as exc:
        if not isinstance(exc, OSError) or exc.errno is None:
            return None  # not Parquet: Arrow's errors, an OSError without an errno among them
        raise OutputUnreadable(
            f"{output} exists but cannot be read ({exc.strerror or exc}), so this run cannot tell whether "
            "it is its finished output: make it readable, or pass --overwrite to replace it unread"
        ) from exc
    try:
        settings = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return settings if isinstance(settings, dict) else None
