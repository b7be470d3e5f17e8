"""A record whose WARC header lines end in bare LF, which `warc_pages` reads again alone in FastWARC's
quirks mode: where it ends, so that reading can go on after it (`bare_lf_record_end`), and whether
anything but padding follows it there (`nothing_after`). Only such a record is read so: quirks mode
passes over bytes that are no record without a word, so it is never the file's whole reading, and where
it goes on after the record is told here, from the file's bytes, not by FastWARC.
"""

from __future__ import annotations

import io
from pathlib import Path

from service.core.warc_compression import file_compression, file_framing, opens_record_member
from service.core.warc_frames import PADDING
from service.core.warc_tail import MAX_HEADER_BYTES, only_padding, record_length


def bare_lf_record_end(path: Path, offset: int) -> int | None:
    """Where the record at byte `offset`, whose WARC header lines end in bare LF, ends, so that reading
    can go on after it: in a plain file, after its header's blank line and its Content-Length; in one
    compressed per record, at the end of its member, where that member holds this record alone. None
    where that cannot be told: no such header with a Content-Length there, a member that holds more, a
    file compressed as one stream (FastWARC's offsets in it are no record starts);
    `warc_frames.Undecodable` where its member does not decode (damaged or cut: the failure FastWARC
    meets there is the record's row).

    FastWARC (2.0.1) reads a header's lines by CRLF alone: the LF-ended lines are one value of the first
    field, and the header runs on to the next CRLF CRLF (the HTTP head's, or the next record's), so the
    record was skipped as of an unknown type, with no row. Its quirks mode reads them, but it also
    passes over bytes that are no record without a word, so `warc_pages` reads only this record in it."""
    with path.open("rb") as handle:
        framing = file_framing(path, handle)
        if framing is None:
            handle.seek(offset)
            declared = record_length(handle.read(MAX_HEADER_BYTES))
            return None if declared is None else offset + declared
        if not opens_record_member(handle, offset, framing):
            return None
        ends: list[int] = []
        head, declared, position = b"", None, 0  # `position`: the output before `chunk`
        for chunk in framing.decode(handle, offset, ends):
            if declared is None:
                head += chunk[: MAX_HEADER_BYTES - len(head)]
                declared = record_length(head)
                if declared is None and len(head) >= MAX_HEADER_BYTES:
                    return None
            if declared is not None and chunk[max(0, declared - position) :].strip(PADDING):
                return None  # the member holds more than this record
            position += len(chunk)
    return ends[0] if declared is not None and position >= declared else None


def nothing_after(path: Path, offset: int) -> bool:
    """Whether the file holds nothing after byte `offset` but the padding that may end it (`PADDING`) and,
    in a zstd or LZ4 file, skippable frames (which FastWARC's decoders pass over): where reading would go
    on after a record read alone (`bare_lf_record_end`), there is nothing to read. Read from there,
    FastWARC took such bytes for a record it cannot read (a false error row), and the end of a zstd file
    with a dictionary (the dictionary frame handed to it alone) for a cut frame."""
    with path.open("rb") as handle:
        skippable = file_compression(path, handle.read(4)) in ("zstd", "lz4")
        size = handle.seek(0, io.SEEK_END)
        position = offset
        while position < size:
            handle.seek(position)
            head = handle.read(8)
            if not (skippable and len(head) == 8 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50):
                return only_padding(handle, position, size)
            position += 8 + int.from_bytes(head[4:], "little")
    return position == size  # not a skippable frame cut off
