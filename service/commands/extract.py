"""`htmllm extract`: bulk plain-text extraction of a page collection into JSONL, with a progress bar.

One output row per input page, in input order. A page an extractor fails on, and an input row that cannot
be read (not JSON, a missing file), gets an `error` object in its row rather than stopping the run; only an
input source that does not exist or an unwritable output path fails the command.

The input is opened before the output is touched, and an output file is written beside itself under a
temporary name and renamed over the old one only when the run completes: a typo in `--input`, a crash
or a Ctrl-C leaves an existing output as it was. Ctrl-C stops at once (queued pages cancelled, busy
workers killed) with exit code 130. An output that is the input (or the input directory's
manifest) is refused, since the run would replace what it reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import stat
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from service.commands import INTERRUPTED
from service.core.atomic_files import replaced_atomically

if TYPE_CHECKING:
    from service.core.extract import Extraction, ExtractionError, ExtractorPool
    from service.core.pages import Page

_EXTRACTOR_CHOICES = ("union", "all", "resiliparse", "trafilatura", "justext")


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
            "page source: a corpus directory with manifest.jsonl, a JSONL(.gz) file, a WARC file, "
            "an HTML or WARC directory, an HTML file"
        ),
    )
    parser.add_argument("--output", required=True, help="JSONL file to write, or - for standard output")
    parser.add_argument("--limit", type=int, default=None, help="extract at most this many pages")
    parser.add_argument(
        "--order",
        default="resiliparse,trafilatura,justext",
        help="the union's preference order: comma-separated extractor names, or 'random' (per page)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for --order random (reproducible runs)")
    parser.add_argument(
        "--min-words", type=int, default=50, help="words an output needs to pass the union's filter"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=5.0, help="time limit per extractor and page, in seconds"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="extractor processes run in parallel (default: one per usable CPU, up to 4)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    parser.set_defaults(func=run)


def _error_json(exc: ExtractionError) -> dict[str, str]:
    return {"code": str(exc.code), "message": exc.message}


def _extraction_json(result: Extraction) -> dict[str, Any]:
    row = asdict(result)
    row["attempts"] = [{k: v for k, v in a.items() if v is not None} for a in row["attempts"]]
    return row


def _process(page: Page, args: argparse.Namespace, pool: ExtractorPool) -> dict[str, Any]:
    from service.core.errors import ErrorCode
    from service.core.extract import ExtractionError, extract, extract_all

    row: dict[str, Any] = {"id": page.id, "url": page.url}
    if page.error is not None:
        row["error"] = {"code": str(ErrorCode.VALIDATION), "message": page.error}
        return row
    order: str | list[str] = "random" if args.order == "random" else args.order.split(",")
    try:
        if args.extractor == "all":
            results = extract_all(page.html, timeout_s=args.timeout_s, min_words=args.min_words, runner=pool)
            row["extractions"] = {
                name: {"error": _error_json(r)} if isinstance(r, ExtractionError) else _extraction_json(r)
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
                runner=pool,
            )
            row.update(_extraction_json(result))
    except ExtractionError as exc:
        row["error"] = _error_json(exc)
    return row


def _is_input(output: str, source: str) -> bool:
    """Whether `output` names the input file, or the manifest of an input directory."""
    if output == "-":
        return False
    out, src = Path(output), Path(source)
    candidates = [src, src / "manifest.jsonl"] if src.is_dir() else [src]
    for candidate in candidates:
        if out.resolve() == candidate.resolve():
            return True
        if out.exists() and candidate.exists() and os.path.samefile(out, candidate):  # a hard link
            return True
    return False


@contextmanager
def _open_output(path: str) -> Iterator[IO[str]]:
    """Standard output for '-'; else a temporary file beside `path`, renamed over it only when the block
    ends without an exception, with the mode `open(path, "w")` would have left."""
    if path == "-":
        yield sys.stdout
        return
    target = Path(path).resolve()  # through a symlink: the link keeps pointing at the new output
    if target.exists() and not target.is_file():  # /dev/null, a FIFO: written in place, never replaced
        with target.open("w", encoding="utf-8") as handle:
            yield handle
        return
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None  # None: as a new file's
    with (
        replaced_atomically(target, mode=mode, suffix=".tmp") as tmp,
        tmp.open("w", encoding="utf-8") as handle,
    ):
        yield handle


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from service.core.extract import (
        ExtractionOptionsError,
        ExtractorPool,
        default_workers,
        resolve_order,
    )
    from service.core.pages import PageSourceError, iter_pages

    workers = default_workers() if args.workers is None else args.workers
    if workers < 1 or (args.limit is not None and args.limit < 0):
        print("htmllm extract: --workers must be >= 1 and --limit >= 0", file=sys.stderr)
        return 2
    if not args.timeout_s > 0 or args.min_words < 0:  # else every row an error, and the output replaced
        print("htmllm extract: --timeout-s must be > 0 and --min-words >= 0", file=sys.stderr)
        return 2
    try:
        if args.extractor == "union":
            resolve_order("random" if args.order == "random" else args.order.split(","))
    except ExtractionOptionsError as exc:
        print(f"htmllm extract: {exc}", file=sys.stderr)
        return 2

    if _is_input(args.output, args.input):
        print(
            f"htmllm extract: --output {args.output} is the input: the run would replace it", file=sys.stderr
        )
        return 2

    counts = {"pages": 0, "errors": 0, "passed": 0}
    try:
        pages: Iterator[Page] = iter_pages(args.input, limit=args.limit, bad_rows="report")
        # Read the first page before the output is opened: a source that does not exist (or cannot be
        # read at all) fails here, not after an old output has been replaced by nothing.
        first = next(pages, None)
        if first is not None:
            pages = itertools.chain([first], pages)
        with (
            _open_output(args.output) as out,
            ExtractorPool(workers) as pool,
            ThreadPoolExecutor(max_workers=workers) as executor,
            tqdm(total=args.limit, unit="page", file=sys.stderr, disable=args.no_progress) as bar,
        ):
            pending: deque[Future[dict[str, Any]]] = deque()

            def drain(keep: int) -> None:
                while len(pending) > keep:
                    row = pending.popleft().result()
                    counts["pages"] += 1
                    counts["errors"] += "error" in row
                    counts["passed"] += bool(row.get("passed"))
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    bar.update(1)

            try:
                # A bounded window keeps memory flat on big collections and rows in input order.
                for page in pages:
                    pending.append(executor.submit(_process, page, args, pool))
                    drain(2 * workers)
                drain(0)
            except BaseException:
                # Ctrl-C or a crash: the window's pages are not waited for (the executor's exit would
                # run every queued page, each up to three time limits): queued ones are cancelled and
                # closing the pool kills the busy workers, whose jobs then end at once.
                for future in pending:
                    future.cancel()
                pool.close()
                raise
    except KeyboardInterrupt:
        kept = "" if args.output == "-" else f"; {args.output} was left as it was"
        print(f"htmllm extract: interrupted{kept}", file=sys.stderr)
        return INTERRUPTED
    except PageSourceError as exc:
        print(f"htmllm extract: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # strerror alone: the path in str(exc) may be the temporary file's, which the user never named
        print(f"htmllm extract: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    summary = f"htmllm extract: {counts['pages']} pages, {counts['errors']} failed"
    if args.extractor != "all":
        summary += f", {counts['passed']} passed the filter (>= {args.min_words} words)"
    print(summary, file=sys.stderr)
    return 0
