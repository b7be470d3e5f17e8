"""`htmllm extract`: bulk plain-text extraction of a page collection into JSONL, with a progress bar.

One output row per input page, in input order, with its input position (`index`, from 0) first, as
`htmllm embed`'s rows have it: the one key that tells every row apart, since a row without an id is
named by its position and so can share its `id` with a row whose real id is that number. Every row ends
with `http_status`, `content_type` and `warc_truncated`: a WARC page's HTTP status, Content-Type and
WARC-Truncated (why the crawler cut its record short, null for a whole one), null for any other page
(`embed.response_fields`), so that 404 bodies, empty redirects and partial pages can be filtered out. A
page an extractor fails on, and an input row that cannot be read (not JSON, a missing file; a page over
the pruner's 16 MiB cap, `payload_too_large`, see `service.core.pages`), gets an `error` object in its
row rather than stopping the run; only an input source that does not exist or cannot be read, an
unwritable output path or a run state that cannot be resumed fails the command: one line with its code,
as `htmllm embed` says it, and exit code 1. A failure that a later attempt may not repeat (`TRANSIENT`:
`not_ready`, the page's extractor process killed from outside, by the OOM killer or `kill -9`, in each
of the pool's tries) is never written, as `htmllm embed` leaves such a page: the page is left for the
next run, and the command exits 1 without merging (streamed, where nothing resumes, its row says so).

Resumable as `htmllm embed` is, with the same rules (`resume_state`): rows go, in input order, to
append-only parts in `<output>.parts/` (each a JSON header line with its first index, its pages' ids and
its body's length, then its rows; written whole or not at all), under a lock, with `run.json` pinning the
input and the options that determine the rows. A restart after `kill -9` or Ctrl-C skips the pages done
(checking they are the same pages) and extracts the rest; a restart with other options, or an input that
changed, is refused with a message naming what differs, but for a larger --limit (or none): it goes on
from an interrupted run of a smaller one, as `htmllm embed` does (`resume_state.limit_raised`). When every
page is done the parts are concatenated into `<output>` under a temporary name, renamed over the old file
and the parts removed.
A missing output directory is made, and an output under a file refused before anything is read, as
`htmllm embed` does (`options.check_output_parent`); so are the same integer options bounded the same
way (`options.at_least`: `--limit 0` is a usage error in both).
A finished output records nothing of how it was made (a JSONL file has no metadata), so a later run
extracts again and replaces it, as it always did (known by its first row, see below), a run of a larger
--limit too: nothing tells that the output's rows are its first pages under the same options.

The input is opened before the output is touched: a typo in `--input`, a crash or a Ctrl-C leaves an
existing output as it was. Ctrl-C stops at once (queued pages cancelled, busy workers killed) with exit
code 130; SIGTERM the same way with 143 and SIGHUP with 129 (`sigterm_as_ctrl_c`), keeping the rows held
up to the first that records a failure (a worker killed by the same SIGTERM fails a page not for its own
sake). An output that is the input (or the input directory's manifest) is refused, since the run would
replace what it reads, and so is a page file of the input (one a directory's listing holds, or a
manifest's or JSONL file's row names; through a symlink or a hard link too): taken for the run's own
output, or read as a page, it was replaced by rows with exit code 0. An existing file this command did
not write (its first line is not a row of it: `_ROW_START`) is replaced only with --overwrite, as
`htmllm embed` replaces another's; its own earlier output, and an empty file, are replaced without. Each
refusal is a usage error (exit code 2) before a page is read, or anything written or locked, as is an
output named as a compressed file (`.gz`, `.zst`, ...: `options.COMPRESSED_SUFFIXES`). Standard
output (`-`) and an existing output that is not a regular file (`/dev/null`, a FIFO) are written in
place, and such a run cannot be resumed. A reader that goes away (`--output - | head -1`) ends the run
quietly with status 141 (`PIPE_CLOSED`), its workers stopped.

Usage errors too, before any page is extracted: an option no extractor of the run reads (`--seed`
without `--order random`, `--order` but for the union, `--language` where jusText does not run:
`_unused_option`), and a --memory-limit-mb under which an extractor the run calls fails on a tiny page
it extracts without one (`_check_memory_limit`): below the libraries' own footprint every row had been
a failure, exit code 0, and done for a resume. A directory of pages holding files the reader passes
over by their names (`.xhtml`, `.php`, no suffix) has them counted, with their names, at the end of the
summary line (`resume_state.unread_files_note`), as `htmllm embed` counts them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from service.commands.exits import PIPE_CLOSED, discard_stdout
from service.commands.options import (
    STDIN_INPUT,
    OptionError,
    at_least,
    check_output_parent,
    compressed_output_problem,
)
from service.commands.resume_state import (
    INPUT_KEY,
    TEMP_SUFFIX,
    Deferred,
    InputWalk,
    PartWriter,
    Termination,
    UnreadablePart,
    check_has_pages,
    clean_leftovers,
    complete_parts,
    done_set,
    holds_parts,
    input_identity,
    installed_version,
    own_files,
    parts_dir,
    pin_settings,
    pinned_settings,
    remove_parts,
    run_lock,
    sigterm_as_ctrl_c,
    unread_files_note,
)
from service.core.atomic_files import replaced_atomically
from service.core.encoding_labels import whatwg_name
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from tqdm import tqdm

    from service.core.extract import Extraction, ExtractorPool
    from service.core.pages import Page

_EXTRACTOR_CHOICES = ("union", "all", "resiliparse", "trafilatura", "justext")
_EXTRACTOR_DISTRIBUTIONS = ("resiliparse", "trafilatura", "justext")
# Bumped when the rows change; run.json pins it, so parts of an older layout are never merged with new.
# 2: a page over 16 MiB is a `payload_too_large` row (format 1 extracted it).
# 3: text mostly U+FFFD or control characters fails the filter, a failed attempt says why (`reason`),
#    jusText reports "en" for its English fallback, and `encoding` is a JSONL row's declared codec;
#    a part's `errors` counts an `all` row whose every extractor failed.
# 4: every row starts with its input position, `index`.
# 5: texts are normalised (no invisible format characters, NFC) and ruby readings dropped, a word needs
#    a letter or digit, resiliparse keeps lone characters, trafilatura and jusText parse with huge_tree,
#    and an output without words never passes.
# Since then a change of the texts alone bumps `service.core.extract.EXTRACTION_VERSION`, pinned beside it.
# 6: a row given as `html` text reports `encoding` utf-8, as /v1/extract's JSON route does (it had
#    reported the codec its <meta> names where the text reads the same in it).
# 7: every row ends with `http_status` and `content_type`, a WARC page's (`embed.response_fields`), else
#    null.
# 8: a WARC's HTTP response with no body and no Content-Type (a bare redirect) is a row, as in embed's
#    format 4 (it had been passed over: every later row's `index` is one more).
# 9: a JSONL row with both `html` and `file`, or whose `encoding` names no charset, is an error row (the
#    `file` and the label had been ignored in silence); a WARC's `url` loses WARC 1.0's angle brackets,
#    and a response record without a WARC Content-Type whose block is an HTTP response is a row (every
#    later row's `index` is one more); a corrupt member of a per-record .warc.gz is one row and the
#    records after it are read.
# 10: every row ends with `warc_truncated` too; a WARC record without a WARC-Record-ID inside a compressed
#    stream is `<file>#<n>` (records in one gzip member had shared an id); a corrupt zstd or LZ4 frame of
#    a per-record file (or a gzip member FastWARC stops at quietly) is one row and the records after it
#    are read (they had been lost).
# 11: a .warc.gz whose gzip members do not line up with records (bgzip, pgzip) has no false error row at
#    its end; a record whose WARC header lines end in LF alone is a page (plain and per-record files) or
#    a row saying so (one-stream files), not skipped; reading never resumes inside a damaged member (a
#    stored .warc.gz made pages); the messages of undecompressable members changed.
# 12: a corrupt member of a bgzip/pgzip .warc.gz is one row and the records after it are read (reading had
#    ended there); a record whose header has no WARC-Type field is an error row (it had vanished); the
#    fence in a damaged member holding a stored .warc.gz follows the record that shows it; untyped WARC
#    responses starting with a BOM, in UTF-16 or content-coded are rows (an undecodable coding an error
#    row); a JSONL `encoding` is read as an HTTP charset parameter (`"windows-1252"` and `windows-1252;`
#    are used, `'utf-8'`-style labels are validation_error rows).
# 13: the records after an empty gzip member or LZ4 frame are read (two bgzip files joined by `cat` hold
#    one between them; reading had ended there, silently); a JSONL row nested too deep, whose `url` is
#    not a string or whose `file` is a WARC or JSONL file is a validation_error row; a corpus's
#    manifest.jsonl.gz is read; a directory of pages leaves out hidden files and __MACOSX/ and walks
#    each directory once, however many symlinks lead to it.
ROW_FORMAT = 13
# Failures a later attempt may not repeat: written as rows they would be "done" for good (`htmllm embed`'s
# rule; of its codes only this one reaches an extraction).
TRANSIENT = frozenset({ErrorCode.NOT_READY})  # the page's extractor process killed from outside
# How the first line of every output this command writes starts (`json.dumps`'s separators, UTF-8 as it
# is): `index`, `id` (a string), `url` (a string or null), then `error`, `extractions` or the text. A
# file starting otherwise is not replaced without --overwrite; a user's JSONL of pages or texts (`"id"`,
# `"url"`, `"text"`) has no `index`, and neither had rows before format 4, which are refused once. Keys
# added since (format 7's `http_status`, `content_type`, format 10's `warc_truncated`) go at a row's end,
# so every format from 4 on starts this way.
_JSON_STRING = rb'"(?:[^"\\\n]|\\.)*"'
_ROW_START = re.compile(
    rb'\{"index": \d+, "id": ' + _JSON_STRING + rb', "url": (?:null|' + _JSON_STRING + rb"), "
    rb'"(?:error|extractions|text)": '
)
_START_BYTES = 1 << 20  # read of an existing output to find its first row's keys: past any real id or url
# The union's order without --order (`service.core.extract.DEFAULT_ORDER`, as run.json pins it).
_DEFAULT_ORDER = "resiliparse,trafilatura,justext"
DEFAULT_MEMORY_LIMIT_MB = 2048
# The sections of the test page of a --memory-limit-mb (`_probe_page`): about 340 KB of HTML.
_PROBE_SECTIONS = 400
# A --memory-limit-mb from here up is not tested (`_check_memory_limit`): four times what the test page
# needs, so the default run does not pay its half second.
_PROBED_BELOW_MB = 512


def _probe_page() -> str:
    """The test page of a --memory-limit-mb (`_check_memory_limit`): an article of English prose, links
    and lists, about 340 KB, the size of a large real page. A 1 KB page passed at 109 MiB, one MiB over
    what a worker holds once started, where 14 of 20 real pages then failed at 110 MiB; this one passes
    from about 125 MiB, where 1 of 20 did at 120."""
    paragraph = (
        "<p>This is a short paragraph of plain English text, written so that every extractor has some "
        "work to do with it, and the language of the page can be told from its words. <a href='/x'>A "
        "link</a> and <b>bold</b> words.</p>"
    )
    items = "<ul>" + 5 * "<li><a href='/l'>an item</a></li>" + "</ul>"
    body = "".join(
        f"<div class='c{i}'><h2>Section {i}</h2>{3 * paragraph}{items}</div>" for i in range(_PROBE_SECTIONS)
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>A test page</title></head><body>"
        f"<nav><a href=/>Home</a></nav><article>{body}</article><footer>Copyright</footer></body></html>"
    )


# The output is plain JSONL, so a name that says it is compressed is refused: `--output out.jsonl.gz` was
# written as plain JSON under a gzip name, which zcat (and a tool choosing its reader by the name) refused,
# while `--input` reads a `.jsonl.gz` as gzip. Writing gzip instead would leave the rows' parts, their
# resume and the finished file's replacement over an earlier output to another format; a user compresses
# the finished file. These are the suffixes the page reader decompresses (`.gz`; a WARC's `.zst`, `.lz4`)
# and the other common ones, matched case-insensitively.
class OutputRefused(OptionError):
    """An --output the run must not replace (the input, a page file of it, or without --overwrite a file
    this command did not write) or must not write (a compressed file's name): a usage error, exit code 2,
    before a page is read or anything written."""


class MemoryLimitTooLow(OptionError):
    """A --memory-limit-mb under which an extractor the run calls cannot extract a tiny page, though it
    can without one (`_check_memory_limit`): a usage error, exit code 2, before any page is extracted."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="extract plain text from pages with resiliparse, trafilatura, jusText or their union",
        description="Extract the plain text of every page of a collection into a JSONL file.",
    )
    parser.add_argument(
        "--extractor",
        default="union",
        choices=_EXTRACTOR_CHOICES,
        help="one extractor, 'union' (first output that passes the filter) or 'all' (every output)",
    )
    parser.add_argument(
        "--input",
        required=True,
        help=(
            "page source: a corpus directory with manifest.jsonl(.gz), a JSONL(.gz) file, a WARC file, "
            "an HTML or WARC directory, an HTML file"
        ),
    )
    parser.add_argument(
        "--output",
        required=True,
        help="JSONL file to write (plain: a compressed file's name, .gz and the like, is refused), or - for "
        "standard output",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output that was not written by htmllm extract (a page file of the input "
        "is refused all the same); its own earlier output is replaced without it",
    )
    parser.add_argument("--limit", type=at_least(1), default=None, help="extract at most this many pages")
    parser.add_argument(
        "--order",
        default=None,
        help=f"the union's preference order: comma-separated extractor names, or 'random' (per page); "
        f"default {_DEFAULT_ORDER} (with --extractor union only)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed for --order random (reproducible runs; with it only)"
    )
    parser.add_argument(
        "--min-words", type=int, default=50, help="words an output needs to pass the union's filter"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=5.0, help="time limit per extractor and page, in seconds"
    )
    parser.add_argument(
        "--language",
        default=None,
        help="jusText's language for every page (ISO 639-1, e.g. de), instead of detecting each page's "
        "(only where jusText runs: --extractor justext, all, or a union that holds it)",
    )
    parser.add_argument(
        "--workers",
        type=at_least(1),
        default=None,
        help="extractor processes run in parallel (default: one per usable CPU, up to 4)",
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=at_least(0),
        default=DEFAULT_MEMORY_LIMIT_MB,
        help="each extractor process's data in MiB (Linux RLIMIT_DATA), as HTMLLM_EXTRACT_MEMORY_LIMIT_MB "
        "in the service: an extraction that needs more is its row's extraction_failed; 0: none. A limit "
        "under which an extractor cannot extract a tiny test page is refused before any page is extracted",
    )
    parser.add_argument(
        "--part-size", type=at_least(1), default=512, help="pages per part file (resume grain)"
    )
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    parser.set_defaults(func=run)


def _extractors_called(args: argparse.Namespace) -> tuple[str, ...]:
    """The extractors a run may call on a page (`args.order` resolved, so the union's is a string)."""
    from service.core.extract import EXTRACTORS, resolve_order

    if args.extractor == "all" or (args.extractor == "union" and args.order == "random"):
        return tuple(EXTRACTORS)
    if args.extractor == "union":
        return resolve_order(args.order.split(","))
    return (args.extractor,)


def _unused_option(args: argparse.Namespace) -> str | None:
    """Why an option given would change nothing, or None: such a run had gone on as if it were not
    given (`--seed 7` without `--order random` gave the default order's rows, which the user took for
    seeded ones). A usage error, as a bad value of it is. The values are valid by now (`run`)."""
    from service.core.extract import resolve_order

    if args.order is not None and args.extractor != "union":
        return f"--order is the union's preference order, for --extractor union, not {args.extractor}"
    if args.seed is not None and args.order != "random":
        return "--seed seeds --order random's per-page shuffle: give it with --extractor union --order random"
    order = args.order or _DEFAULT_ORDER
    if args.language is not None and args.extractor in ("resiliparse", "trafilatura"):
        return f"--language is jusText's: {args.extractor} reads no language"
    union_without_justext = order != "random" and "justext" not in resolve_order(order.split(","))
    if args.language is not None and args.extractor == "union" and union_without_justext:
        return f"--language is jusText's, which --order {order} does not run"
    return None


def _check_memory_limit(args: argparse.Namespace, pool: ExtractorPool) -> None:
    """Refuse (`MemoryLimitTooLow`) a --memory-limit-mb under which an extractor the run calls fails on a
    test page of a large real page's size (`_probe_page`) that it extracts without a limit. Below what
    an extractor process needs for its libraries and a page (about 110 MiB for resiliparse, which
    jusText's language detection runs too, plus the page's share) every page, or most, failed: the run
    wrote a row of failures for each (the union fell back on another extractor, in silence), exit code 0,
    and a resume kept those rows as done. Tried in the run's own pool, whose workers the run then uses,
    so a run under a workable limit pays a test page per extractor (about half a second in all). A
    worker lost on it (a crash under the limit) counts as a failure; any other outcome (a timeout, a
    failure without the limit too) says nothing of the limit: the run goes on, and its rows say what
    each page met."""
    from service.core.extract import (
        ExtractionError,
        ExtractionTimeoutError,
        ExtractorLostError,
        ExtractorPool,
    )

    if pool.memory_limit_bytes is None or args.memory_limit_mb >= _PROBED_BELOW_MB:
        return
    page = _probe_page()
    for name in _extractors_called(args):
        try:
            pool.run(name, page, language=args.language, timeout_s=args.timeout_s)
            continue
        except ExtractionTimeoutError:
            continue
        except (ExtractionError, ExtractorLostError) as exc:
            failure = exc
        with ExtractorPool(1) as unlimited:
            try:
                unlimited.run(name, page, language=args.language, timeout_s=args.timeout_s)
            except (ExtractionError, ExtractorLostError):
                continue  # not the limit's doing
        raise MemoryLimitTooLow(
            f"--memory-limit-mb {args.memory_limit_mb} is less than an extractor process needs: {name} "
            f"failed on a test page of {len(page) // 1000} KB under it, and not without it ({failure}), "
            "so most pages would fail; raise it (128 is about the least that works; the default is "
            f"{DEFAULT_MEMORY_LIMIT_MB}), or pass 0 for no limit"
        )


def _deferred(row: dict[str, Any], deferred: Deferred) -> bool:
    """Whether `row` records a failure a retry may not repeat (`TRANSIENT`), noted in `deferred` if so."""
    error = row.get("error")
    if error is None or error["code"] not in TRANSIENT:
        return False
    deferred.note(error["code"], error["message"])
    return True


def _error_json(exc: HtmllmError) -> dict[str, str]:
    return {"code": str(exc.code), "message": exc.message}


def _extraction_json(result: Extraction, page: Page) -> dict[str, Any]:
    row = asdict(result)
    row["attempts"] = [{k: v for k, v in a.items() if v is not None} for a in row["attempts"]]
    if page.encoding is not None:
        # The reader transcoded the page from its row's declared charset: the extractors read UTF-8,
        # but the page was decoded from this one (as the API, given the raw bytes, reports it).
        row["encoding"] = whatwg_name(page.encoding)
    return row


def _process(
    index: int, page: Page, args: argparse.Namespace, pool: ExtractorPool, jsonl: bool
) -> dict[str, Any]:
    """The row of one page; `jsonl`: the input is JSONL, whose pages are no WARC pages
    (`embed.response_fields`)."""
    from service.commands.embed import response_fields
    from service.core.extract import ExtractionError, ExtractorLostError, extract, extract_all

    row: dict[str, Any] = {"index": index, "id": page.id, "url": page.url}
    # Last in the row, whichever way it ends: `_ROW_START` matches the keys before them.
    response = response_fields(page, jsonl=jsonl)
    if page.error is not None:
        row["error"] = {"code": str(page.error_code), "message": page.error}
        return {**row, **response}
    order: str | list[str] = "random" if args.order == "random" else args.order.split(",")
    try:
        if args.extractor == "all":
            results = extract_all(
                page.html,
                timeout_s=args.timeout_s,
                min_words=args.min_words,
                language=args.language,
                runner=pool,
            )
            row["extractions"] = {
                name: {"error": _error_json(r)}
                if isinstance(r, ExtractionError)
                else _extraction_json(r, page)
                for name, r in results.items()
            }
        else:
            result = extract(
                page.html,
                args.extractor,
                timeout_s=args.timeout_s,
                min_words=args.min_words,
                order=order,
                seed=args.seed,
                language=args.language,
                runner=pool,
            )
            row.update(_extraction_json(result, page))
    except (ExtractionError, ExtractorLostError) as exc:  # the latter's row is deferred, never written
        row["error"] = _error_json(exc)
    return {**row, **response}


def _failed(row: dict[str, Any]) -> bool:
    """Whether a row holds no text: the page could not be read or extracted (`error`), or, with
    `--extractor all`, every extractor failed on it (it has no top-level `error` then)."""
    if "error" in row:
        return True
    extractions: dict[str, dict[str, Any]] = row.get("extractions") or {}
    return bool(extractions) and all("error" in entry for entry in extractions.values())


def _check_output(args: argparse.Namespace) -> None:
    """Refuse (`OutputRefused`) an output whose replacement would lose what this command did not write:
    the input (or its directory's manifest), a page file of the input, and, unless --overwrite, any other
    existing file but an empty one and this command's own earlier output (its first line one of its rows,
    `_ROW_START`), which a run replaces as it always did. A page file named as the output was taken for
    the run's own output (`own_files`: a directory's listing left it out, unread) or read as a page, and
    then replaced by rows, exit code 0. The input's page files are looked for only where the output
    holds something else: a file of rows already has no page to lose (the listing leaves it out), and a
    run over a large JSONL file is not made to read it through an extra time. Not a regular file
    (/dev/null, a FIFO) is written in place, never replaced: not refused. A source that cannot be read
    raises its own error here, as the reader would."""
    if args.output == "-":
        return
    if _is_input(args.output, args.input):
        raise OutputRefused(f"--output {args.output} is the input: the run would replace it")
    output = Path(args.output)
    try:
        status = output.stat()  # through a symlink: the file that would be replaced
    except (OSError, ValueError):  # missing (a new file), or a path the run says it cannot write
        return
    if not stat.S_ISREG(status.st_mode):
        return
    start: bytes | None = None
    unreadable = ""
    try:
        start = _start(output)
    except OSError as exc:  # whether the command wrote it is unknown: never taken for its own
        unreadable = exc.strerror or str(exc)
    if start is not None and _ROW_START.match(start):
        return
    page = _page_file_of(Path(args.input), status)
    if page is not None:
        raise OutputRefused(
            f"--output {args.output} is the input's page file {page}: the run would replace it with its rows"
        )
    _check_output_name(args)  # before a refusal that --overwrite would lift: it would not lift this one
    if args.overwrite or start == b"":
        return
    if start is None:
        raise OutputRefused(
            f"{args.output} exists but cannot be read ({unreadable}), so this run cannot tell whether "
            "htmllm extract wrote it: make it readable, or pass --overwrite to replace it unread"
        )
    raise OutputRefused(
        f"{args.output} was not written by htmllm extract (its first line is not a row of it); pass "
        "--overwrite to replace it"
    )


def _check_output_name(args: argparse.Namespace) -> None:
    """Refuse (`OutputRefused`) an output named as a compressed file (`COMPRESSED_SUFFIXES`). Checked after
    the input and its page files (`_check_output`): a page file `p1.html.gz` of the input is refused as
    that, which says what the run would have destroyed."""
    problem = compressed_output_problem(args.output, "extract", "plain JSONL")
    if problem is not None:
        raise OutputRefused(problem)


def _start(output: Path) -> bytes:
    """The first bytes of an existing output, enough to see its first row's keys (`_ROW_START`)."""
    with output.open("rb") as handle:
        return handle.read(_START_BYTES)


def _page_file_of(source: Path, output: os.stat_result) -> Path | None:
    """The page file of `source` (`pages.page_files_of`, symlinks followed) that is the file `output` is
    the status of, told by device and inode (a hard link too); None if none is."""
    from service.core.pages import page_files_of

    for path in page_files_of(source):
        try:
            status = path.stat()
        except (OSError, ValueError):  # missing (its row is an error row), or not to be looked at
            continue
        if (status.st_dev, status.st_ino) == (output.st_dev, output.st_ino):
            return path
    return None


def _is_input(output: str, source: str) -> bool:
    """Whether `output` names the input file, or the manifest of an input directory. False where either
    cannot be looked at (EACCES on a directory above it): this check raised that out of the command as
    a traceback; the input's reader then says so with its code, or the output cannot be written."""
    try:
        return _same_file(output, source)
    except OSError:
        return False


def _same_file(output: str, source: str) -> bool:
    """`_is_input`'s comparison, which may raise what the file system says of either path."""
    out, src = Path(output), Path(source)
    candidates = [src, src / "manifest.jsonl"] if src.is_dir() else [src]
    for candidate in candidates:
        if out.resolve() == candidate.resolve():
            return True
        if out.exists() and candidate.exists() and os.path.samefile(out, candidate):  # a hard link
            return True
    return False


def _settings(args: argparse.Namespace, parts: Path) -> dict[str, Any]:
    """What determines the rows, pinned for a resume: the input (its path, size and modification time,
    and its page files', `input_identity`: pages named by position pass the ids' check however the input
    changed), the options that change a row, and the extractor libraries' versions (an upgrade between
    two attempts would mix two extractors' texts)."""
    from service.core.extract import EXTRACTION_VERSION

    settings: dict[str, Any] = {
        "row_format": ROW_FORMAT,
        "extraction_version": EXTRACTION_VERSION,
        "input": str(Path(args.input).resolve()),
        # The identity `parts` pinned, if any: a JSONL file that is the one it saw is not read through.
        INPUT_KEY: input_identity(
            Path(args.input), Path(args.output), [(pinned_settings(parts) or {}).get(INPUT_KEY)]
        ),
        "limit": args.limit,
        "extractor": args.extractor,
        "min_words": args.min_words,
        "timeout_s": args.timeout_s,
        # A row's outcome, as the time limit is: an extraction that needs more memory fails (resumed
        # under another limit, one output held two runs' failures). --workers and --part-size are not.
        "memory_limit_mb": args.memory_limit_mb,
        "versions": {name: installed_version(name) for name in _EXTRACTOR_DISTRIBUTIONS},
    }
    if args.extractor == "union":
        settings["order"] = args.order
        if args.order == "random":
            settings["seed"] = args.seed
    if args.language is not None:
        settings["language"] = args.language
    return settings


class _JsonlParts:
    """Parts as JSONL (`resume_state.PartFormat`): a header line, then the rows as the output has them.

    The header holds the part's first index and its pages' ids (a part holds consecutive indices, so the
    merge is a concatenation in order of first index), its body's length in bytes (a part cut short from
    outside is told from a whole one) and its rows' error and filter counts (for the final summary).
    """

    suffix = ".jsonl"

    def write(self, rows: list[dict[str, Any]], path: Path) -> None:
        first = rows[0]["index"]
        if [row["index"] for row in rows] != list(range(first, first + len(rows))):
            raise RuntimeError(f"a part's indices must be consecutive, got {[row['index'] for row in rows]}")
        if any(row["row"]["index"] != row["index"] for row in rows):
            raise RuntimeError("a row's `index` must be the position it is written at")
        body = "".join(json.dumps(row["row"], ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
        header = {
            "first": first,
            "ids": [row["id"] for row in rows],
            "bytes": len(body),
            "errors": sum(_failed(row["row"]) for row in rows),
            "passed": sum(bool(row["row"].get("passed")) for row in rows),
        }
        with path.open("wb") as handle:
            handle.write(json.dumps(header, ensure_ascii=False).encode("utf-8") + b"\n")
            handle.write(body)

    def indices(self, path: Path) -> npt.NDArray[np.int64]:
        import numpy as np

        header = self.header(path)
        return np.arange(header["first"], header["first"] + len(header["ids"]), dtype=np.int64)

    def keys(self, path: Path) -> tuple[Sequence[int], Sequence[str]]:
        header = self.header(path)
        return range(header["first"], header["first"] + len(header["ids"])), header["ids"]

    @staticmethod
    def header(path: Path) -> dict[str, Any]:
        """The part's header, checked against the file; `UnreadablePart` if they disagree."""
        try:
            with path.open("rb") as handle:
                line = handle.readline()
            header = json.loads(line)
            size = path.stat().st_size
        except (OSError, ValueError) as exc:
            raise UnreadablePart(str(exc)) from exc
        if not (
            isinstance(header, dict)
            and isinstance(header.get("first"), int)
            and isinstance(header.get("ids"), list)
            and isinstance(header.get("bytes"), int)
        ):
            raise UnreadablePart("its first line is not a part header")
        if size != len(line) + header["bytes"]:
            raise UnreadablePart(f"{size} bytes, but its header says {len(line) + header['bytes']}")
        return header


def _extract_all(
    todo: Iterable[tuple[int, Page]],
    args: argparse.Namespace,
    pool: ExtractorPool,
    emit: Callable[[int, dict[str, Any]], None],
    bar: tqdm[Any],
) -> None:
    """Extract each (index, page) of `todo` with `pool`'s workers and hand its row to `emit`, in `todo`'s
    order."""
    from service.core.pages import source_kind

    jsonl = source_kind(Path(args.input))[0] == "jsonl"
    workers = pool.workers
    with ThreadPoolExecutor(max_workers=workers) as executor:
        pending: deque[tuple[int, Future[dict[str, Any]]]] = deque()

        def drain(keep: int) -> None:
            while len(pending) > keep:
                index, future = pending.popleft()
                emit(index, future.result())
                bar.update(1)

        try:
            # A bounded window keeps memory flat on big collections and rows in input order.
            for index, page in todo:
                pending.append((index, executor.submit(_process, index, page, args, pool, jsonl)))
                drain(2 * workers)
            drain(0)
        except BaseException:
            # Ctrl-C or a crash: the window's pages are not waited for (the executor's exit would run
            # every queued page, each up to three time limits): queued ones are cancelled and closing the
            # pool kills the busy workers, whose jobs then end at once.
            for _, future in pending:
                future.cancel()
            pool.close()
            raise


@contextmanager
def _open_in_place(path: str) -> Iterator[IO[str]]:
    """Standard output for '-', else `path` opened for writing as it is (not a regular file), through
    its links as given: `/dev/stdout` into a pipe resolves to `/proc/<pid>/fd/pipe:[...]`, a name that
    cannot be opened, where the link itself opens the pipe."""
    if path == "-":
        yield sys.stdout
        return
    with Path(path).open("w", encoding="utf-8") as handle:
        yield handle


def _bar(args: argparse.Namespace, initial: int = 0) -> tqdm[Any]:
    from service.core.progress import progress_bar

    return progress_bar(initial=initial, total=args.limit, unit="page", disable=args.no_progress)


def _stream(args: argparse.Namespace, pages: Iterable[Page], pool: ExtractorPool, deferred: Deferred) -> str:
    """Write the rows as they come (standard output, a FIFO): nothing to resume from, so a deferred
    page's row is written too, with its error, and not counted as failed. Returns the summary. Flushed
    here, where a reader gone (`BrokenPipeError`) reaches `run`: at interpreter exit it was an "Exception
    ignored" traceback and status 120."""
    counts = {"pages": 0, "errors": 0, "passed": 0}
    with _open_in_place(args.output) as out, _bar(args) as bar:

        def emit(_: int, row: dict[str, Any]) -> None:
            counts["pages"] += 1
            counts["errors"] += not _deferred(row, deferred) and _failed(row)
            counts["passed"] += bool(row.get("passed"))
            out.write(json.dumps(row, ensure_ascii=False) + "\n")

        _extract_all(enumerate(pages), args, pool, emit, bar)
        out.flush()
    return _summary(args, counts["pages"], counts["errors"], counts["passed"])


def _resumable(
    args: argparse.Namespace,
    target: Path,
    pages: Iterable[Page],
    pool: ExtractorPool,
    termination: Termination,
    deferred: Deferred,
) -> str:
    """Extract the pages not done by an interrupted run into parts, then merge them into `target`, unless
    a page was deferred: it is not written (so not done), and the parts wait for the run that extracts
    it. Returns the summary."""
    parts = parts_dir(target)
    fmt = _JsonlParts()
    with run_lock(parts):  # a missing directory is made, as `htmllm embed` makes it
        clean_leftovers(target, parts)
        settings = _settings(args, parts)
        # Every name but the union's `order` and `seed` is recorded by every run: one missing is an older
        # version's run, which the refusal says. A run of a smaller --limit goes on under a larger one (or
        # none), as `htmllm embed`'s does: its parts are this run's first pages (`limit_raised`).
        # With --overwrite an interrupted run of other settings is discarded, as `htmllm embed` discards
        # one (it had been refused: "delete it to start over", where the user had asked to start over).
        recorded = settings.keys() - {"order", "seed"}
        if discarded := pin_settings(
            parts, settings, recorded=recorded, overwrite=args.overwrite, limit_may_grow=True
        ):
            print(f"htmllm extract: --overwrite: {discarded}", file=sys.stderr)
        done = done_set(parts, fmt, command="htmllm extract")
        walk = InputWalk(done, parts)
        writer = PartWriter(parts, fmt, args.part_size)

        def emit(index: int, row: dict[str, Any]) -> None:
            if _deferred(row, deferred):
                return  # left for the next run, which finds its index missing
            if writer.rows and writer.rows[-1]["index"] + 1 != index:
                writer.flush()  # after a gap in the done-set: a part holds consecutive indices
            writer.add({"index": index, "id": row["id"], "row": row})

        try:
            with _bar(args, len(done)) as bar:
                _extract_all(walk.todo(pages), args, pool, emit, bar)
        except BaseException:
            # Keep what was finished: rows are emitted only from pages whose extraction ended, and the
            # workers ignore Ctrl-C, so none of them failed because of it. They do not ignore SIGTERM,
            # which a scheduler (Slurm) sends to every process of the job: a row with a failure in it
            # may be a killed worker's, so it is left to the resume (done again, never twice), with the
            # rows after it (a part holds consecutive indices).
            try:
                if termination.received:
                    failed = (i for i, row in enumerate(writer.rows) if _holds_error(row["row"]))
                    del writer.rows[next(failed, len(writer.rows)) :]
                writer.flush()
                if not holds_parts(parts):
                    remove_parts(parts, target)  # nothing to resume from: leave nothing behind
            finally:
                if writer.failed is not None:
                    # A part the disk would not take ended the run (`exc`, or what it became), and
                    # Ctrl-C (SIGTERM, SIGHUP) came while it stopped, or while this tidies up: the full
                    # disk is what the user must hear of (exit 1), not "interrupted", which sends them
                    # back into the same full disk (`htmllm embed`'s rule).
                    raise writer.failed from None
            raise
        writer.flush()
        if deferred.codes:
            return ""  # no output yet: `run` says which pages are left
        errors, passed = _merge(parts, target, walk.documents)
        remove_parts(parts, target)
    summary = _summary(args, walk.documents, errors, passed)
    return summary + (f"; {len(done)} of them done by the interrupted run" if done else "")


def _holds_error(value: Any) -> bool:
    """Whether a row records a failure anywhere: its own `error`, an extractor's under `extractions`, a
    failed attempt's."""
    if isinstance(value, dict):
        return "error" in value or any(_holds_error(v) for v in value.values())
    return isinstance(value, list) and any(_holds_error(v) for v in value)


def _merge(parts: Path, target: Path, documents: int) -> tuple[int, int]:
    """Concatenate the parts, in index order, into `target` (a complete file or the old one), with the
    mode the old one had; returns the rows' error and filter counts."""
    fmt = _JsonlParts()
    ranges = complete_parts(parts, fmt, documents, target)
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None  # None: as a new file's
    errors = passed = 0
    with (
        replaced_atomically(target, mode=mode, suffix=TEMP_SUFFIX, durable=True) as tmp,
        tmp.open("wb") as out,
    ):
        for _, _, part in ranges:
            header = fmt.header(part)
            errors += header["errors"]
            passed += header["passed"]
            with part.open("rb") as handle:
                handle.readline()
                shutil.copyfileobj(handle, out, 1 << 20)
    return errors, passed


def _summary(args: argparse.Namespace, pages: int, errors: int, passed: int) -> str:
    summary = f"htmllm extract: {pages} pages, {errors} failed"
    # What "failed" counts: rows with no text, as `_failed` tells them.
    summary += f" ({'the extractor' if args.extractor in _EXTRACTOR_DISTRIBUTIONS else 'every extractor'}"
    summary += " failed or the page could not be read)"
    if args.extractor != "all":
        summary += f", {passed} passed the filter (>= {args.min_words} words)"
    return summary


def _say_interrupted(args: argparse.Namespace, how: str, target: Path | None, in_place: bool) -> None:
    """The one line of an interrupted run: what was left as it was, and where the finished rows are."""
    if target is None:
        print(f"htmllm extract: {how}", file=sys.stderr)
    elif not in_place and parts_dir(target).exists():
        print(
            f"htmllm extract: {how}; {args.output} was left as it was; what was finished is kept "
            f"in {parts_dir(target)}: run the same command again to go on",
            file=sys.stderr,
        )
    else:
        print(f"htmllm extract: {how}; {args.output} was left as it was", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from service.core.extract import (
        ExtractionOptionsError,
        ExtractorPool,
        default_workers,
        normalize_language,
        resolve_order,
    )
    from service.core.pages import iter_pages
    from service.core.workers import mib_as_bytes

    # --limit, --workers, --part-size and --memory-limit-mb are bounded by their types (`at_least`), as
    # `htmllm embed` bounds its own: `--limit 0` had written an empty output here and been refused there.
    workers = default_workers() if args.workers is None else args.workers
    if not args.timeout_s > 0 or args.min_words < 0:  # else every row an error, and the output replaced
        print("htmllm extract: --timeout-s must be > 0 and --min-words >= 0", file=sys.stderr)
        return 2
    try:
        # The values first: `--order JUSTEXT,resiliparse --language de` had been told that its order
        # runs no jusText, where the order's name was the mistake.
        if args.extractor == "union" and args.order is not None:
            resolve_order("random" if args.order == "random" else args.order.split(","))
        args.language = normalize_language(args.language)  # "EN" is "en"; "xx" is a usage error
    except ExtractionOptionsError as exc:
        print(f"htmllm extract: {exc}", file=sys.stderr)
        return 2
    unused = _unused_option(args)
    if unused is not None:
        print(f"htmllm extract: {unused}", file=sys.stderr)
        return 2
    if args.order is None:
        args.order = _DEFAULT_ORDER  # as run.json pins it (for the union, the one extractor it is read by)
    if args.output == "-" and sys.stdout is None:  # `>&-`: Python found no file descriptor 1
        print("htmllm extract: --output -: standard output is closed", file=sys.stderr)
        return 1

    if args.input == "-":  # "page source - does not exist"
        print(f"htmllm extract: {STDIN_INPUT}", file=sys.stderr)
        return 2
    # Through a symlink: the link keeps pointing at the new output. Not a regular file (/dev/null, a
    # FIFO): written in place, never replaced, and so never resumed.
    target = None if args.output == "-" else Path(args.output).resolve()
    # Looked at through its links as given: `/dev/stdout` into a pipe resolves to a name that is not
    # there, and had been taken for a new output file ("cannot write /dev/stdout").
    in_place = target is None or (Path(args.output).exists() and not Path(args.output).is_file())
    # The run's own files (an output inside the input directory, its parts) are no pages of it.
    skip = None if target is None else own_files(Path(args.output))
    termination = Termination()
    deferred = Deferred()
    try:
        _check_output(args)  # before anything is written or locked: what it would replace is not the run's
        _check_output_name(args)  # nor a file named as compressed: the rows are plain JSONL
        if target is not None:
            check_output_parent(Path(args.output))  # as `htmllm embed` checks it (a missing one is made)
        with sigterm_as_ctrl_c() as termination:
            pages: Iterator[Page] = iter_pages(args.input, limit=args.limit, bad_rows="report", skip=skip)
            # Read the first page before the output is opened: a source that does not exist (or cannot
            # be read at all) fails here, not after an old output has been replaced by nothing.
            first = next(pages, None)
            check_has_pages(Path(args.input), first)
            if first is not None:
                pages = itertools.chain([first], pages)
            with ExtractorPool(workers, memory_limit_bytes=mib_as_bytes(args.memory_limit_mb)) as pool:
                _check_memory_limit(args, pool)  # before a row is written, or anything locked
                if target is None or in_place:
                    summary = _stream(args, pages, pool, deferred)
                else:
                    summary = _resumable(args, target, pages, pool, termination, deferred)
            summary += unread_files_note(Path(args.input), None if target is None else Path(args.output))
    except KeyboardInterrupt:
        how = termination.how
        with contextlib.suppress(OSError):  # a hung-up terminal (SIGHUP: EIO): the status still says it
            _say_interrupted(args, how, target, in_place)
        return termination.status
    except (OutputRefused, MemoryLimitTooLow) as exc:  # a usage error, as `--limit 0` is
        print(f"htmllm extract: {exc.code}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`| head -1`; a FIFO's reader; the progress bar's stderr closed): quiet, as
        # `cat` and `grep` end there (`PIPE_CLOSED`). A stream is never resumed, so no row is claimed
        # done; a run into parts keeps those it wrote, as after Ctrl-C. What Python still holds for
        # standard output would raise again when it flushes at exit, so it goes to devnull from here on.
        if target is None:
            discard_stdout()
        return PIPE_CLOSED
    except HtmllmError as exc:  # the input's failures (PageSourceError) and the parts' (RunStateError)
        print(f"htmllm extract: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # strerror alone: the path in str(exc) may be a temporary file's, which the user never named
        print(f"htmllm extract: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if target is None or in_place:
        print(summary, file=sys.stderr)
        if deferred.codes:
            print(
                f"htmllm extract: {deferred.said('pages', 'were not extracted')}: their rows hold that "
                "error; run the command again to extract them",
                file=sys.stderr,
            )
    elif deferred.codes:
        print(
            f"htmllm extract: {deferred.said('pages', 'were left for the next run')}; {args.output} was not "
            f"written, what was finished is kept in {parts_dir(target)}: run the same command again to "
            "extract them",
            file=sys.stderr,
        )
    else:
        print(summary, file=sys.stderr)
    return 1 if deferred.codes else 0
