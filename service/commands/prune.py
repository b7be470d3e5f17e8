"""`htmllm prune [FILE|-]`: print the pruned HTML of one page.

The page is read as every command reads one (`service.core.pages.read_page`): gunzipped when it is
gzip, and refused (`payload_too_large`, status 1) past the pruner's 16 MiB cap without reading or
inflating more than that. A page that cannot be read is one line with its code, as the bulk commands
report it, by the same rule (`pages.read_error`): `input_unreadable` where the file system refused it
(permission denied, a missing file, an I/O error), `validation_error` for a corrupt gzip stream.

A reader that stops early (`htmllm prune page.html | head`) ends the command quietly with status 141
(`exits.PIPE_CLOSED`, as SIGPIPE ends `cat` there), rather than with a BrokenPipeError traceback; a
standard output that cannot be written (`> /dev/full`, a full disk) or is closed (`>&-`) is one line and
status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from service.commands.exits import PIPE_CLOSED, discard_stdout


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "prune", help="print the pruned HTML of a page (raw bytes in, any encoding)"
    )
    parser.add_argument(
        "file", nargs="?", default="-", help="HTML file (gzipped or not) to prune, or - for standard input"
    )
    parser.add_argument("--encoding", default=None, help="declared encoding (as an HTTP charset would say)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.core.pages import PageSourceError, PageTooLargeError, read_error, read_page, read_page_bytes
    from service.core.prune import PruneError, prune_html

    try:
        # At most about the page cap is read or inflated: a 1 MB gzip bomb once took 2 GB here.
        data = read_page(sys.stdin.buffer) if args.file == "-" else read_page_bytes(Path(args.file))
    except PageTooLargeError as exc:
        print(f"htmllm prune: {exc.code}: {args.file}: {exc}", file=sys.stderr)
        return 1
    except PageSourceError as exc:  # a corrupt gzip stream: the page's fault
        print(f"htmllm prune: {exc.code}: cannot read {args.file}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the file system's (permission denied, a missing file, EIO) or the page's
        # The bulk commands' one rule (`pages.read_error`), so a page gets the same code here as in its row.
        error = read_error(f"cannot read {args.file}: {exc.strerror or exc}", exc)
        print(f"htmllm prune: {error.code}: {error}", file=sys.stderr)
        return 1
    try:
        pruned = prune_html(data, encoding=args.encoding)
    except PruneError as exc:
        print(f"htmllm prune: {exc.code}: {exc}", file=sys.stderr)
        return 1
    return _write(pruned)


def _write(pruned: str) -> int:
    """Print the pruned page; a standard output that cannot take it is one line, status 1."""
    if sys.stdout is None:  # `htmllm prune page.html >&-`: Python found no file descriptor 1
        print("htmllm prune: cannot write the pruned page: standard output is closed", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(pruned)
        sys.stdout.write("\n")
        sys.stdout.flush()  # here, where a failed write can be handled, not at interpreter exit
    except OSError as exc:  # a closed pipe; a full disk or `> /dev/full` (ENOSPC), EIO, EBADF
        # What is still buffered would raise again when Python flushes stdout at exit.
        discard_stdout()
        if isinstance(exc, BrokenPipeError):  # a reader that stopped early asked for nothing more
            return PIPE_CLOSED  # as `htmllm extract --output -` ends there
        print(f"htmllm prune: cannot write the pruned page: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
