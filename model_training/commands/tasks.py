"""`htmllm tasks derive`: evaluation tasks from page metadata that pruning removes (no labels needed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_training.commands.eval import usage

if TYPE_CHECKING:
    from model_training.evaluation.derive import DerivedTask


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("tasks", help="build evaluation task files")
    parser.set_defaults(func=lambda _args: usage(parser))
    commands = parser.add_subparsers(dest="tasks_command", metavar="ACTION")
    derive = commands.add_parser(
        "derive",
        help="derive page_kind (og:type), schema_type (JSON-LD @type) and language (<html lang>) tasks",
    )
    derive.add_argument(
        "--corpus", required=True, type=Path, help="page source (a corpus directory, JSONL, HTML dir)"
    )
    derive.add_argument(
        "--out", required=True, type=Path, help="output directory: one task directory per task"
    )
    derive.add_argument(
        "--min-pages", type=int, default=10, help="a class needs this many pages, else it merges"
    )
    derive.add_argument("--min-sites", type=int, default=5, help="a class needs pages from this many sites")
    derive.add_argument("--folds", type=int, default=5, help="cross-validation folds, assigned by site")
    derive.add_argument("--seed", type=int, default=0, help="seed of the fold assignment")
    derive.add_argument("--limit", type=int, default=None, help="read at most this many pages")
    derive.set_defaults(func=run_derive)


def interrupted_derive(args: argparse.Namespace) -> str:
    """The pages copied so far are kept (content-addressed, so the next run reuses them); the task
    directories are written at the end, from every page. An `--out` the run made is not left behind
    while it holds no page (`run_derive`)."""
    if not Path(args.out).exists():
        return (
            f"no page was copied yet (no {args.out} is left behind), the tasks are written at the end: run "
            "the same command again to derive them"
        )
    return (
        f"the pages copied so far are kept in {args.out}, the tasks are written at the end: run the same "
        "command again to derive them"
    )


ON_INTERRUPT = {"derive": interrupted_derive}


def run_derive(args: argparse.Namespace) -> int:
    """Derive the tasks into `--out`.

    A run that fails before it copied a page (a corpus that cannot be read, Ctrl-C) leaves no `--out` it
    made itself (`output_dir`): an empty directory had looked like a derivation's to whoever listed it
    later. The pages copied are kept: the next run reuses them (`interrupted_derive`), as is a
    derive.json, which says why no task was derived (`require_a_task`)."""
    from model_training.evaluation.derive import DERIVE_FILE, PAGES_DIR, derive_tasks, require_a_task
    from model_training.outputs import file_names, output_dir
    from service.core.errors import HtmllmError

    try:
        # No file of the run is taken out: only an empty pages/ and the directories it made.
        with output_dir(args.out, written=file_names(), complete=DERIVE_FILE, subdirs=[PAGES_DIR]):
            results = derive_tasks(
                args.corpus,
                args.out,
                min_pages=args.min_pages,
                min_sites=args.min_sites,
                folds=args.folds,
                seed=args.seed,
                limit=args.limit,
            )
            _print_results(results)
            require_a_task(results, args.corpus, args.out)  # after the lines that say why each was skipped
    except HtmllmError as exc:
        print(f"htmllm tasks derive: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"htmllm tasks derive: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    return 0


def _print_results(results: list[DerivedTask]) -> None:
    """One line per task: what was written where, or why the task was skipped."""
    if results and results[0].too_large:
        too_large = results[0].too_large
        print(f"{too_large} page(s) over the page cap passed over (too_large_pages in derive.json)")
    for r in results:
        if r.path is None:
            print(f"{r.name}: skipped ({r.skipped})")
            continue
        counts = ", ".join(f"{label} {r.counts[label]}" for label in r.labels)
        extra = f"; merged into other: {', '.join(r.merged)}" if r.merged else ""
        extra += f"; dropped: {', '.join(r.dropped)}" if r.dropped else ""
        print(f"{r.name}: {sum(r.counts.values())} pages from {r.sites} sites ({counts}){extra} -> {r.path}")
