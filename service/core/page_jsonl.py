"""A JSONL file's or a corpus manifest's rows as pages (`iter_jsonl`, `count_rows`) and the page files its
rows name (`named_files`): a row's fields and their types, its nesting limit (`MAX_ROW_DEPTH`), its
`encoding`, a `file` that must be one page, and the lines too long, streams broken off and files in
UTF-16 or another compression that are refused.

Split out of `service.core.pages` (whose docstring says the rules), which calls these and re-exports
`named_files`. A line's bound is `pages.READ_FACTOR * pages.MAX_PAGE_BYTES`, read at call time as
`page_files` reads the cap.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import stat
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

from service.core.decoding import with_declared_encoding
from service.core.encoding_labels import known_label
from service.core.media_types import charset_parameter
from service.core.page_files import (
    MAGIC_BYTES,
    capped,
    compression_of,
    declared_page,
    kind_by_name,
    read_file,
    stat_mode,
    wide_text,
)
from service.core.page_row import (
    Page,
    PageCompressedError,
    PageSourceError,
    PageTooLargeError,
    PageUnreadableError,
    error_page,
    read_error,
    valid_json,
)
from service.core.warc_frames import GZIP_MAGIC

# How deep a JSONL row's arrays and objects may nest, the row itself 1 (`_nests_deeper`): the API's
# JSON parser's limit (pydantic's, 200). `json.loads` and `valid_json` recurse (`valid_json` two frames
# a level), and the RecursionError of a row nested some 450 deep had ended the run (and every resume of
# it); caught, where it struck depended on how deep the reader's caller was. A fixed depth, checked
# without recursion, is one rule for every caller: it is far above any real row's (a crawl's metadata
# nests a few levels) and leaves the recursion limit's 1,000 frames room for a caller 500 deep.
MAX_ROW_DEPTH = 200
# The end of a row's error for a row nested deeper; and for the recursion limit struck all the same (a
# caller hundreds of frames deep, a lowered limit). Such a row is JSON: "is not JSON" had said otherwise.
NESTED_TOO_DEEP = f"nests arrays and objects more than {MAX_ROW_DEPTH} deep (the limit for a row)"
TOO_DEEP_TO_READ = "nests arrays and objects too deeply to be read (recursion limit exceeded)"

_SKIP_STEP = 1 << 20  # bytes read at a time to pass over the rest of a row too long to keep
# The longest JSONL `encoding` parsed as a charset parameter, as the API bounds a Content-Type header it
# parses: the longest label a browser knows has 19 characters, and the email parser took 8.5 s over a
# row's 1 MiB of `a=b; ` (it is quadratic in the parameters), which a longer label is refused without.
MAX_ENCODING_CHARS = 1024


def _json_type(value: Any) -> str:
    """How JSON names a value's type, for messages about a field of the wrong type."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "a string" if isinstance(value, str) else "null"


def _row_id(row: Any, index: int) -> str:
    """A row's `id` (an integer as its decimal text), or its position when it has none, it is not a
    string or an integer (`_row_page` refuses that row), or the row is not an object.

    The fallback can equal another row's real id (`"id": 7` at row 3, a bad line at row 7: both "7"),
    so ids need not be unique; the bulk commands' rows carry the position itself as `index`, the key
    that tells every row apart."""
    page_id = row.get("id") if isinstance(row, dict) else None
    if isinstance(page_id, str):
        return page_id
    if isinstance(page_id, int) and not isinstance(page_id, bool):
        return str(page_id)
    return str(index)


def _row_page(row: Any, base: Path, index: int, where: str) -> Page:
    if not isinstance(row, dict):
        raise PageSourceError(f"{where} is not a JSON object")
    raw_id = row.get("id")
    if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, str | int)):
        # A float or an object has no one obvious text: guessing one could merge two pages' ids.
        raise PageSourceError(f"{where}: 'id' must be a string or an integer, not {_json_type(raw_id)}")
    url = row.get("url")
    if url is not None and not isinstance(url, str):
        # As any other field of the wrong type: `"url": 12345` had become null in silence.
        raise PageSourceError(f"{where}: 'url' must be a string, not {_json_type(url)}")
    try:
        meta = {
            k: valid_json(v) for k, v in row.items() if k not in ("id", "html", "file", "url", "encoding")
        }
    except RecursionError:  # within `MAX_ROW_DEPTH`, but the caller's frames and these met the limit
        raise PageSourceError(f"{where} {TOO_DEEP_TO_READ}") from None
    page_id = valid_json(_row_id(row, index))
    html_text, file_name = row.get("html"), row.get("file")
    source_encoding: str | None = None
    if html_text is not None and file_name is not None:
        # Which one is the page is the writer's word, not ours: `html` was taken and `file` left unread
        # in silence (two dumps merged, a row whose text was meant to be dropped).
        raise PageSourceError(f"{where} has both 'html' and 'file': a row is one page, give one of them")
    if html_text is not None:
        if not isinstance(html_text, str):
            raise PageSourceError(f"{where}: 'html' must be a string, not {_json_type(html_text)}")
        # A lone surrogate ("\ud800" is valid JSON) cannot be UTF-8: one U+FFFD, as the API reads the
        # same text (`valid_json`); passed on as its three bad bytes it had read as three U+FFFD.
        # The text is UTF-8 now, whatever charset its <meta> names.
        html = capped(with_declared_encoding(valid_json(html_text).encode("utf-8"), "utf-8"), where)
        # Read as text, the page is UTF-8 whatever its <meta> says (which the parser would otherwise
        # follow where the bytes read the same either way, reporting that codec; the API's JSON routes
        # report utf-8 for the same string).
        source_encoding = "utf-8"
    elif file_name is not None:
        if not isinstance(file_name, str):
            raise PageSourceError(f"{where}: 'file' must be a path (a string), not {_json_type(file_name)}")
        path = base / file_name
        problem = _not_a_file(path)  # gone (a dangling symlink too), a directory: what reading it would say
        if problem is not None:
            raise PageUnreadableError(f"{where} names {problem}")
        _check_page_file(path, None, where)  # by its name, before a WARC of gigabytes is read
        encoding = row.get("encoding")
        if encoding is not None and not isinstance(encoding, str):
            raise PageSourceError(f"{where}: 'encoding' must be a charset name, not {encoding!r}")
        if isinstance(encoding, str) and not encoding.strip():
            encoding = None  # "": no charset was known to the row's writer, as a missing key says
        if encoding is not None:
            encoding = _row_charset(encoding, where)
        raw = read_file(path, where)
        _check_page_file(path, raw, where)  # by its content, where its name says nothing
        html, source_encoding = declared_page(raw, encoding, where)
    else:
        raise PageSourceError(f"{where} has neither 'html' nor 'file'")
    return Page(
        id=page_id,
        html=html,
        url=None if url is None else valid_json(url),
        meta=meta,
        encoding=source_encoding,
    )


def _check_page_file(path: Path, content: bytes | None, where: str) -> None:
    """Refuse a row's `file` that is a page source of its own, a WARC or JSONL file: by its name's suffix,
    as a single file named as the input is told (`kind_by_name`), else (given `content`, its bytes
    gunzipped) by a start only such a file has (`_source_by_content`). Read as one page, a WARC's bytes
    had been one page of WARC headers and its real pages lost. A file whose name or start says nothing
    is the page the row says it is."""
    kind = kind_by_name(path.name)
    if kind is None and content is not None:
        kind = _source_by_content(content)
        how = "its content"
    else:
        how = "its name"
    if kind in ("warc", "jsonl"):
        what = "WARC" if kind == "warc" else "JSONL"
        raise PageSourceError(
            f"{where} names {path}, a {what} file (by {how}), not a page: a row's file is one HTML page; "
            f"pass the {what} file as the input itself"
        )


# A WARC file's first line, its version (`WARC/1.0`, `WARC/1.1`), as a WARC writer puts it at the start.
_WARC_VERSION_LINE = re.compile(rb"WARC/1\.[01]\r?\n")
_JSON_BLANKS = re.compile(rb"[ \t\r\n]*")  # JSON's white space


def _source_by_content(content: bytes) -> Literal["jsonl", "warc"] | None:
    """What page source a row's `file` is by its bytes: "warc" where they start with a WARC version line,
    "jsonl" where their first line that is not blank (after a UTF-8 byte order mark) is a JSON object;
    else None, a page.

    Stricter than the rule that tells a single file named as the input (`_kind_by_content`, a start of
    `{` or `WARC/`): the input must be some page source, where a row names a page and may be any page.
    That rule had refused a template's page starting `{{ header }}` and prose starting "WARC/ is"."""
    if _WARC_VERSION_LINE.match(content):
        return "warc"
    after_bom = 3 if content.startswith(codecs.BOM_UTF8) else 0
    blank = _JSON_BLANKS.match(content, after_bom)  # (always a match, empty or not)
    start = blank.end() if blank else after_bom
    if content[start : start + 1] != b"{":
        return None
    end = content.find(b"\n", start)
    try:
        row = json.loads(content[start : end if end >= 0 else len(content)])
    except (ValueError, RecursionError):  # not JSON (a template's `{{`), or nested too deep to tell
        return None
    return "jsonl" if isinstance(row, dict) else None


def _row_charset(label: str, where: str) -> str:
    """A row's `encoding`, the charset its file was served with, read as that header's `charset`
    parameter is (`charset_parameter`: `"windows-1252"` and `windows-1252;` are windows-1252, as in a
    WARC record's HTTP header), so that a page reads the same from a JSONL row as from the record it came
    in; they had been taken as labels Python knows and a browser does not, ignored, and the page read
    by its own <meta>. A label a browser ignores but Python knows (`latin-1`, `utf-7`) is ignored as a
    server's header is (`decoding.declared_codec`); one nobody knows (`'utf-8'`, `base64`, a label past
    `MAX_ENCODING_CHARS`, left unparsed) is a typo in the row, `PageSourceError`: it had been ignored as
    well, the page read by its own <meta> or by guess."""
    named = charset_parameter(label) if len(label) <= MAX_ENCODING_CHARS else None
    if named is None or not known_label(named):
        shown = label if len(label) <= 100 else f"{label[:100]}..."
        raise PageSourceError(
            f"{where}: 'encoding' {shown!r} names no charset (a label such as utf-8, windows-1252, shift_jis)"
        )
    return named


def _not_a_file(path: Path) -> str | None:
    """None where `path` is a file, else what is there instead. A path that cannot be looked at says
    why: `Path.is_file` raised EACCES on a parent directory out of the whole run, and "a missing file"
    would send the reader looking for a file that is there."""
    try:
        mode = stat_mode(path)
    except OSError as exc:  # EACCES on a parent directory, ELOOP, EIO
        return f"{path}, which cannot be looked at: {exc.strerror or exc}"
    if mode is None:
        return f"a missing file {path}"
    return None if stat.S_ISREG(mode) else f"{path}, which is not a file"


def _open_jsonl(path: Path) -> IO[bytes]:
    """`path`'s lines as bytes, gunzipped when it is gzip; `PageSourceError` for a file in UTF-16 or
    UTF-32 (`wide_text`), whose lines split on the byte 0x0A would read as rows of garbage."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise PageUnreadableError(f"cannot read {path}: {exc.strerror or exc}") from exc
    stream: IO[bytes] = handle
    try:
        if handle.read(2) == GZIP_MAGIC:
            handle.seek(0)
            stream = gzip.GzipFile(fileobj=handle)  # type: ignore[assignment]
        else:
            handle.seek(0)
        try:
            start = stream.peek(MAGIC_BYTES)[:MAGIC_BYTES]  # type: ignore[attr-defined]
        except (OSError, EOFError, zlib.error):
            start = b""  # a gzip stream broken from its start: `_lines` reports it as the row it is
        wide = wide_text(start[:4])
        coding = compression_of(start)
    except BaseException:
        stream.close()
        handle.close()
        raise
    if wide is not None:
        stream.close()
        handle.close()
        raise PageSourceError(
            f"{path} is {wide} text (by the byte-order mark or NUL bytes at its start; Windows PowerShell "
            f"writes UTF-16 by default); a JSONL file is UTF-8: convert it first (iconv -f {wide[:6]} -t "
            "UTF-8, or PowerShell's Out-File -Encoding utf8)"
        )
    if coding is not None:
        stream.close()
        handle.close()
        inner = ", once gunzipped" if stream is not handle else ""
        raise PageCompressedError(
            f"{path} is compressed with {coding} (by its first bytes{inner}); a JSONL file is read as plain "
            "or gzipped UTF-8 text: decompress it first, or compress it with gzip"
        )
    return stream


def _lines(handle: IO[bytes], path: Path) -> Iterator[tuple[int, bytes | PageSourceError]]:
    """(line number, line) in order; a line over the row bound comes as a `PageTooLargeError` (its
    bytes passed over, never held; one of blanks only is a blank line, no row); a gzip stream that
    breaks off ends with the error instead."""
    from service.core import pages  # the cap, read at call time where tests patch it (module docstring)

    limit = pages.READ_FACTOR * pages.MAX_PAGE_BYTES
    line_number = 0
    while True:
        try:
            line = handle.readline(limit + 1)
            too_long = len(line) > limit and not line.endswith(b"\n")
            blank = too_long and line.isspace()
            while too_long:  # the rest of the line, a step at a time
                rest = handle.readline(_SKIP_STEP)
                blank = blank and (not rest or rest.isspace())
                if not rest or rest.endswith(b"\n"):
                    break
        except (OSError, EOFError, zlib.error) as exc:
            yield line_number + 1, read_error(f"{path}: cannot read past line {line_number}: {exc}", exc)
            return
        if not line:
            return
        line_number += 1
        if too_long and not blank:
            message = f"{path}: line {line_number} has more than {limit} bytes, too many for one page"
            yield line_number, PageTooLargeError(message)
        elif not too_long:
            yield line_number, line


def iter_jsonl(path: Path) -> Iterator[Page]:
    """Rows in file order; `index` counts rows (blank lines are not rows), messages name the line. A bad
    row comes back as a Page with `error` set; `iter_pages` decides whether that raises."""
    with _open_jsonl(path) as handle:
        index = 0
        for line_number, line in _lines(handle, path):
            if isinstance(line, PageTooLargeError):  # a row, unread: named by its position
                yield error_page(str(index), line)
                index += 1
                continue
            if isinstance(line, PageSourceError):
                yield error_page(str(index), line)
                return
            if not line.strip():
                continue
            where = f"{path}: line {line_number}"
            row: Any = None
            try:
                row = _parsed_row(line, where)
                page = _row_page(row, path.parent, index, where)
            except PageSourceError as exc:
                page = error_page(valid_json(_row_id(row, index)), exc)
            yield page
            index += 1


def _parsed_row(line: bytes, where: str) -> Any:
    """A JSONL line's value; a line that is not JSON, or nests deeper than `MAX_ROW_DEPTH`, raises
    `PageSourceError`, the row's error. A row nested too deep is named by its position (`_row_id` of
    None), whether or not the parser got through it, so that its row is the same from any caller."""
    try:
        row = json.loads(line)  # from bytes: a line that is not UTF-8 is a bad row, not a crash
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise PageSourceError(f"{where} is not JSON: {exc}") from exc
    except RecursionError:
        # More than `MAX_ROW_DEPTH` deep, unless the caller is deeper than it may be: told by the line's
        # brackets, so that the row's error is the same from any caller that leaves the parser room.
        deep = _line_nests_deeper(line, MAX_ROW_DEPTH)
        raise PageSourceError(f"{where} {NESTED_TOO_DEEP if deep else TOO_DEEP_TO_READ}") from None
    if _nests_deeper(row, MAX_ROW_DEPTH):
        raise PageSourceError(f"{where} {NESTED_TOO_DEEP}")
    return row


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value's arrays and objects nest more than `limit` deep (`[]` is 1 deep),
    walked with a stack of its own, not recursion; a row's values other than arrays and objects (its
    page's text) cost nothing."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


# A JSON string (an escaped quote, `\"`, ends none) or a bracket: the brackets outside strings nest a value.
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _line_nests_deeper(line: bytes, limit: int) -> bool:
    """Whether a JSON line's brackets outside its strings nest more than `limit` deep, read from the
    line (`_nests_deeper` for one the parser could not get through); stops at the first bracket past
    the limit, so a line of 100,000 brackets costs `limit` steps."""
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(line):
        mark = match[0]
        if mark in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif mark in (b"]", b"}"):
            depth -= 1
    return False


# What a line naming a page file holds: its key `"file"`, or a letter of it as a JSON escape (`"fil\u0065"`
# is the same key). Inside a JSON string a quote is escaped, so a page's text rarely matches; a line
# that does is only parsed, never taken for a row that names a file.
_FILE_KEY = re.compile(rb'"file"|\\u006[569cC]')


def _row_file(row: Any) -> str | None:
    """The page file a row is read from (`_row_page`): its `file`, when it has no `html`."""
    if isinstance(row, dict) and row.get("html") is None and isinstance(row.get("file"), str):
        return str(row["file"])
    return None


def named_files(path: Path) -> Iterator[tuple[str, Path]]:
    """The page files the rows of a JSONL file (or a corpus's manifest) name, in row order: (the name as
    the row writes it, the path `_row_page` reads), for the bulk commands' input identity
    (`resume_state.input_identity`), which looks at them with a stat each, never reads them. The lines
    are read as `iter_jsonl` reads them, but a line is parsed only where it may hold a `file` key
    (`_FILE_KEY`): a dump of rows with their `html` inline is read through, not parsed. A line that is
    no row, or names no file, names nothing (its row is an error row, or holds its page); a stream
    that breaks off ends the list where its rows end."""
    with _open_jsonl(path) as handle:
        for _, line in _lines(handle, path):
            if isinstance(line, PageTooLargeError):  # a row, unread
                continue
            if isinstance(line, PageSourceError):
                return
            if not _FILE_KEY.search(line):
                continue
            try:
                name = _row_file(_parsed_row(line, ""))
            except PageSourceError:  # not JSON, or nested too deep: an error row
                continue
            if name is not None:
                yield name, path.parent / name


def count_rows(path: Path, limit: int | None, stop: threading.Event | None) -> int | None:
    """Non-blank lines of a (gzipped) JSONL file, as `iter_jsonl` counts rows; a stream that breaks
    off counts the error row it ends with."""
    rows = 0
    with _open_jsonl(path) as handle:
        for _, line in _lines(handle, path):
            if stop is not None and stop.is_set():
                return None
            if isinstance(line, PageTooLargeError):  # a row, unread
                line = b"{"
            elif isinstance(line, PageSourceError):
                return rows + 1
            if not line.isspace():
                rows += 1
                if limit is not None and rows >= limit:
                    break
    return rows
