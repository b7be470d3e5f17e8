"""Reading the pages of a WARC file with FastWARC: the WARC part of `service.core.pages.iter_pages`.

Every `response` record with an HTML payload (and every HTML `resource` record) is a page, and so is an
HTTP response with no body that says it is anything else (a redirect stored without a Content-Type: an
empty page, with its `http_status`); the rest are skipped (the `pages` module docstring says what a page
carries). Its rows, errors and page cap are
`pages`' own: the cap is read as `pages.MAX_PAGE_BYTES` at call time, never imported by value, so a test
that lowers it there lowers it for WARC records too. Whether a file ends with whole records is
`warc_tail`'s check, which knows nothing of pages.

A body still compressed once its chunking and Content-Encoding are undone (gzip, zlib or zstd that no
Content-Encoding declares, as a crawler stores a body the origin sent mislabelled, or one compressed once
more than the header says) is an `unsupported_media_type` row (`PageCompressedError`), by the API's rule
(`content_coding.undeclared_coding`): read on, it was binary noise embedded as a page.

A response record's HTTP head is parsed here (`_http_head`), not with FastWARC's `HeaderMap.parse`: that
one knows only CRLF line ends, and a head written with bare LF (as warcio and browsers read it) was taken
whole for headers, its body lost with its Content-Type: the page was skipped, or over 32 KiB an error row.

A record whose WARC header lines end in bare LF (some tools write them so; WARC requires CRLF) is read
again alone in FastWARC's quirks mode, from its own byte, and reading goes on after it strictly
(`warc_tail.bare_lf_record_end`): FastWARC reads a header's lines by CRLF alone, and had passed such a
record over as one of an unknown type, with no row. Quirks mode is never the file's whole reading: it
passes over bytes that are no record without a word. Where it goes on after such a record, a member
starts, whatever its first bytes (a damaged magic is one member skipped), and padding or nothing there
ends the file; a record whose own member does not decode is that failure's one row. In a file compressed
as one stream, which offers no byte to begin at, such a record is an error row that says why.

A record without a WARC-Record-ID is named by where it is (`_Reading.unnamed_id`): `<file>@<byte>` where
it starts at that byte of the file, else `<file>#<n>`, the n-th record read from the file (from 0). Inside
a file compressed as one stream (gzip, zstd, LZ4) FastWARC's offsets are positions of its read buffer,
which many records share: named by them, two pages had one id. `<file>` is the file's name, or its path
relative to the directory it was found in (`iter_warc`). An error row of the file's own (a member that
could not be read, what follows the last record read) has an id no page row has (`_Failure`).

A page read from a member that decodes but to bytes FastWARC frames otherwise than the records'
Content-Length (corrupt data a format without checksums cannot tell: LZ4, zstd without one) is that
page's own error row, where it had been a success row followed by a warning row: each record's row is
held back until the next record is framed, so that the failure after it can still be its own.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from service.core import pages
from service.core.content_coding import (
    ContentCodingError,
    decode_content,
    decoded_start,
    parse_codings,
    undeclared_coding,
)
from service.core.errors import ErrorCode
from service.core.media_types import extract_media_type, looks_like_markup
from service.core.pages import (
    READ_FACTOR,
    Page,
    PageCompressedError,
    PageSourceError,
    PageTooLargeError,
    PageUnreadableError,
    declared_page,
    error_page,
    read_error,
    valid_text,
)
from service.core.warc_frames import BehindDictionary, Undecodable, dictionary_frame
from service.core.warc_tail import (
    MAX_HEADER_BYTES,
    Skip,
    bare_lf_record_end,
    ends_in_padding,
    last_member_fails,
    member_start,
    nothing_after,
    reading_end,
    skip_member,
)
from service.core.warc_unaligned import Inflating, Resync, is_bgzf, members_unaligned, resync

if TYPE_CHECKING:
    from fastwarc.warc import WarcRecord

_HTML_MEDIA_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# The most an HTTP response head may take, its blank line included: the bound FastWARC's parser kept, so
# a block with no blank line within it is no response (an error row), never a page made of a head.
MAX_HTTP_HEAD_BYTES = 32 * 1024
# Line ends as browsers (and warcio) read them: CRLF or a bare LF, mixed in one head.
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")
_STATUS_LINE = re.compile(rb"[ \t]*HTTP/[0-9.]+[ \t]+([0-9]{3})(?:[ \t\r]|\Z)")
_BLANKS = " \t\r"


def iter_warc(path: Path, name: str | None = None) -> Iterator[Page]:
    """The HTML pages of a WARC file in record order; a record that cannot be read is an error row, and
    a file that cannot be read past some record ends with one (the framing after it is lost), but for a
    file compressed per record (gzip members, zstd or LZ4 frames): its corrupt member is an error row,
    and reading goes on at the next member that starts a record (`warc_tail.skip_member`). `name`: what
    names the file in its rows (`<name>@<byte>` ids, `warc_file`): its path relative to the directory
    it was found in, as an HTML file's id is (two `crawl.warc.gz` in two subdirectories had one id for
    two pages); the file's name where it is read alone."""
    reading = _Reading(path, valid_text(path.name if name is None else name))
    try:
        start: int | None = 0
        while start is not None:
            start = yield from _iter_records(path, start, reading)
    finally:
        reading.close()


@dataclass
class _Reading:
    """What naming a record without a WARC-Record-ID needs to know of the records read before it."""

    path: Path
    name: str  # the file's name in ids and `warc_file` (`iter_warc`)
    records: int = 0  # records FastWARC framed in the file so far, of every type
    # A record whose WARC header lines end in bare LF, to be read alone in FastWARC's quirks mode: where
    # it starts, and where reading goes on after it (`warc_tail.bare_lf_record_end`).
    bare_lf: tuple[int, int] | None = None
    # Where such a record read alone ended, and reading went on: a member starts there, whatever its first
    # bytes say (`skip_member`'s `at_member`), as no record framed before it says otherwise.
    after_bare_lf: int | None = None
    # Where reading goes on inside the members of a file cut where its records are not, after a corrupt
    # one (`warc_unaligned.resync`), and whether the file was seen so.
    resync: Resync | None = None
    unaligned: bool = False
    # Reading went on after a damaged member, at a member found by its magic (`warc_tail.skip_member`,
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
        """A row of the file's own (no record's page): its id is never a page row's (`_Failure`)."""
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


class _Framed(NamedTuple):
    """A record FastWARC framed: where, its position among the file's records, and what names it."""

    offset: int
    ordinal: int
    shared: bool  # a record before it was framed at the same offset (one member or stream holds both)
    record_id: str | None
    record_type: str | None  # its WARC-Type, as the header has it

    def position_id(self, reading: _Reading) -> str:
        """The id it would have without a WARC-Record-ID: no page row's but its own, if it has none."""
        return reading.unnamed_id(self.offset, self.ordinal, shared=self.shared)

    def label(self, reading: _Reading) -> str:
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


def _iter_records(path: Path, start: int, reading: _Reading) -> Generator[Page, None, int | None]:
    """`iter_warc`'s pages from the record at byte `start` on (a member's start but for 0); returns where
    to go on reading after a corrupt member, None at the end.

    A record's page row is held back until the next record is framed: where FastWARC then fails because
    the member it was read from decoded to corrupt bytes (a format without checksums), that row is the
    one to say so (`_Failure`), not a row after it."""
    try:
        from fastwarc.warc import ArchiveIterator, WarcRecordType
    except ImportError as exc:  # a dependency, but an environment may have been pruned by hand
        raise PageSourceError(f"reading {path} needs FastWARC: pip install fastwarc") from exc
    # The record at `start` has WARC header lines ended in bare LF: it alone is read in quirks mode.
    bare_lf = reading.bare_lf if reading.bare_lf is not None and reading.bare_lf[0] == start else None
    after_bare_lf = reading.after_bare_lf == start
    resumed = reading.resync if reading.resync is not None and reading.resync.member == start else None
    reading.bare_lf = reading.after_bare_lf = reading.resync = None
    # Every record type, so the last record seen is the last one FastWARC could frame. `max_header_len`:
    # the header bound the record walk (`warc_tail`) holds records to, said here so that the two agree.
    archive_of = functools.partial(
        ArchiveIterator, parse_http=False, max_header_len=MAX_HEADER_BYTES, quirks_mode=bare_lf is not None
    )
    with contextlib.ExitStack() as stack:
        try:
            shift = 0  # what FastWARC's offsets are short of the file's
            if resumed is not None:  # the members' output from a record inside them on, as a plain stream
                handle = stack.enter_context(path.open("rb"))
                archive = archive_of(Inflating(handle, start, resumed.skip))
            elif start == 0:
                archive = archive_of(str(path), fsspec_args=False)
            else:  # FastWARC takes the handle's position for the first record's offset
                handle = stack.enter_context(path.open("rb"))
                handle.seek(start)
                prefix = dictionary_frame(path)
                if prefix:
                    archive = archive_of(BehindDictionary(prefix, handle))
                    shift = start - len(prefix)
                else:
                    archive = archive_of(handle)
            iterator = iter(archive)
        except (OSError, ValueError) as exc:
            # One row, as an HTML file that cannot be opened is: raised, one dangling `.warc.gz` in a
            # directory of pages stopped the whole run, even with bad_rows="report".
            error = read_error(f"cannot read {path}: {exc}", exc)
            yield reading.error(f"{reading.name}@{start}", str(error), error.code)
            return None
        failure = _Failure(
            reading, start, at_member=after_bare_lf, skip=None if resumed is None else resumed.skip
        )
        reported = False  # whether the last record was reported cut off already
        while True:
            if bare_lf is not None and failure.last is not None:  # the one record read in quirks mode
                yield from failure.release()
                return failure.after_bare_lf(bare_lf[1])
            try:
                record = next(iterator)
            except StopIteration:
                break
            except (OSError, ValueError) as exc:
                return (yield from failure.failed(exc, in_record=False))
            yield from failure.release()
            offset = record.stream_pos + shift
            if bare_lf is None and _bare_lf_header(record):
                end = failure.bare_lf_end(offset)
                if end is not None:  # read again from its start, alone, in quirks mode
                    reading.bare_lf = (offset, end)
                    return offset
                failure.held = failure.bare_lf_row(offset)  # its row, as a page row is held
                continue
            record_type = record.headers.get("WARC-Type")
            failure.framed(offset, record.record_id, record_type)
            reported = False
            # Its row, as a page row is held; but for the empty record FastWARC hands back for a file cut
            # inside a header (no field, or no Content-Length yet), which the walk of the file's end says.
            if record_type is None and record.headers.get("Content-Length") is not None:
                failure.held = failure.untyped_row(record.record_id, record.headers.get("WARC-Target-URI"))
                continue
            if record.record_type not in (WarcRecordType.response, WarcRecordType.resource):
                continue
            try:
                # Bounded: a record's Content-Length is the writer's word, and FastWARC passes over what
                # is left of a record unread.
                block = record.reader.read(READ_FACTOR * pages.MAX_PAGE_BYTES + 1)
            except (OSError, ValueError) as exc:
                return (yield from failure.failed(exc, in_record=True))
            last = failure.last
            assert last is not None  # framed above
            page_id = record.record_id or last.position_id(reading)
            where = f"{path}: record {page_id} {failure.at(last.offset)}"
            url = _target_uri(record.headers.get("WARC-Target-URI"))
            meta: dict[str, Any] = {"warc_file": reading.name, "warc_date": record.headers.get("WARC-Date")}
            # Why the crawler cut the record short (`length`, `time`, `disconnect`, `unspecified`): on
            # every row of the record, an error row's too, so a curator can leave partial pages out.
            truncated = record.headers.get("WARC-Truncated")
            if truncated:
                meta["warc_truncated"] = valid_text(truncated)
            too_large = len(block) > READ_FACTOR * pages.MAX_PAGE_BYTES
            reported = not too_large and len(block) < record.content_length
            try:
                if reported:
                    # Only the file's last record can be short, and what it was cannot be trusted: report it.
                    raise PageSourceError(
                        f"{where} is cut off: {len(block)} of its {record.content_length} bytes"
                    )
                page = _warc_page(record, block, page_id, url, meta, where, too_large=too_large)
            except PageSourceError as exc:
                page = error_page(page_id, exc, url=url, meta=meta)
            failure.held = page
    if bare_lf is not None and failure.last is None:  # never seen: quirks mode read nothing there
        message = (
            f"{path}: the record at byte {start}, whose WARC header's lines end in LF alone, was not read"
        )
        yield reading.error(f"{reading.name}@{start}", message)
        return failure.after_bare_lf(bare_lf[1])
    if reported:  # the last record read is cut short: the file's end, or a member cut mid-file
        return (yield from failure.cut_off())
    # FastWARC ends quietly (or hands back an empty record) where a killed writer cut the file inside a
    # record's header; check the end of the file from the last record it framed, and say so. It ends as
    # quietly at an empty gzip member (bgzip ends every file with one, so two bgzip files joined by `cat`
    # hold one between them) or LZ4 frame: reading goes on at the member after it, as at a file's start.
    finding = reading_end(
        path,
        failure.offset,
        start,
        skip=failure.skip,
        here=failure.here,
        since=failure.since,
        trusted=not reading.unverified,
    )
    if finding.resume is not None:
        reading.unverified = False  # trusted, or the rest of the file walked whole
        reading.joined = finding.resume
        yield from failure.release()
        return finding.resume
    problem = finding.problem
    if problem is None:
        yield from failure.release()
        return None
    # It stops quietly at some corrupt members too (a gzip header whose flags claim an extra field): in
    # a file compressed per record, reading goes on after such a one as after one it fails on.
    read = failure.last is not None
    return (yield from failure.rows(f"{path}: {problem}", problem, ErrorCode.VALIDATION, read=read))


@dataclass
class _Failure:
    """What the rows of a failure after the record FastWARC framed last need: that record, and its page
    row held back. Their ids are never a page row's: `<file>@<byte>` of the member that failed, or the
    position id (`_Framed.position_id`) of the record framed last where that record has no row (it
    failed, or holds no page), else `<file>#<n>`, the position of the first record not read: the byte of
    a page read last had been both its own id (where it had no WARC-Record-ID) and the error row's."""

    reading: _Reading
    start: int  # where this reading began (0, or a member `skip_member` went on at)
    at_member: bool = False  # `start` is where a record read alone ended (`_Reading.after_bare_lf`)
    last: _Framed | None = None  # the record FastWARC framed last
    held: Page | None = None  # its page row, not yet yielded
    here: int = 0  # records FastWARC framed at `last.offset`
    since: int = 0  # records FastWARC framed from `start` on
    # Bytes of the output of the members from `start` on before the first record, where this reading is
    # of that output (`warc_unaligned.Inflating`): its offsets are positions of it, no bytes of the file.
    skip: int | None = None
    # The held row is that of a record whose WARC header lines end in bare LF, not read since its member
    # does not decode: the failure FastWARC meets in that member says so, its row in place of this one.
    unread_member: bool = False

    @property
    def offset(self) -> int:
        return self.start if self.last is None else self.last.offset

    def at(self, offset: int) -> str:
        """Where FastWARC's `offset` is, said in a row: a byte of the file, or where the reading is of the
        output of the members from `start` on (`skip`), a byte of that output, which no byte of the file
        is (named as a file's byte, it had pointed past the end of a small file)."""
        if self.skip is None:
            return f"at byte {offset}"
        return f"at byte {self.skip + offset} of the output of the gzip members from byte {self.start}"

    def framed(self, offset: int, record_id: str | None, record_type: str | None) -> None:
        # In a member's output FastWARC's offsets are no bytes of the file: ids by ordinal.
        shared = self.skip is not None or (self.last is not None and offset == self.last.offset)
        self.here = self.here + 1 if shared else 1
        self.since += 1
        self.last = _Framed(offset, self.reading.records, shared, record_id, record_type)
        self.reading.records += 1

    def bare_lf_end(self, offset: int) -> int | None:
        """Where the record FastWARC framed at `offset`, whose WARC header lines end in bare LF, ends, so
        that it can be read again alone (`warc_tail.bare_lf_record_end`); None where it cannot: it starts
        at no byte of the file reading can begin at (a record framed at the same offset before it; a file
        compressed as one stream), or the file went away."""
        if self.skip is not None or (self.last is not None and self.last.offset == offset):
            return None
        try:
            return bare_lf_record_end(self.reading.path, offset)
        except Undecodable:
            self.unread_member = True
            return None
        except OSError:
            return None

    def after_bare_lf(self, end: int) -> int | None:
        """Where reading goes on after the record read alone that ended at byte `end`: there, but for
        the padding (or nothing) that ends the file, which read from there had been false error rows."""
        try:
            if nothing_after(self.reading.path, end):
                return None
        except OSError:
            pass  # reading there says why
        self.reading.after_bare_lf = end
        return end

    def bare_lf_row(self, offset: int) -> Page:
        """The row of a record whose WARC header lines end in bare LF that is not read (`bare_lf_end`):
        FastWARC reads such a header on to the next CRLF CRLF, and frames what follows by whatever
        Content-Length it finds there. Passed over as a record of an unknown type, it had had no row."""
        self.framed(offset, None, None)
        last = self.last
        assert last is not None
        return self.reading.error(
            last.position_id(self.reading),
            f"{self.reading.path}: the record {self.at(offset)} was not read: its WARC header's lines end in "
            "LF alone, where WARC requires CRLF, and FastWARC reads such a header on to the next CRLF CRLF, "
            "so records up to there may be lost with it (such a record is read where the file is plain or "
            "compressed per record)",
        )

    def untyped_row(self, record_id: str | None, uri: str | None) -> Page:
        """The row of the record framed last, which has no WARC-Type field. WARC requires one, so its
        header is damaged (a byte of the field's name flipped, where a plain file keeps no checksum), and
        whether it holds a page cannot be told. Passed over as a record of an unknown type, a page had
        vanished with no row."""
        last = self.last
        assert last is not None
        page_id = record_id or last.position_id(self.reading)
        message = (
            f"{self.reading.path}: record {page_id} {self.at(last.offset)} has no WARC-Type field (WARC "
            "requires one: its header is damaged), so whether it holds a page cannot be told; it was skipped"
        )
        meta = {"warc_file": self.reading.name}
        return error_page(page_id, PageSourceError(message), url=_target_uri(uri), meta=meta)

    def cut_off(self) -> Generator[Page, None, int | None]:
        """The row of the record read last, which is cut short (its page row, held back), and where
        reading goes on: nowhere where the file ends in it, but after its member where that member does
        not decompress and one that starts a record follows (`skip_member`): a writer killed in the member,
        a restarted crawler appending to the file. FastWARC reads the next member's bytes on as the cut
        one's and stops without a word, and the intact records after it had been lost with no row."""
        found = None if self.skip is not None else _skip(self.reading.path, self.offset, False)
        held = self.held
        if found is None or found.decodes or found.failed != self.offset or held is None:
            yield from self.release()
            return None
        self.held = None
        self.reading.unverified = True  # reading goes on past damage (`_Reading`)
        yield replace(
            held,
            error=f"{held.error}; its {found.member} does not decompress and was skipped (bytes "
            f"{found.failed} to {found.resume - 1}; reading goes on at the record at byte {found.resume})",
        )
        return found.resume

    def release(self) -> Iterator[Page]:
        """The page row held back, now that no failure can be its member's."""
        self.unread_member = False
        if self.held is not None:
            yield self.held
            self.held = None

    def failed(self, exc: OSError | ValueError, *, in_record: bool) -> Generator[Page, None, int | None]:
        """The rows where FastWARC raised `exc`, reading the record framed last (`in_record`) or after it;
        returns where reading goes on, None for the end of the file."""
        path = self.reading.path
        error = read_error(f"{path}: cannot read the records after {self.at(self.offset)[3:]}: {exc}", exc)
        read = self.last is not None and not in_record
        if isinstance(error, PageUnreadableError):
            return (yield from self.rows(str(error), str(exc), error.code, read=read, skip=False))
        if (
            read
            and self.skip is None
            and _ends_in_padding(path, self.offset, self.start, here=self.here, since=self.since)
        ):
            yield from self.release()  # the padding that ends the file, which FastWARC takes for a member
            return None
        return (yield from self.rows(str(error), str(exc), error.code, read=read))

    def rows(
        self, message: str, cause: str, code: ErrorCode, *, read: bool, skip: bool = True
    ) -> Generator[Page, None, int | None]:
        """The rows of a failure after the record framed last (`read`: that record was read whole), by
        `message` where reading cannot go on (`skip`: may, where `skip_member` finds a member after), by
        `cause` where it goes on; returns where, or None."""
        reading, last = self.reading, self.last
        reading.unverified = True  # where reading goes on, if anywhere, is past damage (`_Reading`)
        if self.unread_member:  # the row of this failure is the record's (`bare_lf_end`)
            self.held, self.unread_member = None, False
        at_member = self.at_member and last is None
        # A file whose members are cut where its records are not goes on inside the members after the
        # corrupt one; one written a member per record, at the next member that starts a record.
        unaligned = skip and (
            self.skip is not None or reading.unaligned or _members_unaligned(reading.path, self)
        )
        if unaligned or (skip and self.skip is not None):
            resumed = self._resync(cause, code, unaligned=True)
            if resumed is not None:
                return (yield from resumed)
        per_record = skip and self.skip is None and not unaligned
        found = _skip(reading.path, self.offset, read, at_member=at_member) if per_record else None
        if found is None and per_record:
            resumed = self._resync(cause, code, unaligned=False)
            if resumed is not None:
                return (yield from resumed)
        alone = self.held is not None and self.here == 1  # a page read from its member alone
        if found is None and per_record and read and alone and last is not None:
            # No member after it: the record's own may still be the one that failed (a checksum at the
            # end of the file's last frame), its page garbage. Only a record alone in its member: of a
            # member holding more (one stream), the data before the damage are as written.
            found = _last_member_fails(reading.path, last.offset)
            if found is not None:
                yield self._suspect(found, cause, code)
                return None
        if found is not None and read and last is not None and found.failed == last.offset:
            yield self._suspect(found, cause, code)
            return found.resume
        has_row = self.held is not None  # the record framed last has a row: its page's
        yield from self.release()
        if found is None:
            page_id = f"{reading.name}@{self.offset}"  # nothing framed: the byte reading began at
            if last is not None:
                page_id = f"{reading.name}#{reading.records}" if has_row else last.position_id(reading)
            yield reading.error(page_id, message, code)
            return None
        # The bytes skipped may hold more members than the one that failed (two corrupt in a row, the
        # second's start no longer inflating): the range says what one row stands for.
        failed, resume = found.failed, found.resume
        what = "holds no WARC record FastWARC reads" if found.stray else "could not be decompressed"
        page_id = f"{reading.name}@{failed}"
        if last is not None and failed == last.offset:  # the record framed there, unread: its own id
            page_id = last.position_id(reading)
        yield reading.error(
            page_id,
            f"{reading.path}: the record at byte {failed} {what} and was skipped (bytes {failed} to "
            f"{resume - 1}; reading goes on at the record at byte {resume}): {cause}"
            + (f" ({found.why})" if found.why else ""),  # what is wrong with its bytes (a header too long)
            code,
        )
        return resume

    def _resync(
        self, cause: str, code: ErrorCode, *, unaligned: bool
    ) -> Generator[Page, None, int | None] | None:
        """The rows of a corrupt member in a file whose members are cut where its records are not, and
        where reading goes on inside the members after it (`warc_unaligned.resync`); None where it
        cannot. The page row held back is an error row where its record reaches into the damaged
        member's output (what was read of it may be garbage), its own row; the rest of what the member
        held is the member's row."""
        reading = self.reading
        try:
            found = resync(reading.path, self.start, self.skip or 0, unaligned=unaligned)
        except OSError:
            return None
        if found is None:
            return None
        reading.unaligned, reading.resync = True, found
        return self._resynced(found, cause, code)

    def _resynced(self, found: Resync, cause: str, code: ErrorCode) -> Generator[Page, None, int | None]:
        reading, last, held = self.reading, self.last, self.held
        where = (
            f"the gzip member at byte {found.failed} could not be decompressed and was skipped with what it "
            f"held of the records (bytes {found.failed} to {found.member - 1}; reading goes on at the first "
            f"record that starts in the members from byte {found.member}, {found.skip} bytes into their "
            f"output): {cause}"
        )
        self.unread_member = False
        if held is not None and self.since > found.whole:  # read into the damaged member's output
            self.held = None
            error = f"{reading.path}: {held.id} was read into {where}"
            yield replace(held, html=b"", error=error, error_code=code)
        else:
            yield from self.release()
        page_id = f"{reading.name}@{found.failed}"
        if last is not None and self.skip is None and last.offset == found.failed:  # a record framed there
            page_id = f"{reading.name}#{reading.records}"
            reading.records += 1  # an ordinal no record will have
        yield reading.error(page_id, f"{reading.path}: {where}", code)
        return found.member

    def _suspect(self, found: Skip, cause: str, code: ErrorCode) -> Page:
        """The row of the record framed last, read whole from a member that does not decompress (a gzip
        member whose checksum fails at its end, after the record was read) or decompresses to bytes that
        are no whole WARC records as FastWARC frames them (corrupt data decodes where the format keeps no
        checksum: LZ4, zstd written without one), so what was read of it may be garbage. Its page row,
        held back, is this one (its id, url and meta; no page), where it had been written as a success
        with a warning row after it."""
        reading, last = self.reading, self.last
        assert last is not None
        others = f" ({self.here - 1} records before it were read from it too)" if self.here > 1 else ""
        if not found.decodes:
            problem, why = "does not decompress", ""
        else:
            problem = "decompresses to bytes that are no whole WARC records as FastWARC frames them"
            # A gzip member's checksum held, so its bytes are as written; a frame may have none.
            unchecked = f"{found.member}s without a checksum decode corrupt data, so "
            why = "" if found.member == "gzip member" else unchecked
        kept = "its page was not kept" if self.held is not None else "it holds no page"
        goes_on = (
            "the file ends with it" if found.last else f"reading goes on at the record at byte {found.resume}"
        )
        message = (
            f"{reading.path}: the {last.label(reading)} {self.at(last.offset)} was read, but its "
            f"{found.member} {problem} ({cause}){others}: {why}what was read of it may be garbage "
            f"({kept}); the rest of that {found.member} was skipped (bytes {found.failed} to "
            f"{found.resume - 1}; {goes_on})"
        )
        held, self.held = self.held, None
        if held is None:
            return reading.error(last.position_id(reading), message, code)
        return Page(id=held.id, html=b"", url=held.url, meta=held.meta, error=message, error_code=code)


def _bare_lf_header(record: WarcRecord) -> bool:
    """Whether FastWARC read a header whose lines end in bare LF: it splits lines at CRLF alone, so one
    field's value holds the lines after it. A record of a type it knows has a value without."""
    from fastwarc.warc import WarcRecordType

    if record.record_type not in (WarcRecordType.unknown, WarcRecordType.no_type):
        return False
    return any("\n" in value for _, value in record.headers.items())


def _skip(path: Path, offset: int, framed: bool, *, at_member: bool = False) -> Skip | None:
    """`skip_member`, None where the file cannot be read again (it went away, say): the error row said."""
    try:
        return skip_member(path, offset, framed=framed, at_member=at_member)
    except OSError:
        return None


def _members_unaligned(path: Path, failure: _Failure) -> bool:
    """`warc_unaligned.members_unaligned` at the record framed last, False where the file went away.
    With none framed, the member there is the damaged one: that it inflates to no record's start is its
    damage, no sign of how the file was cut (a per-record file damaged in its first member had been read
    on as bgzip's, and a stored download damaged later in it lost the intact records after it): only
    bgzip's own mark then says so: the file's first member's, or where reading began after empty members
    (`_Reading.joined`), that member's, which may start a second file joined to a bgzip one (byte 0's
    mark had the per-record file after it read as bgzip's, and its records after a damaged first member
    were lost). Not where reading began after damage: that member may be a BGZF block of a stored
    download, which the file's own members are not."""
    try:
        if failure.last is None:
            return is_bgzf(path, failure.start if failure.reading.joined == failure.start else 0)
        return members_unaligned(path, failure.offset)
    except OSError:
        return False


def _last_member_fails(path: Path, offset: int) -> Skip | None:
    """`last_member_fails`, None where the file cannot be read again."""
    try:
        return last_member_fails(path, offset)
    except OSError:
        return None


def _ends_in_padding(path: Path, offset: int, start: int, *, here: int, since: int) -> bool:
    """`ends_in_padding`, False where the file cannot be read again."""
    try:
        return ends_in_padding(path, offset, start, here=here, since=since)
    except OSError:
        return False


def _target_uri(value: str | None) -> str | None:
    """A WARC-Target-URI without the angle brackets WARC 1.0 wrote around it (`<http://example.org/a>`,
    as wget writes every one; WARC 1.1 dropped them, and warcio strips them): kept, every page of a wget
    crawl had its `url` in brackets, matching no URL list or CDX index."""
    if value is not None and len(value) >= 2 and value.startswith("<") and value.endswith(">"):
        return value[1:-1].strip()
    return value


def _warc_page(
    record: WarcRecord,
    block: bytes,
    page_id: str,
    url: str | None,
    meta: dict[str, Any],
    where: str,
    *,
    too_large: bool,
) -> Page | None:
    """The page a record holds, None for a record that holds no HTML page. `too_large`: `block` is only
    the start of a record over the read bound, enough to tell whether it holds a page (then refused)."""
    from fastwarc.warc import WarcRecordType

    content_type = record.headers.get("Content-Type") or ""
    coding: str | None = None
    status: int | None = None  # an HTTP response's
    if record.record_type == WarcRecordType.response:
        # The WARC Content-Type is a SHOULD: a response without one whose block starts as an HTTP
        # response is one (it had been passed over in silence); one typed otherwise is not (a DNS one).
        untyped_http = not content_type and block.startswith(b"HTTP/")
        if not (content_type.lower().startswith("application/http") or untyped_http):
            return None  # e.g. a DNS response
        http = _http_head(block, where)
        body = block[http.size :]
        content_type = http.headers.get("content-type") or ""
        coding = http.headers.get("content-encoding")
        status = meta["http_status"] = http.status
        if "chunked" in (http.headers.get("transfer-encoding") or "").lower():
            body = _dechunk(body)
    else:
        body = block
    media_type, charset = extract_media_type(content_type) if content_type else (None, None)
    if media_type is not None and media_type not in _HTML_MEDIA_TYPES:
        return None
    meta["content_type"] = content_type or None
    if media_type is None:
        # An untyped body is a page by its start (`_untyped_page`), which a Content-Encoding hides: the
        # start is undone first (`_decoded_start`), as the API undoes a request's body before it reads
        # it. Read while still coded, every gzip-coded untyped page had been passed over with no row.
        # Only the start: decoded whole, every coded body (an image, an archive) had cost its decoding,
        # and one over the page cap had been a payload_too_large row where it is no page at all. A
        # coding that cannot be started (unknown, garbage at its first bytes) is the record's error row:
        # whether it held a page cannot be told, and it had vanished.
        start = _decoded_start(body, coding, where) if _hides_start(coding) else body
        if not _untyped_page(start, status):
            return None
    if too_large:
        raise PageTooLargeError(
            f"{where} has {record.content_length} bytes, over the {READ_FACTOR * pages.MAX_PAGE_BYTES} read "
            f"for one page of at most {pages.MAX_PAGE_BYTES}"
        )
    body = _decoded(body, coding, where)
    left = undeclared_coding(body)
    if left is not None:
        response = record.record_type == WarcRecordType.response
        raise PageCompressedError(f"{where}: {_still_compressed(left, body, coding, response=response)}")
    html, encoding = declared_page(body, charset, where)
    return Page(id=page_id, html=html, url=url, meta=meta, encoding=encoding)


def _still_compressed(coding: str, body: bytes, declared: str | None, *, response: bool) -> str:
    """Why a body that is still `coding`-compressed once `declared` (its Content-Encoding) is undone is
    no page: the API's 415 message (`check_not_compressed`), said of a record rather than a request."""
    start = body[:4].hex(" ")
    if not response:  # a resource record: its block is the page itself, with no header to declare a coding
        return f"the record's content is {coding}-compressed (it starts {start}), not an HTML page"
    if declared is not None and parse_codings(declared):
        return (
            f"the HTTP body is still {coding}-compressed (it starts {start}) once its Content-Encoding "
            f"({declared[:100]!r}) is undone: it was compressed once more than that header says"
        )
    return (
        f"the HTTP body is {coding}-compressed but its Content-Encoding does not say so (it starts {start})"
    )


def _decoded(body: bytes, coding: str | None, where: str) -> bytes:
    """`body` with its Content-Encoding `coding` undone within the page cap; a coding that cannot be
    undone is `PageSourceError` with the code the API answers it with."""
    try:
        return decode_content(body, coding, limit=pages.MAX_PAGE_BYTES)
    except ContentCodingError as exc:
        raise PageSourceError(f"{where}: {exc.message}", code=exc.code) from exc


# Bytes of a coded untyped body's output decoded to tell whether it is a page (`_decoded_start`): its
# markup's start, after any white space and a UTF-16 sample (`looks_like_markup` reads 4 KiB).
_SNIFF_BYTES = 8 << 10


def _decoded_start(body: bytes, coding: str | None, where: str) -> bytes:
    """The first bytes (up to `_SNIFF_BYTES` of each coding's output) of `body` with its Content-Encoding
    `coding` undone (`content_coding.decoded_start`); what follows them is not looked at (`_decoded` reads
    it all, for a page). A coding that is unknown, or whose first bytes do not decode, is
    `PageSourceError`, as `_decoded` says it."""
    try:
        return decoded_start(body, coding, _SNIFF_BYTES)
    except ContentCodingError as exc:
        raise PageSourceError(f"{where}: {exc.message}", code=exc.code) from exc


def _hides_start(coding: str | None) -> bool:
    """Whether a Content-Encoding leaves a body's first bytes other than the page's: it lists a coding
    (`identity` is none), or one that cannot be read (unknown, too many), which undoing it will say."""
    try:
        return bool(parse_codings(coding))
    except ContentCodingError:
        return True


def _untyped_page(body: bytes, status: int | None) -> bool:
    """Whether a record with no media type holds a page: markup by its start, as the API reads an
    untyped request body (`looks_like_markup`: `<` after white space or a byte order mark, or UTF-16
    markup; the reader's own test, `<` after white space, had passed over a page that starts with a BOM
    or is UTF-16, with no row), or an HTTP response (`status`: its status line's) with no body (a
    redirect, a 204 or 304, stored without a Content-Type). Such a response is a page with nothing in
    it, as one typed text/html is: its row carries its `http_status`, by which the docs promise empty
    redirects can be filtered out, where it had been dropped unseen. A block with no status line is none:
    a resource record, or the empty record FastWARC hands back for a file cut inside a record's header
    (`warc_tail` says that one)."""
    return looks_like_markup(body) or (status is not None and not body.strip())


class _HttpHead(NamedTuple):
    status: int | None  # None for a status line that is no HTTP one, which crawl data has
    headers: dict[str, str]  # by lower-case name; a repeated header's values joined with ", "
    size: int  # bytes of the block the head takes, its blank line included: the body starts there


def _http_head(block: bytes, where: str) -> _HttpHead:
    """The HTTP response head that starts `block`, read as leniently as browsers read it: lines end in
    CRLF or a bare LF, a line folded onto the next (obs-fold) is joined with one space, a line with no
    colon is passed over, and a header's repeated lines are one comma-separated list. A block with no
    blank line is all head (a redirect stored without its last CRLF) unless it is longer than
    `MAX_HTTP_HEAD_BYTES`, which is `PageSourceError`."""
    end = _HEAD_END.search(block, 0, MAX_HTTP_HEAD_BYTES)
    if end is not None:
        head, size = block[: end.start()], end.end()
    elif len(block) <= MAX_HTTP_HEAD_BYTES:
        head, size = block, len(block)
    else:
        raise PageSourceError(
            f"{where}: the HTTP response head is malformed: no blank line ends it within its first "
            f"{MAX_HTTP_HEAD_BYTES} bytes"
        )
    status_line, *lines = _LINE_END.split(head)
    status = _STATUS_LINE.match(status_line)
    fields: list[list[str]] = []
    for line in lines:
        text = line.decode("utf-8", "replace")
        if text[:1] in (" ", "\t"):
            if fields:  # obs-fold: the previous field's value goes on
                fields[-1][1] += " " + text.strip(_BLANKS)
            continue
        name, colon, value = text.partition(":")
        name = name.strip(_BLANKS).lower()
        if colon and name:
            fields.append([name, value.strip(_BLANKS)])
    # A repeated header is one list of its lines' values, in order (RFC 9110 section 5.3), as Fetch
    # combines them before reading a Content-Type ("extract a MIME type": `text/html` then `text/html;
    # charset=iso-8859-5` is iso-8859-5) or a Content-Encoding (two lines of gzip are gzip twice). The
    # first line's value alone had read that page with the charset the decoder guessed.
    headers: dict[str, str] = {}
    for name, value in fields:
        value = value.strip(_BLANKS)
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return _HttpHead(int(status.group(1)) if status else None, headers, size)


def _dechunk(body: bytes) -> bytes:
    """A chunked HTTP body's data. Lenient as crawl data needs: a body that only claims to be chunked
    (its first line is no chunk size) is returned as it is, one that breaks off keeps what came."""
    out = bytearray()
    position = 0
    while True:
        end = body.find(b"\n", position)
        try:
            size = int(body[position:end].split(b";", 1)[0].strip(), 16) if end >= 0 else -1
        except ValueError:
            size = -1
        if size < 0:
            return body if position == 0 else bytes(out)
        if size == 0:
            return bytes(out)
        start = end + 1
        out += body[start : start + size]
        if start + size > len(body):
            return bytes(out)
        position = start + size
        if body[position : position + 2] == b"\r\n":
            position += 2
        elif body[position : position + 1] == b"\n":
            position += 1
