"""Reading the pages of a WARC file with FastWARC: the WARC part of `service.core.pages.iter_pages`.

Every `response` record with an HTML payload (and every HTML `resource` record) is a page, and so is an
HTTP response with no body that says it is anything else (a redirect stored without a Content-Type: an
empty page, with its `http_status`); the rest are skipped (the `pages` module docstring says what a page
carries). Its rows, errors and page cap are
`pages`' own: the cap is read as `pages.MAX_PAGE_BYTES` at call time, never imported by value, so a test
that lowers it there lowers it for WARC records too. Whether a file ends with whole records is
`warc_tail`'s check, which knows nothing of pages.

A record's page is `warc_record_page`'s (its HTTP head, its codings, whether it holds a page at all), a
record's id and what a reading keeps across its restarts `warc_reading`'s, and the rows of a failure, and
where reading goes on after it, `warc_failure`'s: this module iterates FastWARC over the file, from its
start or from where one of those has reading go on.

A record whose WARC header lines end in bare LF (some tools write them so; WARC requires CRLF) is read
again alone in FastWARC's quirks mode, from its own byte, and reading goes on after it strictly
(`warc_bare_lf.bare_lf_record_end`): FastWARC reads a header's lines by CRLF alone, and had passed such a
record over as one of an unknown type, with no row. Quirks mode is never the file's whole reading: it
passes over bytes that are no record without a word. Where it goes on after such a record, a member
starts, whatever its first bytes (a damaged magic is one member skipped), and padding or nothing there
ends the file; a record whose own member does not decode is that failure's one row. In a file compressed
as one stream, which offers no byte to begin at, such a record is an error row that says why.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.core import pages
from service.core.errors import ErrorCode
from service.core.pages import READ_FACTOR, Page, PageSourceError, error_page, read_error, valid_text
from service.core.warc_failure import Failure
from service.core.warc_frames import BehindDictionary, dictionary_frame
from service.core.warc_reading import Reading
from service.core.warc_record_page import target_uri, warc_page
from service.core.warc_tail import MAX_HEADER_BYTES, reading_end
from service.core.warc_unaligned import Inflating

if TYPE_CHECKING:
    from fastwarc.warc import WarcRecord


def iter_warc(path: Path, name: str | None = None) -> Iterator[Page]:
    """The HTML pages of a WARC file in record order; a record that cannot be read is an error row, and
    a file that cannot be read past some record ends with one (the framing after it is lost), but for a
    file compressed per record (gzip members, zstd or LZ4 frames): its corrupt member is an error row,
    and reading goes on at the next member that starts a record (`warc_skip.skip_member`). `name`: what
    names the file in its rows (`<name>@<byte>` ids, `warc_file`): its path relative to the directory
    it was found in, as an HTML file's id is (two `crawl.warc.gz` in two subdirectories had one id for
    two pages); the file's name where it is read alone."""
    reading = Reading(path, valid_text(path.name if name is None else name))
    try:
        start: int | None = 0
        while start is not None:
            start = yield from _iter_records(path, start, reading)
    finally:
        reading.close()


def _iter_records(path: Path, start: int, reading: Reading) -> Generator[Page, None, int | None]:
    """`iter_warc`'s pages from the record at byte `start` on (a member's start but for 0); returns where
    to go on reading after a corrupt member, None at the end.

    A record's page row is held back until the next record is framed: where FastWARC then fails because
    the member it was read from decoded to corrupt bytes (a format without checksums), that row is the
    one to say so (`Failure`), not a row after it."""
    try:
        from fastwarc.warc import ArchiveIterator, WarcRecordType
    except ImportError as exc:  # a dependency, but an environment may have been pruned by hand
        raise PageSourceError(f"reading {path} needs FastWARC: pip install fastwarc") from exc
    # The record at `start` has WARC header lines ended in bare LF: it alone is read in quirks mode.
    bare_lf = reading.bare_lf if reading.bare_lf is not None and reading.bare_lf[0] == start else None
    # A member starts at `start` whatever its first bytes say: where a record read alone ended, or where
    # reading went on after empty members (the walk's mark is where the member before them ended).
    at_member = start in (reading.after_bare_lf, reading.joined)
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
        failure = Failure(reading, start, at_member=at_member, skip=None if resumed is None else resumed.skip)
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
            url = target_uri(record.headers.get("WARC-Target-URI"))
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
                page = warc_page(record, block, page_id, url, meta, where, too_large=too_large)
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


def _bare_lf_header(record: WarcRecord) -> bool:
    """Whether FastWARC read a header whose lines end in bare LF: it splits lines at CRLF alone, so one
    field's value holds the lines after it. A record of a type it knows has a value without."""
    from fastwarc.warc import WarcRecordType

    if record.record_type not in (WarcRecordType.unknown, WarcRecordType.no_type):
        return False
    return any("\n" in value for _, value in record.headers.items())
