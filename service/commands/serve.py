"""`htmllm serve`: run the HTTP service (flags override the `HTMLLM_*` environment)."""

from __future__ import annotations

import argparse
from typing import Any

from service.api.main import add_serve_arguments, run_args


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the embedding API over HTTP (settings from HTMLLM_* variables; flags override them)",
    )
    add_serve_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_args(args)
