"""One page file: what kind of page source a single file is (`file_kind`: by its name's suffix, else by
its first bytes, gunzipped), the compressions no page source is read through (`compression_of`), the wide
encodings a file is sniffed in (`wide_text`), and the bytes of one page, gunzipped and within the page cap
(`gunzip_page`, `read_page`, `read_page_bytes`, `read_file`).

Split out of `service.core.pages` (whose docstring says the rules), so that the JSONL and directory
readers share it without importing `pages`. The page cap is `pages.MAX_PAGE_BYTES`, read at call time
through an import inside the function, never by value: a test lowers it there for every source, and
`pages` imports this module at load time, so an import of `pages` at the top would be circular.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import stat
import zlib
from pathlib import Path
from typing import BinaryIO, Literal

from service.core.content_coding import ContentCodingError, decode_content, undeclared_coding
from service.core.decoding import declared_codec, with_declared_encoding
from service.core.errors import ErrorCode
from service.core.page_row import (
    PageCompressedError,
    PageSourceError,
    PageTooLargeError,
    PageUnreadableError,
    read_error,
)
from service.core.warc_frames import GZIP_MAGIC

HTML_SUFFIXES = (".html", ".htm", ".html.gz", ".htm.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
WARC_SUFFIXES = (".warc", ".warc.gz", ".warc.zst", ".warc.lz4")
_SNIFF_BYTES = 4096  # enough to get past a BOM and leading blank lines to the first real byte

# Compressions no page source is read through, by the suffix a tool gives the file it writes (for the
# refusal of `x.jsonl.zst`, which had said its name "ends in no known suffix") and by the magic bytes it
# starts with (for a `.jsonl` file compressed under its plain name, whose lines split on the byte 0x0A had
# been one garbage error row each, and the run ended with status 0). Gzip is read wherever it is found;
# zstd and LZ4 only in a WARC file (`WARC_SUFFIXES`).
_COMPRESSION_SUFFIXES = {
    ".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2", ".xz": "xz", ".lzma": "lzma", ".lz4": "LZ4",
    ".br": "brotli", ".zip": "zip", ".7z": "7-Zip", ".z": "compress",
}  # fmt: skip
_COMPRESSION_MAGIC = (
    # zstd's frame, or a skippable frame (a dictionary, metadata) before it; bzip2's stream header with its
    # block size and the magic of its first block (or of its end, for an empty stream); xz's and LZ4's
    # frame magic; a zip archive's first local file header.
    (re.compile(rb"\x28\xb5\x2f\xfd|[\x50-\x5f]\x2a\x4d\x18"), "zstd"),
    (re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)"), "bzip2"),
    (re.compile(rb"\xfd7zXZ\x00"), "xz"),
    (re.compile(rb"\x04\x22\x4d\x18"), "LZ4"),
    (re.compile(rb"PK\x03\x04"), "zip"),
)
MAGIC_BYTES = 10  # the longest of them, bzip2's

_SOURCE_KINDS = (
    "a corpus directory with manifest.jsonl (or .jsonl.gz), a JSONL file (.jsonl, .jsonl.gz), a WARC file "
    "(.warc, .warc.gz, .warc.zst, .warc.lz4), a directory of HTML and WARC files, an HTML file "
    "(.html, .htm, optionally .gz)"
)


def gunzip_page(data: bytes) -> bytes:
    """A page's raw bytes, gunzipped when they are gzip (recognised by the magic bytes).

    A page over `pages.MAX_PAGE_BYTES`, gzipped or not, raises `PageTooLargeError`, found without inflating
    more than the cap (a 1 MB gzip file can inflate to 1 GiB, which `gzip.decompress` held whole); a
    corrupt stream raises `PageSourceError`; bytes still compressed after that one gzip (zlib or zstd, or
    gzip in gzip) raise `PageCompressedError`: only the file's own gzip is undone, and what is left was
    binary noise embedded as a page.
    """
    from service.core import pages  # the cap, read at call time where tests patch it (module docstring)

    limit = pages.MAX_PAGE_BYTES
    gzipped = data[:2] == GZIP_MAGIC
    if gzipped:
        try:
            data = decode_content(data, "gzip", limit=limit)
        except ContentCodingError as exc:
            if exc.code == ErrorCode.PAYLOAD_TOO_LARGE:
                raise PageTooLargeError(f"it inflates to more than {limit} bytes, the page cap") from None
            raise PageSourceError(exc.message) from exc
    if len(data) > limit:
        raise PageTooLargeError(f"it has {len(data)} bytes, over the page cap of {_in_bytes(limit)}")
    coding = undeclared_coding(data)
    if coding is not None:
        # zlib, not HTTP's name for it: a file is no HTTP body, and `zlib-flate`/`pigz -z` wrote it.
        name, start = _FILE_CODING_NAMES.get(coding, coding), data[:4].hex(" ")
        if gzipped:
            raise PageCompressedError(
                f"the file holds {name}-compressed bytes once gunzipped (they start {start}): it was "
                "compressed twice; only one gzip, the file's own, is undone"
            )
        raise PageCompressedError(
            f"the file holds {name}-compressed bytes (they start {start}): decompress it first; gzip is "
            "the one compression a page file is read through"
        )
    return data


_FILE_CODING_NAMES = {"deflate": "zlib"}


def read_page(handle: BinaryIO) -> bytes:
    """One page's raw bytes from `handle` (a file, standard input), gunzipped when they are gzip; no
    more than about the page cap is read (`gunzip_page` says what it raises)."""
    from service.core import pages  # the cap, read at call time where tests patch it (module docstring)

    # A gzipped page takes at most its size plus gzip's framing (5 bytes per 64 KiB stored block, a
    # header with the file's name): a file past that bound holds more than the cap.
    bound = pages.MAX_PAGE_BYTES + pages.MAX_PAGE_BYTES // 8192 + 4096
    data = handle.read(bound + 1)
    if len(data) > bound:
        # Said with the file's size where the file system knows it; `bound` is this reader's own figure,
        # which had passed for the page's ("it has more than 16783360 bytes").
        size, cap = _file_size(handle), _in_bytes(pages.MAX_PAGE_BYTES)
        if size is None:  # a pipe: what it held past the bound was never read
            raise PageTooLargeError(f"it holds more than the page cap of {cap}")
        raise PageTooLargeError(f"it has {size} bytes, over the page cap of {cap}")
    return gunzip_page(data)


def _file_size(handle: BinaryIO) -> int | None:
    """The size of the regular file `handle` reads; None for a pipe or a stream without a file."""
    try:
        status = os.fstat(handle.fileno())
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _in_bytes(size: int) -> str:
    """`size` as a person reads it: "16 MiB" for the cap, else its bytes."""
    return f"{size >> 20} MiB" if size and size % (1 << 20) == 0 else f"{size} bytes"


def read_page_bytes(path: Path) -> bytes:
    """The raw bytes of one page file, gunzipped when the file is gzip (see `read_page`)."""
    with path.open("rb") as handle:
        return read_page(handle)


def read_file(path: Path, where: str) -> bytes:
    try:
        return read_page_bytes(path)
    except PageTooLargeError as exc:
        raise PageTooLargeError(f"{where}: {path} is too large: {exc}") from None
    except PageCompressedError as exc:
        raise PageCompressedError(f"{where}: {path}: {exc}") from None
    except PageSourceError as exc:
        raise PageSourceError(f"{where}: cannot read {path}: {exc}") from exc
    except OSError as exc:
        raise read_error(f"{where}: cannot read {path}: {exc}", exc) from exc


def capped(html: bytes, where: str) -> bytes:
    """`html` if it is within the page cap, else `PageTooLargeError`."""
    from service.core import pages  # the cap, read at call time where tests patch it (module docstring)

    if len(html) > pages.MAX_PAGE_BYTES:
        raise PageTooLargeError(
            f"{where}: the page has {len(html)} bytes, over the cap of {pages.MAX_PAGE_BYTES}"
        )
    return html


def declared_page(raw: bytes, label: str | None, where: str) -> tuple[bytes, str | None]:
    """`raw` as `label` declares it read (`with_declared_encoding`), within the cap, and the codec it was
    transcoded from: None where the bytes stayed as read. The transcoded bytes are UTF-8, so a row
    reporting the page's encoding says this codec (a JSONL row's `encoding`, a WARC record's HTTP charset)."""
    html = with_declared_encoding(raw, label)
    return capped(html, where), (declared_codec(label) if html is not raw else None)


def stat_mode(path: Path) -> int | None:
    """`path`'s mode, following symlinks; None where nothing is there (a dangling symlink included);
    OSError where the file system will not say (EACCES on a directory above it, ELOOP, EIO)."""
    try:
        return path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the name
        return None


def compression_of(start: bytes) -> str | None:
    """The compression (`_COMPRESSION_MAGIC`) whose magic bytes a file's content starts with, else None;
    never gzip, which the readers undo wherever they find it."""
    for pattern, name in _COMPRESSION_MAGIC:
        if pattern.match(start):
            return name
    return None


# The start of a file in a wide encoding: its byte-order mark and a first character in ASCII (a JSONL
# file starts with "{" or a blank, an HTML page with "<" or a blank), so that a line of other bytes
# that are not UTF-8 ("\xff\xfe\n") stays the bad row it is. UTF-32LE's mark starts with UTF-16LE's:
# it is tried first.
_WIDE_STARTS = (
    (re.compile(b"\xff\xfe\x00\x00"), "UTF-32LE"),
    (re.compile(b"\x00\x00\xfe\xff"), "UTF-32BE"),
    (re.compile(b"\xff\xfe[\x01-\x7f]\x00"), "UTF-16LE"),
    (re.compile(b"\xfe\xff\x00[\x01-\x7f]"), "UTF-16BE"),
)
_WIDE_WITHOUT_BOM = "UTF-16 or UTF-32"


def wide_text(start: bytes) -> str | None:
    """The wide encoding (UTF-16 or UTF-32, with its byte order) a file starting with `start` (its
    first 4 bytes, when it has them) is written in, by its byte-order mark (`_WIDE_STARTS`); "UTF-16 or
    UTF-32" without one, for a NUL byte among them, which UTF-8 JSON never holds (U+0000 in a string is
    escaped); None for neither."""
    for pattern, name in _WIDE_STARTS:
        if pattern.match(start):
            return name
    return _WIDE_WITHOUT_BOM if b"\x00" in start[:4] else None


def _head(path: Path) -> bytes:
    """The first bytes of a file's content, gunzipped when the file is gzip."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_SNIFF_BYTES)
            if head[:2] == GZIP_MAGIC:
                handle.seek(0)
                with gzip.GzipFile(fileobj=handle) as unzipped:
                    head = unzipped.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise read_error(f"cannot read {path}: {exc}", exc) from exc
    return head


def source_mode(path: Path, source: Path) -> int | None:
    """The mode of `path` (the source `source`, or its manifest), following symlinks; None where nothing
    is there. The one rule for a source the file system will not let this process look at: any other
    refusal is `PageUnreadableError` naming the source and why. EACCES (a directory on the path of mode
    000, or the source directory itself) was a traceback out of `Path.is_dir` in `htmllm extract` and a
    bare "[Errno 13]" line without a code in `htmllm embed`; ELOOP read as "does not exist"."""
    try:
        return stat_mode(path)
    except OSError as exc:  # EACCES, ELOOP, EIO
        why = exc.strerror or str(exc)
        if exc.errno == errno.EACCES:  # stat's EACCES: search permission on a directory on the path
            why += " (a directory on its path is closed to this user)"
        raise PageUnreadableError(f"page source {source} cannot be looked at: {why}") from exc


def file_kind(path: Path) -> Literal["jsonl", "warc", "html"]:
    """What a single file holds: by its name's suffix, else by its first bytes, else refused."""
    kind = kind_by_name(path.name)
    if kind is not None:
        return kind
    head = _head(path)
    kind = _kind_by_content(head)
    if kind is not None:
        return kind
    coding, how = _compressed_name(path.name), "its name"
    if coding is None:
        coding, how = compression_of(head), "its first bytes"
    if coding is not None:
        # `x.jsonl.zst` had been told its name "ends in no known suffix", .zst being a WARC's.
        if how == "its name":
            inner = kind_by_name(path.name[: path.name.rindex(".")])
            what = {"jsonl": "a JSONL file", "warc": "a WARC file", "html": "an HTML file"}.get(
                inner or "", "a file"
            )
            said = f"cannot read {path}: it is {what} compressed with {coding} (by its name)"
        else:
            said = f"cannot tell what {path} holds: it is compressed with {coding} (by its first bytes)"
        raise PageSourceError(
            f"{said}, which is not read here: JSONL and HTML files are read plain or gzipped, WARC files "
            "also compressed with zstd or LZ4 (.warc.zst, .warc.lz4): decompress it first, or compress it "
            f"with gzip; a page source is {_SOURCE_KINDS}"
        )
    raise PageSourceError(
        f"cannot tell what {path} holds: its name ends in no known suffix and its content (gunzipped "
        f"when gzip) starts with none of '{{' (JSONL), 'WARC/' (WARC), '<' (HTML); a page source is "
        f"{_SOURCE_KINDS}"
    )


def kind_by_name(name: str) -> Literal["jsonl", "warc", "html"] | None:
    """What a file holds by its name's suffix (any case), the first half of the one rule for a file
    (`file_kind`, a row's `file`); None for a name with none of the known suffixes."""
    name = name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(WARC_SUFFIXES):
        return "warc"
    if name.endswith(HTML_SUFFIXES):
        return "html"
    return None


def _kind_by_content(head: bytes) -> Literal["jsonl", "warc", "html"] | None:
    """What a file holds by its first bytes (gunzipped, when it is gzip), the rule's second half:
    JSONL when it starts with `{`, WARC with `WARC/`, HTML with `<`, after a byte order mark and white
    space, in UTF-8 or in the UTF-16 or UTF-32 text it is (`wide_text`); None for anything else."""
    wide = wide_text(head[:4])
    if wide is not None:  # sniffed as the text it is: a UTF-16 page is one page, UTF-16 JSONL refused
        codec = wide[:6].lower()  # "utf-16", "utf-32": their BOM says the byte order
        if wide == _WIDE_WITHOUT_BOM:
            codec = "utf-16-be" if head[0] == 0 else "utf-16-le"
        head = head.decode(codec, "ignore").encode("utf-8", "ignore")
    start = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if start.startswith(b"{"):
        return "jsonl"
    if start.startswith(b"WARC/"):
        return "warc"
    if start.startswith(b"<"):
        return "html"
    return None


def _compressed_name(name: str) -> str | None:
    """The compression a file's name says it holds (`_COMPRESSION_SUFFIXES`), else None."""
    dot = name.rfind(".")
    return _COMPRESSION_SUFFIXES.get(name[dot:].lower()) if dot > 0 else None
