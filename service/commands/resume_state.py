"""The bookkeeping that lets a bulk command (`htmllm embed`, `htmllm extract`) resume after `kill -9`.

Beside `<output>` lives `<output>.parts/`: `lock` (held with `flock` for the whole run, so a second run on
the same output — a scheduler retrying a job whose first attempt still lives — is refused instead of
writing every document twice), `run.json` (the settings that determine the rows: a resume with others
would mix two configurations in one file) and the append-only `part-NNNNNN<suffix>` files, each holding
rows with their input position (`index`) and the page's `id`. Everything is written to a hidden
temporary name, fsynced and renamed, so a file is complete or absent; the temporaries of a killed run
(`.<name>.<8 random characters>.htmllm-tmp`, up to the size of the output for a merge, and a removed
parts directory's `.<output>.<8 characters>.htmllm-trash/parts/`) are removed by the next run. Only
names with that marker are ever removed beside the output, never a user's `.<output>.<anything>`: an
older version's unmarked temporaries are left, except a trash folder whose content shows it is one.
On restart the parts' indices are the done-set; the input is walked again, its done pages skipped after
a check that they are the pages that were done. `run.json` also pins the input's size and modification
time (`input_identity`: each file's it is read from, a page file a JSONL row names included), since a
page named by its position, or a page file rewritten under the same name, passes that check; an
output inside the input directory is no file of it, nor are its parts directory and temporaries
(`own_files`), which a run changes under itself. When every page is done the command merges the parts
into `<output>` (a file format's own business, see `PartFormat`) and removes the directory.

A command brings its file format (`PartFormat`: Parquet for embed, JSONL for extract); the rules above
are the same for both and live only here, as does SIGTERM's and SIGHUP's handling (`sigterm_as_ctrl_c`: it
ends a run as Ctrl-C does, keeping what was finished, with status 143 or 129).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from service.commands import INTERRUPTED
from service.core.atomic_files import replaced_atomically
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from service.core.pages import Page

# The shell's status for a command ended by SIGTERM (`sigterm_as_ctrl_c`), as 130 is SIGINT's.
TERMINATED = 128 + signal.SIGTERM
# What a run says it was ended by, for each signal `sigterm_as_ctrl_c` takes as Ctrl-C.
_ENDED_BY: dict[int, str] = {signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}
RUN_FILE = "run.json"
LOCK_FILE = "lock"
# A part's name; temporaries start with "." and never match.
PART_PREFIX = "part-"
# The suffix of every temporary file the bulk commands write (`replaced_atomically(..., suffix=)`) and of
# a parts directory on its way out: a marker no user's `.<output>.backup` carries, so the next run
# removes exactly what a killed run left, never a hidden file or folder of the user's beside the output.
TEMP_SUFFIX = ".htmllm-tmp"
TRASH_SUFFIX = ".htmllm-trash"
# mkstemp's and mkdtemp's names: the prefix, 8 characters of their alphabet, the suffix.
_TEMP_NAME = r"\.{name}\.[a-z0-9_]{{8}}" + re.escape(TEMP_SUFFIX)
_TRASH_NAME = r"\.{name}\.[a-z0-9_]{{8}}" + re.escape(TRASH_SUFFIX)
# An older version's trash (`.tmp`, no marker): removed only when its content shows it is one.
_OLD_TRASH_NAME = r"\.{name}\.[a-z0-9_]{{8}}\.tmp"
# Every name of a leftover beside the output: never an input page (`own_files`).
_LEFTOVERS = (_TEMP_NAME, _TRASH_NAME, _OLD_TRASH_NAME)
# run.json's key for `input_identity`: compared apart from the options, for a message that says so.
INPUT_KEY = "input_files"


class RunStateError(HtmllmError):
    """The parts directory or the output is in a state this run must not touch."""

    code = ErrorCode.VALIDATION


class InputChanged(RunStateError):
    """A done page that is not the input's page at its position now, or a done position past the input's
    end (`InputWalk`): the input was rewritten with the size and modification time `input_identity`
    pinned. `index`: that position, for a command that knows where its done row came from (`htmllm
    embed`'s finished output of a smaller --limit, kept as a part: the parts are not what changed)."""

    def __init__(self, index: int, detail: str, parts: Path) -> None:
        super().__init__(f"input changed since the interrupted run: {detail}; delete {parts} to start over")
        self.index = index
        self.detail = detail


class UnreadablePart(Exception):
    """A part file that cannot be read back (damaged from outside: parts are written whole)."""


class PartFormat(Protocol):
    """How one command's parts are written and read back. Rows are dicts with at least `index` (the
    input position) and `id` (the page's id, to tell a changed input on resume)."""

    suffix: str  # the parts' file-name suffix: ".parquet", ".jsonl"

    def write(self, rows: list[dict[str, Any]], path: Path) -> None:
        """Write `rows` to `path` (a temporary the caller fsyncs and renames)."""
        ...

    def indices(self, path: Path) -> npt.NDArray[np.int64]:
        """The part's indices, cheaply (for the merge's check); `UnreadablePart` if it cannot be read."""
        ...

    def keys(self, path: Path) -> tuple[Sequence[int], Sequence[str]]:
        """The part's indices and ids, in row order; `UnreadablePart` if it cannot be read."""
        ...


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def part_files(parts: Path, fmt: PartFormat) -> list[Path]:
    return sorted(parts.glob(f"{PART_PREFIX}*{fmt.suffix}"))


def holds_parts(parts: Path) -> bool:
    """Whether a part of any format exists: until one does, nothing depends on the settings."""
    return parts.is_dir() and any(parts.glob(f"{PART_PREFIX}*"))


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution` (None: not installed), for the settings a run pins: the
    libraries its rows depend on beyond the checkpoint (extractors, the parser, the tokenizers)."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def changed(settings: dict[str, Any], previous: dict[str, Any], recorded: Collection[str] = ()) -> str:
    """The settings that differ, each as `name old -> new` (`extraction_version 6 -> 7`; a sub-setting of
    a dict by its dotted name, `versions.trafilatura 1.6.0 -> 2.0.0`), for a refusal's message: a name
    alone left the user to find what the run had pinned. The input's identity is `input_change`'s.
    `recorded`: the names every run of this version records; one `previous` lacks was written by an
    older version, which the message says (its value shows as `unset`, as an option's absent value)."""
    items = _differences(settings, previous, prefix="", skip={INPUT_KEY})
    older = any(name in recorded and name not in previous for name in settings.keys() - {INPUT_KEY})
    return ", ".join(items) + ("; written by an older htmllm" if items and older else "")


def limit_raised(settings: dict[str, Any], previous: dict[str, Any]) -> bool:
    """Whether `settings` are `previous` but for a larger `limit` (--limit), or none where it had one:
    then the run of `previous` did this run's first documents. The first N pages of an input are the
    same pages, in the same order (`pages.iter_pages` reads a directory sorted), as long as the input
    is the same, which its identity (`INPUT_KEY`), among the settings compared, tells; every done page's
    id is checked again as the input is read (`InputWalk`). A smaller limit is no such run: it would
    leave rows past its end."""
    old, new = previous.get("limit"), settings.get("limit")
    if not isinstance(old, int) or (new is not None and (not isinstance(new, int) or new <= old)):
        return False
    return {**previous, "limit": new} == settings


def only_input_stops_the_limit(settings: dict[str, Any], previous: dict[str, Any]) -> bool:
    """Whether `settings` would continue `previous` under a larger `limit` (`limit_raised`) but for the
    input, which changed since: its refusal is the input's, not the limit's (naming only the limit, as
    `changed` does, had called a documented continuation "other settings")."""
    same_input = {**settings, INPUT_KEY: previous.get(INPUT_KEY)}
    return settings.get(INPUT_KEY) != previous.get(INPUT_KEY) and limit_raised(same_input, previous)


_UNSET = object()
# A value shown longer than this is cut in its middle (a path differs at either end); a hex digest is
# cut to its first `_DIGEST_SHOWN` characters, as git shows a commit.
_SHOWN_CHARS = 80
_DIGEST_SHOWN = 12


def _differences(now: dict[str, Any], then: dict[str, Any], *, prefix: str, skip: set[str]) -> list[str]:
    """`name old -> new` for each key whose value differs, into dicts that both sides hold."""
    items = []
    for key in sorted(now.keys() | then.keys(), key=str):
        new, old = now.get(key, _UNSET), then.get(key, _UNSET)
        if key in skip or new == old:
            continue
        if isinstance(new, dict) and isinstance(old, dict):
            items += _differences(new, old, prefix=f"{prefix}{key}.", skip=set())
        else:
            items.append(f"{prefix}{key} {_shown(old)} -> {_shown(new)}")
    return items


def _shown(value: Any) -> str:
    """A pinned value as a refusal shows it: text as it is, a sha256 by its first characters, anything
    long cut in its middle."""
    if value is _UNSET:
        return "unset"
    if value is None:
        return "none"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    if re.fullmatch(r"[0-9a-f]{40,}", text):
        return text[:_DIGEST_SHOWN] + "..."
    if len(text) > _SHOWN_CHARS:
        half = (_SHOWN_CHARS - 3) // 2
        return f"{text[:half]}...{text[-half:]}"
    return text


def own_files(output: Path) -> Callable[[Path], bool]:
    """What a run writing `output` puts beside it, as `pages.list_directory`'s `skip`: the output, its
    parts directory (lock, run.json, parts) and the temporaries of `leftovers`' names. An output inside
    the input directory must be no file of its input: counted in `input_identity`, the run's own parts
    changed the input under itself (a resume refused as "input changed", a finished output as "written
    before its input changed"), and read as pages, a run would read what it wrote. Told apart by name
    whether they exist or not, so the first run of an output leaves out what the last one will find;
    by real location (symlinks in the directories above resolved), as the walk gives it."""
    # The output as named, and where a symlink named so leads (where `htmllm extract` writes).
    places = {Path(os.path.realpath(output.parent)) / output.name, Path(os.path.realpath(output))}
    forms = (r"{name}", r"{name}\.parts", *_LEFTOVERS)
    names = [
        (place.parent, re.compile("|".join(form.format(name=re.escape(place.name)) for form in forms)))
        for place in places
    ]

    def own(location: Path) -> bool:
        return any(location.parent == parent and name.fullmatch(location.name) for parent, name in names)

    return own


class _Pinned(NamedTuple):
    """One file of the input, as `input_identity` looks at it."""

    name: str  # the file in the digest: its path in the source, or as a row names it
    path: Path
    problem: str | None = None  # why it could not be looked at (`pages.Listed`): in the digest by name
    named: bool = False  # named by a row: where nothing is there, the row is an error row (see below)


def input_identity(source: Path, output: Path | None = None, known: Iterable[Any] = ()) -> dict[str, Any]:
    """What tells the input apart from a rewritten one, cheaply: the size and modification time of each
    file the source is read from (one WARC or HTML file; every file under a directory of pages, as
    `pages.list_directory` finds them, less the run's own files beside `output`: `own_files`; a JSONL
    file or a corpus's manifest, and every page file its rows name, `pages.named_files`), summed up
    with a digest of the list. Looked at with a stat each, never read: a resume of a 100 GB dump must
    not read it twice, nor a corpus's millions of page files. Only a JSONL file is read through, for
    the names in its rows (parsed only where a row may name a file), unless `known` (identities an
    earlier run recorded: run.json's, a finished output's) holds the one of the file alone: then it is
    the file it was, whose rows named no file, and nothing else is pinned, so a dump of inline pages is
    not read again to find a run has nothing to do. Not so for a corpus directory's manifest (small, and
    naming files by design): a version before this one pinned it alone, and its output over a corpus
    whose page file changed since must not pass for complete. (A JSONL file named as the input, run by
    such a version, passes as it was.)
    What could not be looked at is in the digest by its name: made readable since, it is a change; so
    is a page file a row names where none is (its row is an error row, which a file put there since
    makes stale). A directory's dangling symlink is not: nothing to pin until it points at a file.
    """
    from service.core.pages import list_directory, named_files, source_kind

    kind, path = source_kind(source)
    entries: Iterable[_Pinned]
    if kind == "directory":
        listed = list_directory(path, own_files(output) if output is not None else None)
        entries = (_Pinned(str(entry.path.relative_to(path)), entry.path, entry.problem) for entry in listed)
    elif kind == "jsonl":
        alone = _identity(kind, [_Pinned(path.name, path)])
        if path == source and any(alone == identity for identity in known):
            return alone
        # A row's name, as JSON writes it: any text (a lone surrogate too) has one spelling in the digest.
        rows = (_Pinned(json.dumps(name), file, named=True) for name, file in named_files(path))
        entries = itertools.chain([_Pinned(path.name, path)], rows)
    else:
        entries = [_Pinned(path.name, path)]
    return _identity(kind, entries)


def _identity(kind: str, entries: Iterable[_Pinned]) -> dict[str, Any]:
    """`input_identity` of `entries`, the files of a source of `kind`: the one walk over them."""
    digest = hashlib.sha256()
    files = total = latest = 0
    for name, file, problem, named in entries:
        line = f"{name}\0unreadable\n"
        if problem is None:
            try:
                stat = file.stat()
            except (OSError, ValueError):  # ValueError: a NUL in a name a row gives
                if not named and kind == "directory":
                    continue  # a dangling symlink: nothing to pin until it points at a file
                if not named:
                    raise
            else:
                files += 1
                total += stat.st_size
                latest = max(latest, stat.st_mtime_ns)
                line = f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
        digest.update(line.encode("utf-8", "surrogateescape"))
    return {"files": files, "bytes": total, "mtime_ns": latest, "sha256": digest.hexdigest()}


def input_change(settings: dict[str, Any], previous: dict[str, Any]) -> str | None:
    """How the input's identity differs from `previous`'s, for a refusal's message; None if it does not."""
    now, then = settings.get(INPUT_KEY), previous.get(INPUT_KEY)
    if now == then:
        return None
    if not isinstance(then, dict) or not isinstance(now, dict):
        return "the earlier run recorded no size and modification time of its input (an older version)"

    def show(identity: dict[str, Any]) -> str:
        modified = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(identity.get("mtime_ns", 0) / 1e9))
        return f"{identity.get('files')} file(s), {identity.get('bytes')} bytes, last modified {modified}"

    if show(then) == show(now):
        return f"{show(now)}, but a file was replaced or modified"
    return f"it was {show(then)}, now {show(now)}"


def check_has_pages(source: Path, first: Page | None) -> None:
    """Refuse a page source that yields no pages (`first`: its first page, a bad row's included): an
    empty output and exit 0 would pass for a finished run over a folder not synced yet, a file cut to
    nothing by a failed copy, or files of no kind the commands read. A directory (no manifest) holding
    only JSONL files is refused by `pages` itself."""
    from service.core.pages import PageSourceError, hidden_page_files, source_kind

    if first is not None:
        return
    kind, path = source_kind(source)
    if kind == "directory":
        why = "no .html or .htm file (optionally .gz) and no WARC file with an HTML record"
        left_out = hidden_page_files(path, _UNREAD_SHOWN + 1)
        if left_out:  # (all its pages hidden: "no .html file" alone had been false)
            names = _first_names([str(file.relative_to(path)) for file in left_out])
            why += f" that is not hidden: hidden files and directories and __MACOSX/ are left out ({names})"
    elif kind == "warc":
        why = "no WARC record of an HTML response or resource"
    elif path != source:
        why = f"its manifest {path.name} has no row"
    else:
        why = "no row: the file is empty or holds blank lines only"
    raise PageSourceError(f"page source {source} holds no pages: {why}")


# Names shown of the files a directory of pages holds but no run reads (`unread_files_note`).
_UNREAD_SHOWN = 3
# Suffixes of files a mirrored site serves as pages: the unread files worth a word. A mirror's
# stylesheets, scripts and images are not pages, and naming them would bury these.
_PAGE_LIKE_SUFFIXES = frozenset({".xhtml", ".xht", ".shtml", ".php", ".asp", ".aspx", ".jsp", ".cfm", ".cgi"})
# Suffixes of page sources a directory of pages does not read: a WARC's predecessor, ARC, and JSONL
# shards (read one file at a time, as the input itself: their ids and `file` paths are the file's).
_SOURCE_SUFFIXES = frozenset({".arc", ".jsonl", ".ndjson"})
# What a page or a page source is compressed with, by the suffix a tool gives it: what is under it is
# looked at (`a.html.zst`, `crawl.warc.bz2`), since of all compressions a directory of pages reads only
# gzip's `.gz` (and a WARC's `.zst` and `.lz4`), and those files had been passed over without a word.
_COMPRESSION_SUFFIXES = frozenset(
    {".gz", ".gzip", ".z", ".zst", ".zstd", ".xz", ".lzma", ".bz2", ".br", ".lz4"}
)
_GZIP_SUFFIXES = frozenset({".gz", ".gzip"})  # the compression read, under suffixes a tool may give it
# How much of a file without a suffix is looked at for HTML (`_starts_as_html`).
_SNIFFED_BYTES = 1024


def _first_names(names: list[str]) -> str:
    """The first `_UNREAD_SHOWN` of `names`, comma-separated, and ", ..." where there are more: how each
    list of a run's summary line names what it counts."""
    return ", ".join(names[:_UNREAD_SHOWN]) + (", ..." if len(names) > _UNREAD_SHOWN else "")


def _starts_as_gzip(file: Path) -> bool:
    """Whether a file's first bytes are gzip's magic (its name may say gzip of what is not)."""
    from service.core.warc_frames import GZIP_MAGIC

    try:
        with file.open("rb") as handle:
            return handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    except OSError:
        return False


def _starts_as_html(file: Path) -> bool:
    """Whether a file without a suffix (a mirror's `index`, `about`) begins as an HTML page does: its
    first bytes hold `<html` or start `<!doctype html` (after a byte order mark and white space). A
    README, LICENSE or Makefile does not, and is no page to mention."""
    try:
        with file.open("rb") as handle:
            head = handle.read(_SNIFFED_BYTES).lower()
    except OSError:
        return False
    start = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return start.startswith(b"<!doctype html") or b"<html" in head


def _unread_kind(file: Path) -> str | None:
    """What an unread file of a directory of pages may be (`unread_files_note`), by its name's suffixes,
    or, without one, by its first bytes: "page" (a page under a name the reader does not take: `.xhtml`,
    `.php`, none; gzipped too, `page.php.gz`, `a.htm.gzip`, which renaming is all they need),
    "compressed" (a page or WARC compressed other than as the reader reads it: `a.html.zst`,
    `crawl.warc.bz2`), "arc", "jsonl"; None for a file that is no page (a stylesheet, an image, a
    README, a `.tar.gz`). Hidden files are none of the walk's (`pages.list_directory`)."""
    suffixes = [suffix.lower() for suffix in file.suffixes]
    compressions: list[str] = []
    while suffixes and suffixes[-1] in _COMPRESSION_SUFFIXES:
        compressions.append(suffixes.pop())
    suffix = suffixes[-1] if suffixes else ""
    if suffix == ".arc":
        return "arc"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if compressions:
        if suffix not in _PAGE_LIKE_SUFFIXES | {".html", ".htm", ".warc"}:
            return None
        # Gzipped once, as the reader reads pages, under a name it does not take: "recompress" had been
        # the advice.
        gzipped = compressions == [compressions[0]] and compressions[0] in _GZIP_SUFFIXES
        return "page" if gzipped and _starts_as_gzip(file) else "compressed"
    if suffix in _PAGE_LIKE_SUFFIXES or (not file.suffix and _starts_as_html(file)):
        return "page"
    return None


# What each kind of unread file is told to do (`unread_files_note`), in this order.
_UNREAD_ADVICE = {
    "page": "rename those that are pages",
    "compressed": "gzip is the one compression read (a WARC's zstd and LZ4 besides): recompress the others",
    "arc": "ARC files are not read: convert them to WARC",
    "jsonl": "JSONL files are read one at a time, each as the input",
}


def unread_files_note(source: Path, output: Path | None) -> str:
    """The end of a run's summary line for a directory of pages (no manifest) holding files the reader
    passes over, by their names (`pages.iter_pages` reads .html, .htm, optionally .gz, and WARC files):
    `; 3 files of DIR were not read (...: a.xhtml, b.php, index)`, or "". A mirror's `.xhtml`, `.php`
    and suffix-less pages had been left out of a run in silence, which then looked complete, as had
    pages and WARCs compressed with zstd, xz, bzip2 or brotli, ARC files and JSONL shards. Only names a
    page may have count (`_unread_kind`): a mirror's .css, .js and .png files, its README and what is
    hidden (under .git/) are no news. The run's own files beside `output` are none of them
    (`own_files`). What cannot be looked at now says nothing: the run is over, and its rows stand.

    Two more things the walk passed over are said after it: names a corpus manifest may have that are
    not its one name (`MANIFEST.jsonl`: the directory was read as a directory of pages, ids as paths,
    `pages.unused_manifests`), and symlinks to directories read already, not followed again
    (`pages.list_directory`), whose pages a run had read two or more times."""
    from service.core.pages import list_directory, page_files_of, source_kind, unused_manifests

    passed_over: list[Path] = []
    try:
        kind, path = source_kind(source)
        if kind != "directory":
            return ""
        read = set(page_files_of(path))
        listed = list_directory(path, own_files(output) if output is not None else None, passed_over)
        manifests = unused_manifests(path)
    except (HtmllmError, OSError):
        return ""
    not_pages = {path / name for name in manifests}  # said apart, below
    unread: dict[str, list[Path]] = {}
    for entry in listed:
        if entry.problem is None and entry.path not in read and entry.path not in not_pages:
            unread_kind = _unread_kind(entry.path)
            if unread_kind is not None:
                unread.setdefault(unread_kind, []).append(entry.path)
    note = ""
    files = sorted(file for kind_files in unread.values() for file in kind_files)
    if files:
        names = _first_names([str(file.relative_to(path)) for file in files])
        advice = "; ".join(text for kind, text in _UNREAD_ADVICE.items() if kind in unread)
        note += (
            f"; {len(files)} files of {source} that may be pages were not read, their names ending in none "
            f"of .html, .htm (optionally .gz) and the WARC suffixes ({names}): {advice}"
        )
    if manifests:
        note += (
            f"; {source} was read as a directory of pages: {_first_names(manifests)} was not used as its "
            "manifest, which is named manifest.jsonl (or manifest.jsonl.gz)"
        )
    if passed_over:
        links = _first_names([str(link.relative_to(path)) for link in passed_over])
        note += (
            f"; {len(passed_over)} symlinks in {source} lead to directories read already ({links}): "
            "not followed again, each directory's pages were read once"
        )
    return note


@dataclass
class Deferred:
    """The items of a run that failed for a reason a later attempt may not repeat (a command's
    `TRANSIENT` codes): never written, so the run stays unmerged and its resume tries them again."""

    codes: Counter[str] = field(default_factory=Counter)
    first: str = ""  # the first one's code and message, to say why

    def note(self, code: str, message: str) -> None:
        self.codes[code] += 1
        self.first = self.first or f"{code}: {message}"

    def said(self, items: str, what: str) -> str:
        """`N <items> <what> (<count> <code>, ...; first: <code>: <message>)`, as both commands say it."""
        codes = ", ".join(f"{n} {code}" for code, n in sorted(self.codes.items()))
        return f"{self.codes.total()} {items} {what} ({codes}; first: {self.first})"


class Termination:
    """Which of the signals `sigterm_as_ctrl_c` takes as Ctrl-C came during it, if one did: its run ends
    as after Ctrl-C, with that signal's status and word."""

    signum: int | None = None

    @property
    def received(self) -> bool:
        """Whether SIGTERM or SIGHUP ended the run (its worker processes may have had it too)."""
        return self.signum is not None

    @property
    def how(self) -> str:
        """What ended the run, for its last line."""
        return "interrupted" if self.signum is None else _ENDED_BY[self.signum]

    @property
    def status(self) -> int:
        """The run's exit status: the shell's for the signal that ended it (130, 143, 129)."""
        return INTERRUPTED if self.signum is None else 128 + self.signum


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[Termination]:
    """Within: SIGTERM (what Kubernetes, Slurm, systemd and `kill` send to stop a job) and SIGHUP (the
    terminal or SSH session the run was started from closed) do what Ctrl-C does, so the run keeps what
    it finished: their default, death on the spot, lost up to a part of finished rows, to be done again.
    Each calls SIGINT's handler of the moment (`asyncio.run`'s cancels the run, Python's raises
    KeyboardInterrupt), or raises KeyboardInterrupt where SIGINT is ignored (a background job of a shell
    without job control), and sets `signum`, for the caller's status (`TERMINATED`, 129). SIGHUP
    ignored is left so: a run under `nohup` goes on when the terminal closes, as it was started to.
    Each signal's handler before is back after, as `asyncio.run` gives SIGINT's back. Off the main
    thread (no handler can be set there) both are left as they are."""
    termination = Termination()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        termination.signum = signum
        ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(ctrl_c):
            raise KeyboardInterrupt
        ctrl_c(signal.SIGINT, frame)

    previous = {number: signal.getsignal(number) for number in _ENDED_BY}
    # None: a handler set outside Python, which could not be put back.
    taken = [
        number
        for number, handler in previous.items()
        if handler is not None and not (number == signal.SIGHUP and handler is signal.SIG_IGN)
    ]
    if threading.current_thread() is not threading.main_thread():
        taken = []
    try:
        for number in taken:
            signal.signal(number, on_signal)
        yield termination
    finally:
        for number in taken:
            signal.signal(number, previous[number])


def _write_json(settings: dict[str, Any], path: Path) -> None:
    with replaced_atomically(path, suffix=TEMP_SUFFIX, durable=True) as tmp:
        tmp.write_text(json.dumps(settings, sort_keys=True), encoding="utf-8")


def _is_parts_entry(name: str) -> bool:
    """A name a parts directory holds: its lock, run.json, parts, or their temporaries."""
    return name in (LOCK_FILE, RUN_FILE) or name.startswith((PART_PREFIX, f".{PART_PREFIX}", ".run."))


def _is_dead_trash(entry: Path, *, marked: bool) -> bool:
    """Whether `entry` is a parts directory on its way out (`remove_parts`) that no live run removes:
    a real folder holding nothing but `parts/`, which holds only what a parts directory does, with its
    lock not held; or, with this version's marker in its name (`marked`), nothing (killed before the
    rename: an older version's empty one is not told from a user's empty folder)."""
    if entry.is_symlink() or not entry.is_dir():
        return False
    inside = list(entry.iterdir())
    if not inside:
        return marked
    if len(inside) != 1 or inside[0].name != "parts" or inside[0].is_symlink() or not inside[0].is_dir():
        return False
    if not all(_is_parts_entry(name) for name in os.listdir(inside[0])):
        return False
    try:
        fd = os.open(inside[0] / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a run removing it right now
    finally:
        os.close(fd)
    return True


def leftovers(output: Path) -> list[Path]:
    """The temporaries of killed runs beside `output`: a merge's, a parts directory's on its way out.
    Exactly the names this module writes (and an older version's trash of the same shape): a user's
    `.results.parquet.original` or `.results.parquet.snapshot/` is never among them."""
    name = re.escape(output.name)
    temp = re.compile(_TEMP_NAME.format(name=name))
    trash = re.compile(_TRASH_NAME.format(name=name))
    old_trash = re.compile(_OLD_TRASH_NAME.format(name=name))

    def ours(entry: Path) -> bool:
        if temp.fullmatch(entry.name):
            return entry.is_symlink() or not entry.is_dir()
        if trash.fullmatch(entry.name):
            return _is_dead_trash(entry, marked=True)
        return old_trash.fullmatch(entry.name) is not None and _is_dead_trash(entry, marked=False)

    return [entry for entry in output.parent.iterdir() if ours(entry)]


def clean_leftovers(output: Path, parts: Path) -> None:
    """Remove the temporaries of killed runs: `leftovers` beside the output, a part's or run.json's in
    `parts`. Only under the lock, since a live run's temporaries have the same names."""
    for entry in leftovers(output):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)  # a parts directory removed after its merge, cut short
        else:
            entry.unlink(missing_ok=True)
    for entry in parts.iterdir():
        if entry.name.startswith((f".{PART_PREFIX}", ".run.")):
            entry.unlink()


@contextlib.contextmanager
def run_lock(parts: Path) -> Iterator[None]:
    """Hold `parts/lock` for the whole run (creating `parts` and its missing parent directories, for
    `htmllm embed` and `htmllm extract` alike); refuse when another run holds it.

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


def pinned_settings(parts: Path) -> dict[str, Any] | None:
    """The settings in `parts/run.json`; None when there is none, or it cannot be read as settings."""
    try:
        previous = json.loads((parts / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return previous if isinstance(previous, dict) else None


def pin_settings(
    parts: Path,
    settings: dict[str, Any],
    *,
    recorded: Collection[str] = (),
    overwrite: bool | None = None,
    limit_may_grow: bool = False,
) -> str | None:
    """Pin the run's settings in run.json; a resume with other settings, or over an input that changed
    (`INPUT_KEY`), or over parts without a run.json, is refused once a part exists (before that nothing
    depends on them, and a typo's run.json must not lock the output). `recorded`: as `changed` takes it.
    `limit_may_grow`: a run of a smaller --limit is resumed under the larger one (`limit_raised`), its
    parts kept, rather than refused ("try 1000 pages, then all" had started over).

    `overwrite`: the command's --overwrite (None: it has none, as `htmllm extract`, which replaces its
    output anyway). Set, such an interrupted run is discarded and this one starts over, as the user
    asked (the docs had said so, and the run was refused all the same): what this returns says what was
    discarded, for the command to tell. Only its parts and run.json go, under the run's lock, which
    stays: the parts directory is not removed, or another run could lock a new one meanwhile."""
    pin = parts / RUN_FILE
    if holds_parts(parts):
        option = "" if overwrite is None else ", or pass --overwrite,"
        try:
            previous = json.loads(pin.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            # Parts whose settings nobody recorded (run.json is written before the first part, so
            # removed since, or the parts were copied in): resumed, they were pinned to this run's
            # settings whatever theirs were, and rows of two settings merged into one output.
            if not overwrite:
                raise RunStateError(
                    f"{parts} holds parts without {RUN_FILE}, so under settings nobody recorded; "
                    f"delete it{option} to start over"
                ) from exc
            why = f"without {RUN_FILE}"
        except (OSError, ValueError) as exc:
            if not overwrite:
                raise RunStateError(
                    f"{pin} cannot be read ({exc}); delete {parts}{option} to start over"
                ) from exc
            why = f"whose {RUN_FILE} cannot be read ({exc})"
        else:
            if previous == settings:
                return None
            growable = limit_may_grow and isinstance(previous, dict)
            if growable and not overwrite and limit_raised(settings, previous):
                _write_json(settings, pin)  # (with --overwrite: start over, as for a finished output)
                return None
            other = changed(settings, previous if isinstance(previous, dict) else {}, recorded)
            if growable and only_input_stops_the_limit(settings, previous):
                other = ""  # the input's change is the reason, below
            if other:
                why = f"with other settings ({other})"
                if not overwrite:
                    raise RunStateError(f"{parts} holds a run {why}; delete it{option} to start over")
            else:
                how = input_change(settings, previous)
                why = f"over an input that changed since ({how})"
                if not overwrite:
                    raise RunStateError(
                        f"input changed since the interrupted run ({how}); "
                        f"delete {parts}{option} to start over"
                    )
        discarded = _discard_parts(parts)
        _write_json(settings, pin)
        return f"discarded the {discarded} part(s) of an interrupted run {why} in {parts}; starting over"
    _write_json(settings, pin)
    return None


def _discard_parts(parts: Path) -> int:
    """Remove the parts (any format's) of an interrupted run, under its lock; returns how many. run.json
    stays until the caller replaces it: a kill meanwhile leaves fewer parts of the same run, which is
    still that run (its resume does the documents again), never its run.json beside another's parts."""
    discarded = 0
    for entry in sorted(parts.glob(f"{PART_PREFIX}*")):
        if entry.is_dir() and not entry.is_symlink():
            raise RunStateError(f"{entry} is a directory, not a part: move it out of {parts} and run again")
        entry.unlink()
        discarded += 1
    return discarded


def done_set(parts: Path, fmt: PartFormat, *, command: str) -> dict[int, str]:
    """Indices (and ids) written by the parts. A part that cannot be read is removed, and its documents
    are done again: parts are written to a temporary name, fsynced and renamed, so an unreadable one is
    damage from outside, and dropping it only shrinks the done-set (the merge checks the result holds
    every index once)."""
    done: dict[int, str] = {}
    for part in part_files(parts, fmt):
        try:
            indices, ids = fmt.keys(part)
        except UnreadablePart as exc:
            print(f"{command}: {part} cannot be read ({exc}); its documents are done again", file=sys.stderr)
            part.unlink()
            continue
        for index, page_id in zip(indices, ids, strict=True):
            if index in done:
                raise RunStateError(f"document {index} appears twice in {parts}; delete it to start over")
            done[index] = page_id
    return done


class InputWalk:
    """The input's pages with their positions, less those done, each done one checked to be the page
    that was done: a resume over an input that changed would write two inputs' rows into one output."""

    def __init__(self, done: dict[int, str], parts: Path) -> None:
        self.done = done
        self.parts = parts
        self.documents = 0  # input pages seen so far, done before or not

    def todo(self, pages: Iterable[Page]) -> Iterator[tuple[int, Page]]:
        for index, page in enumerate(pages):
            self.documents = index + 1
            if index in self.done:
                if self.done[index] != page.id:
                    was = f"document {index} was {self.done[index]!r}, now {page.id!r}"
                    raise InputChanged(index, was, self.parts)
                continue
            yield index, page
        last = max(self.done, default=-1)
        if last >= self.documents:
            gone = f"document {last} ({self.done[last]!r})"
            raise InputChanged(
                last, f"it now ends after {self.documents} documents, but {gone} was done", self.parts
            )


class PartWriter:
    """Holds rows and writes them, `part_size` at a time, as the next numbered part."""

    def __init__(self, parts: Path, fmt: PartFormat, part_size: int) -> None:
        self.parts = parts
        self.fmt = fmt
        self.part_size = part_size
        self.rows: list[dict[str, Any]] = []
        numbers = (int(p.name[len(PART_PREFIX) :].split(".")[0]) for p in part_files(parts, fmt))
        self.next_part = 1 + max(numbers, default=-1)
        # The write that failed (a full disk): the run ends on it, and nothing more is written.
        self.failed: OSError | None = None

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.part_size:
            self.flush()

    def flush(self, *, keep: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Write the rows held (those `keep` accepts) as a part: to a temporary, fsynced, renamed.

        After a write that failed, nothing: the disk that could not take that part will not take the
        next (a run that wrote on had filled its log with failures, each part's rows lost), and the
        command's Ctrl-C path, writing what it holds, would put an error of its own in place of the
        first. The rows held are not written, so not done: the resume does them again."""
        if self.failed is not None:
            return
        rows = self.rows if keep is None else [row for row in self.rows if keep(row)]
        self.rows = []
        if not rows:
            return
        try:
            with replaced_atomically(self._next_path(), suffix=TEMP_SUFFIX, durable=True) as tmp:
                self.fmt.write(rows, tmp)
        except OSError as exc:
            self.failed = exc
            raise
        self.next_part += 1

    def adopt(self, source: Path) -> Path:
        """Take `source`, a whole file of the parts' format (`htmllm embed`'s finished output of a
        smaller --limit), as the next part: hard-linked, so free whatever its size (the command replaces
        the output with a new file, never writes it in place), else copied. Returns the part, for the
        command to remove again should the input turn out to have changed under the rows it holds."""
        path = self._next_path()
        try:
            os.link(source, path)
        except OSError:  # a file system without hard links
            with replaced_atomically(path, suffix=TEMP_SUFFIX, durable=True) as tmp:
                shutil.copyfile(source, tmp)
        self.next_part += 1
        return path

    def _next_path(self) -> Path:
        return self.parts / f"{PART_PREFIX}{self.next_part:06d}{self.fmt.suffix}"


def complete_parts(parts: Path, fmt: PartFormat, documents: int, output: Path) -> list[tuple[int, int, Path]]:
    """Each part's (lowest index, highest index, path), by lowest index; refused unless the parts hold
    exactly the documents 0..documents-1, each once (the merge's precondition)."""
    import numpy as np

    ranges: list[tuple[int, int, Path]] = []
    indices = []
    for part in part_files(parts, fmt):
        try:
            index = fmt.indices(part)
        except UnreadablePart as exc:
            raise RunStateError(
                f"{part} cannot be read ({exc}); delete it and run again to do its documents again"
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
    return sorted(ranges)


def remove_parts(parts: Path, output: Path) -> None:
    """Remove `parts` in one rename, then delete it: a kill in between leaves a temporary that the next
    run removes, never a parts directory missing some parts.

    Where `parts` cannot be renamed, a mount point (EBUSY: parts on local scratch, the output on a
    volume) or a symlink to another file system (whose rename moved the link and left everything
    behind), its contents are deleted in place, the parts before run.json and the lock: a kill in
    between leaves fewer parts of the same run beside the finished output, which the next run removes
    the same way. A mount point had failed every run after its merge (EBUSY, exit 1)."""
    if parts.is_symlink():
        _clear_in_place(parts.resolve())
        parts.unlink()
        return
    trash = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=TRASH_SUFFIX))
    try:
        os.replace(parts, trash / "parts")
    except OSError as exc:
        trash.rmdir()
        if exc.errno not in (errno.EBUSY, errno.EXDEV):
            raise
        _clear_in_place(parts)
        return
    shutil.rmtree(trash)


def _clear_in_place(directory: Path) -> None:
    """Delete what `directory` holds, run.json and then the lock last (`remove_parts`)."""
    last = {RUN_FILE: 1, LOCK_FILE: 2}
    for entry in sorted(directory.iterdir(), key=lambda entry: (last.get(entry.name, 0), entry.name)):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
