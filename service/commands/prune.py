"""`htmllm prune [FILE|-]`: print the pruned HTML of one page."""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path
from typing import Any


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
    from service.core.pages import gunzip_page
    from service.core.prune import PruneError, prune_html

    try:
        data = gunzip_page(sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes())
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"htmllm prune: cannot read {args.file}: {reason}", file=sys.stderr)
        return 1
    try:
        pruned = prune_html(data, encoding=args.encoding)
    except PruneError as exc:
        print(f"htmllm prune: {exc.code}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(pruned)
    sys.stdout.write("\n")
    return 0
