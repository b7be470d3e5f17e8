"""`htmllm data prepare`: prune, tokenize, extract, sample and write pretraining shards."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("data", help="prepare pretraining shards from a page collection")
    parser.set_defaults(func=lambda _args: _usage(parser))
    commands = parser.add_subparsers(dest="data_command", metavar="ACTION")
    prepare = commands.add_parser(
        "prepare", help="prune, tokenize and sample pages into parquet shards (with the teacher's text)"
    )
    prepare.add_argument(
        "--corpus",
        required=True,
        type=Path,
        help="corpus directory with manifest.jsonl, JSONL file or HTML dir",
    )
    prepare.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json (or its directory)")
    prepare.add_argument("--out", required=True, type=Path, help="output shards directory")
    prepare.add_argument(
        "--max-length",
        type=int,
        default=4096,
        help="tokens kept per document, [CLS]/[SEP] included (default 4096)",
    )
    prepare.add_argument(
        "--per-domain", type=int, default=1000, help="at most K documents per domain (default 1000)"
    )
    prepare.add_argument(
        "--max-documents",
        type=int,
        default=None,
        help="global cap, sampled uniformly over text length (default: keep all after the domain cap)",
    )
    prepare.add_argument(
        "--length-bins", type=int, default=16, help="log-length bins of the uniform-over-length sampler"
    )
    prepare.add_argument(
        "--prioritise-clusters",
        action="store_true",
        help="when rows carry a `cluster` field, take documents of high-entropy clusters first",
    )
    prepare.add_argument(
        "--holdout-fraction",
        type=float,
        default=0.05,
        help="share of domains set aside as held-out pages (default 0.05)",
    )
    prepare.add_argument(
        "--extractor",
        default="union",
        choices=("union", "resiliparse", "trafilatura", "justext", "none"),
        help="plain-text extraction for the teacher (none: the teacher reads pruned HTML)",
    )
    prepare.add_argument("--workers", type=int, default=2, help="processes that prune and tokenize")
    prepare.add_argument("--shard-size", type=int, default=10_000, help="documents per parquet shard")
    prepare.add_argument("--limit", type=int, default=None, help="read at most N pages of the corpus")
    prepare.add_argument("--seed", type=int, default=0, help="seed of the sampler")
    prepare.add_argument("--no-progress", action="store_true", help="no progress bar")
    prepare.set_defaults(func=run_prepare)


def interrupted_prepare(args: argparse.Namespace) -> str:
    """What an interrupted preparation leaves: nothing to go on from (the pages are held in memory until
    every one is read), and its output as it was, unless the shards were being written (the manifest
    is removed first, so a half-written directory says it is incomplete, and training refuses it). An
    output directory the run made is not left behind (`prepare_shards`): "left as it was" had sent the
    user looking for it."""
    from model_training.data import MANIFEST_FILE

    again = "run the same command again to prepare them from the first page"
    out = Path(args.out)
    if not out.exists():
        return f"nothing is kept (no {out} is left behind; a preparation does not resume): {again}"
    if (out / MANIFEST_FILE).is_file() or not any(out.glob("shard-*.parquet")):
        return f"nothing is kept ({out} was left as it was; a preparation does not resume): {again}"
    return f"{out} holds part of the new shards and no {MANIFEST_FILE} (it is incomplete): {again}"


ON_INTERRUPT = {"prepare": interrupted_prepare}


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_prepare(args: argparse.Namespace) -> int:
    from model_training.data import SamplingConfig, WorkerLostError, prepare_shards
    from service.core.errors import HtmllmError

    started = time.perf_counter()
    try:
        sampling = SamplingConfig(
            per_domain=args.per_domain,
            max_documents=args.max_documents,
            length_bins=args.length_bins,
            prioritise_clusters=args.prioritise_clusters,
            holdout_fraction=args.holdout_fraction,
            seed=args.seed,
        )
        stats = prepare_shards(
            args.corpus,
            args.out,
            args.tokenizer,
            max_length=args.max_length,
            sampling=sampling,
            extractor=args.extractor,
            workers=args.workers,
            shard_size=args.shard_size,
            limit=args.limit,
            progress=not args.no_progress,
        )
    except WorkerLostError as exc:  # a worker killed (the OOM killer): no fault of the input or the code
        print(f"htmllm data prepare: {exc}", file=sys.stderr)
        return 1
    except HtmllmError as exc:
        print(f"htmllm data prepare: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the output cannot be written (disk full, permissions)
        print(f"htmllm data prepare: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    report = {**asdict(stats), "seconds": round(time.perf_counter() - started, 1), "out": str(args.out)}
    print(json.dumps(report, indent=2))
    return 0
