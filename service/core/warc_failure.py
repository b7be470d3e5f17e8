"""The rows of a failure FastWARC meets after the record it framed last, and where reading goes on
after it (`Failure`): past a corrupt member (`warc_skip`), inside members cut where records are not
(`warc_unaligned`), after a record read alone (`warc_bare_lf`), or nowhere, the file's end (`warc_tail`).
Their ids are never a page row's.

A page read from a member that decodes but to bytes FastWARC frames otherwise than the records'
Content-Length (corrupt data a format without checksums cannot tell: LZ4, zstd without one) is that
page's own error row, where it had been a success row followed by a warning row: each record's row is
held back until the next record is framed, so that the failure after it can still be its own.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from service.core.errors import ErrorCode
from service.core.pages import Page, PageSourceError, PageUnreadableError, error_page, read_error
from service.core.warc_bare_lf import bare_lf_record_end, nothing_after
from service.core.warc_frames import Undecodable
from service.core.warc_reading import Framed, Reading
from service.core.warc_record_page import target_uri
from service.core.warc_skip import Skip, last_member_fails, skip_member
from service.core.warc_tail import ends_in_padding
from service.core.warc_unaligned import Resync, is_bgzf, joined_unaligned, members_unaligned, resync


@dataclass
class Failure:
    """What the rows of a failure after the record FastWARC framed last need: that record, and its page
    row held back. Their ids are never a page row's: `<file>@<byte>` of the member that failed, or the
    position id (`Framed.position_id`) of the record framed last where that record has no row (it
    failed, or holds no page), else `<file>#<n>`, the position of the first record not read: the byte of
    a page read last had been both its own id (where it had no WARC-Record-ID) and the error row's."""

    reading: Reading
    start: int  # where this reading began (0, or a member `skip_member` went on at)
    at_member: bool = False  # `start` is where a record read alone ended (`Reading.after_bare_lf`)
    last: Framed | None = None  # the record FastWARC framed last
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
        self.last = Framed(offset, self.reading.records, shared, record_id, record_type)
        self.reading.records += 1

    def bare_lf_end(self, offset: int) -> int | None:
        """Where the record FastWARC framed at `offset`, whose WARC header lines end in bare LF, ends, so
        that it can be read again alone (`warc_bare_lf.bare_lf_record_end`); None where it cannot: it starts
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
        return error_page(page_id, PageSourceError(message), url=target_uri(uri), meta=meta)

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
        self.reading.unverified = True  # reading goes on past damage (`Reading`)
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
        reading.unverified = True  # where reading goes on, if anywhere, is past damage (`Reading`)
        if self.unread_member:  # the row of this failure is the record's (`bare_lf_end`)
            self.held, self.unread_member = None, False
        at_member = self.at_member and last is None
        # A file whose members are cut where its records are not goes on inside the members after the
        # corrupt one; one written a member per record, at the next member that starts a record.
        unaligned = skip and (
            self.skip is not None or reading.unaligned or _members_unaligned(reading.path, self)
        )
        # Or the record framed last starts where reading went on after empty members, and the file there
        # is cut where its records are not (a bgzip file after a plain empty member and another bgzip
        # file; a pgzip file after a bgzip one): reading goes on inside its members after the damaged
        # one, where the rule above, told by byte 0's member or by the member that record starts in
        # (which starts a record in any layout), had reading go on at the next file's first member and
        # the records between lost. Only where a member there does not inflate: where every one does
        # (empty members inside one file, a record cut by them), nothing is skipped inside the members,
        # and reading goes on at the next member that starts a record, as for a file written so.
        if unaligned or (skip and self.skip is not None) or (skip and self._joined_unaligned()):
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

    def _joined_unaligned(self) -> bool:
        """Whether the record framed last starts where reading went on after empty members
        (`Reading.joined`), in a file joined there whose members are cut where its records are not
        (`warc_unaligned.joined_unaligned`); False where the file went away."""
        joined = self.reading.joined
        if self.last is None or self.skip is not None or joined is None or self.offset != joined:
            return False
        try:
            return joined_unaligned(self.reading.path, joined)
        except OSError:
            return False

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
            # Where reading went on after empty members, a member starts at `start` whatever its bytes say.
            joined = self.last is None and reading.joined == self.start
            found = resync(reading.path, self.start, self.skip or 0, unaligned=unaligned, at_member=joined)
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


def _skip(path: Path, offset: int, framed: bool, *, at_member: bool = False) -> Skip | None:
    """`skip_member`, None where the file cannot be read again (it went away, say): the error row said."""
    try:
        return skip_member(path, offset, framed=framed, at_member=at_member)
    except OSError:
        return None


def _members_unaligned(path: Path, failure: Failure) -> bool:
    """`warc_unaligned.members_unaligned` at the record framed last, False where the file went away.
    With none framed, the member there is the damaged one: that it inflates to no record's start is its
    damage, no sign of how the file was cut (a per-record file damaged in its first member had been read
    on as bgzip's, and a stored download damaged later in it lost the intact records after it): only
    bgzip's own mark then says so: the file's first member's; or where reading began after empty members
    (`Reading.joined`), that member's, which may start a second file joined to a bgzip one (byte 0's
    mark had the per-record file after it read as bgzip's, and its records after a damaged first member
    were lost), or the member after it (`joined_unaligned`: a pgzip file joined there had been read on
    from its next member that starts a record, and the records before that were lost). Not where reading
    began after damage: that member may be a BGZF block of a stored download, which the file's own
    members are not."""
    try:
        if failure.last is None:
            if failure.reading.joined == failure.start:
                return joined_unaligned(path, failure.start)
            return is_bgzf(path)
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
