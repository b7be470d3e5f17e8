"""What a reading of a WARC file keeps across the restarts `warc_pages` makes in it (`Reading`: where
reading goes on after a record read alone, inside members cut where records are not, after empty
members, and whether past damage), and what names a record FastWARC framed (`Framed`).

A record without a WARC-Record-ID is named by where it is (`Reading.unnamed_id`): `<file>@<byte>` where
it starts at that byte of the file, else `<file>#<n>`, the n-th record read from the file (from 0). Inside
a file compressed as one stream (gzip, zstd, LZ4) FastWARC's offsets are positions of its read buffer,
which many records share: named by them, two pages had one id. `<file>` is the file's name, or its path
relative to the directory it was found in (`warc_pages.iter_warc`). An error row of the file's own (a
member that could not be read, what follows the last record read) has an id no page row has
(`warc_failure.Failure`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from service.core.errors import ErrorCode
from service.core.pages import Page
from service.core.warc_compression import member_start
from service.core.warc_unaligned import Resync


@dataclass
class Reading:
    """What naming a record without a WARC-Record-ID needs to know of the records read before it."""

    path: Path
    name: str  # the file's name in ids and `warc_file` (`warc_pages.iter_warc`)
    records: int = 0  # records FastWARC framed in the file so far, of every type
    # A record whose WARC header lines end in bare LF, to be read alone in FastWARC's quirks mode: where
    # it starts, and where reading goes on after it (`warc_bare_lf.bare_lf_record_end`).
    bare_lf: tuple[int, int] | None = None
    # Where such a record read alone ended, and reading went on: a member starts there, whatever its first
    # bytes say (`warc_skip.skip_member`'s `at_member`), as no record framed before it says otherwise.
    after_bare_lf: int | None = None
    # Where reading goes on inside the members of a file cut where its records are not, after a corrupt
    # one (`warc_unaligned.resync`), and whether the file was seen so.
    resync: Resync | None = None
    unaligned: bool = False
    # Reading went on after a damaged member, at a member found by its magic (`warc_skip.skip_member`,
    # `warc_unaligned.resync`), which may be one of a stored .warc.gz download's where the damage hid the
    # record that holds it: FastWARC's stop at empty members there is read past only where the rest of the
    # file walks to its end as whole records (`warc_tail.reading_end`'s `trusted`), which clears it.
    unverified: bool = False
    # Where reading went on after empty members (`warc_tail.reading_end`): a second file joined to the
    # first by `cat` may start there, compressed its own way (a bgzip file, then one a member per record).
    joined: int | None = None
    # What every member of the file starts with (`member_start`), read when first needed, and the file
    # open to look for it: opened once, not once per record without an id (~20% of such a file's time).
    _member: bytes | None = field(default=None, init=False)
    _handle: BinaryIO | None = field(default=None, init=False)

    def unnamed_id(self, offset: int, ordinal: int, *, shared: bool) -> str:
        """The id of the record FastWARC framed at `offset`, the `ordinal`-th of the file: `<file>@<offset>`
        where the record starts at that byte (a plain file; the start of a gzip member, zstd or LZ4 frame
        that no record before it was framed at), else `<file>#<ordinal>`. Both are stable from run to run
        (a resume checks them), and the latter does not depend on FastWARC's read buffer either."""
        if not shared and self._starts_member(offset):
            return f"{self.name}@{offset}"
        return f"{self.name}#{ordinal}"

    def error(self, page_id: str, message: str, code: ErrorCode = ErrorCode.VALIDATION) -> Page:
        """A row of the file's own (no record's page): its id is never a page row's
        (`warc_failure.Failure`)."""
        return Page(id=page_id, html=b"", error=message, error_code=code, meta={"warc_file": self.name})

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _starts_member(self, offset: int) -> bool:
        try:
            if self._member is None:
                handle = self._handle = self.path.open("rb")
                self._member = member_start(self.path, handle.read(4))
            if not self._member:  # a plain file: every record starts at the byte FastWARC says
                return True
            assert self._handle is not None
            self._handle.seek(offset)
            return self._handle.read(len(self._member)) == self._member
        except OSError:  # unreadable since FastWARC read it: named by its ordinal, which needs no file
            return False


class Framed(NamedTuple):
    """A record FastWARC framed: where, its position among the file's records, and what names it."""

    offset: int
    ordinal: int
    shared: bool  # a record before it was framed at the same offset (one member or stream holds both)
    record_id: str | None
    record_type: str | None  # its WARC-Type, as the header has it

    def position_id(self, reading: Reading) -> str:
        """The id it would have without a WARC-Record-ID: no page row's but its own, if it has none."""
        return reading.unnamed_id(self.offset, self.ordinal, shared=self.shared)

    def label(self, reading: Reading) -> str:
        return f"record {self.record_id or self.position_id(reading)}, {_type_label(self.record_type)}"


# The record types WARC 1.1 defines: named in a message as they are; any other WARC-Type is quoted.
_WARC_TYPES = frozenset(
    {"warcinfo", "response", "resource", "request", "metadata", "revisit", "conversion", "continuation"}
)
_MAX_TYPE_CHARS = 40


def _type_label(record_type: str | None) -> str:
    """A record named by its WARC-Type in a message: `a response record`; any value WARC does not define
    quoted and cut (`a record of WARC-Type 'x\\nWARC-Date: ...'`), since it may be anything: a header
    whose lines end in bare LF was one value of every line after it, pasted whole into the row."""
    if not record_type:
        return "an untyped record"
    if record_type in _WARC_TYPES:
        return f"a {record_type} record"
    cut = "..." if len(record_type) > _MAX_TYPE_CHARS else ""
    return f"a record of WARC-Type {record_type[:_MAX_TYPE_CHARS]!r}{cut}"
