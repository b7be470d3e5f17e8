"""`htmllm train --config FILE.toml`: pretrain an encoder (single process, or DDP under torchrun)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "train",
        help="pretrain with MLM + bag-of-words + teacher distillation (loss_weights.distil = 0: no teacher; "
        "torchrun --nproc-per-node N for DDP)",
    )
    parser.add_argument("--config", type=Path, default=None, help="TOML config (see configs/*.toml)")
    parser.add_argument("--shards", default=None, help="shards directory (overrides the config)")
    parser.add_argument(
        "--teacher",
        default=None,
        help="teacher vectors directory (overrides the config; not read with loss_weights.distil = 0)",
    )
    parser.add_argument("--out", default=None, help="run directory: checkpoints, logs, model/ (overrides)")
    parser.add_argument("--preset", default=None, help="model size: tiny, mini, small, base (overrides)")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate (the paper used 2.5e-5, ModernBERT's pretraining 8e-4; default 8e-4)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="optimizer steps (0: from epochs); wins over epochs"
    )
    parser.add_argument(
        "--epochs",
        type=float,
        default=None,
        help="passes over the training split; replaces the config's max_steps (not with --max-steps)",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="documents per micro-batch per process")
    parser.add_argument("--grad-accum", type=int, default=None, help="micro-batches per optimizer step")
    parser.add_argument("--max-length", type=int, default=None, help="tokens per document (default 4096)")
    parser.add_argument("--device", default=None, help="auto, cpu or cuda")
    parser.add_argument("--seed", type=int, default=None, help="seed of initialisation, data order, masking")
    parser.add_argument(
        "--stop-at-step", type=int, default=None, help="stop at this step with a checkpoint (time-boxed runs)"
    )
    parser.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (ours, and transformers' at checkpoints)"
    )
    parser.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's settings over the config file's (None: the file's, or the default)."""
    return {
        "shards": args.shards,
        "teacher": args.teacher,
        "out": args.out,
        "preset": args.preset,
        "lr": args.lr,
        # --epochs on the command line is meant: it replaces a max_steps from the config file, which
        # would otherwise win (every shipped config sets one) and `--epochs 1` ran 20 or 150 steps.
        "max_steps": 0 if args.epochs is not None and args.max_steps is None else args.max_steps,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "grad_accum": args.grad_accum,
        "max_length": args.max_length,
        "device": args.device,
        "seed": args.seed,
        "progress": False if args.no_progress else None,
    }


def _checkpoint_identity(found: Path | None) -> tuple[str, int, int] | None:
    """Which checkpoint `found` is, file by file: its path, and its trainer_state.pt's inode and mtime.

    A run started over can reach the step its predecessor's last checkpoint had, under the same name;
    its own is a new file, written after this was taken (a step and a save later at least).
    """
    from model_training.training_checkpoints import STATE_FILE

    if found is None:
        return None
    try:
        stat = (found / STATE_FILE).stat()
    except OSError:
        return None
    return str(found), stat.st_ino, stat.st_mtime_ns


def _newest_checkpoint(out: str) -> Path | None:
    """`latest_checkpoint(out)`, quietly: it warns, for a resume, where `checkpoints/latest` was cut short
    before naming the newest."""
    import logging

    from model_training.training_checkpoints import latest_checkpoint

    logging.disable(logging.WARNING)
    try:
        return latest_checkpoint(out)
    except OSError:
        return None
    finally:
        logging.disable(logging.NOTSET)


# The attribute of the command's arguments `run` records, with --no-resume, the newest checkpoint of the
# earlier run in (`_checkpoint_identity`) before training starts.
EARLIER_CHECKPOINT = "earlier_checkpoint"


def interrupted(args: argparse.Namespace) -> str:
    """What an interrupted run keeps: its newest checkpoint, the one the same command resumes from
    (`training_checkpoints.latest_checkpoint`, asked as a resume asks it). A checkpoint is written to a
    `.tmp` directory and renamed, so one cut short is no checkpoint.

    With --no-resume, a checkpoint that is still the earlier run's (`run` records which that is before
    training; none recorded, training had not started) means the run was stopped before it discarded
    that run: the same command starts over, and advice to resume what the user asked to throw away
    was beside the point.
    """
    from model_training.train_config import load_config
    from service.core.errors import HtmllmError

    try:
        out = load_config(args.config, _overrides(args)).out
    except HtmllmError:  # stopped before the config was read; the run has said nothing of it
        return "nothing was written: run the same command again"
    found = _newest_checkpoint(out)
    if found is None:
        return f"no checkpoint was written in {out} yet: run the same command again to start over"
    step = found.name.removeprefix("step-").lstrip("0") or "0"
    if args.no_resume:
        recorded = hasattr(args, EARLIER_CHECKPOINT)
        if not recorded or getattr(args, EARLIER_CHECKPOINT) == _checkpoint_identity(found):
            return (
                f"the earlier run's checkpoints were not discarded yet (the last is step {step}, {found}) "
                "and the new run wrote none: run the same command again to start over"
            )
        return f"the last checkpoint is step {step} ({found}): run it without --no-resume to resume from it"
    return f"the last checkpoint is step {step} ({found}): run the same command to resume from it"


ON_INTERRUPT = {"train": interrupted}


def run(args: argparse.Namespace) -> int:
    import logging

    from model_training.pretrain import train
    from model_training.train_config import load_config
    from service.core.errors import HtmllmError

    if args.epochs is not None and args.max_steps:
        # Each asks for a run length; max_steps would win without a word, as it does in a config file.
        print(
            "htmllm train: --epochs and --max-steps both set the run length: pass one of them",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, _overrides(args))
        if args.no_resume:  # for `interrupted`: a checkpoint still this one is the earlier run's
            setattr(args, EARLIER_CHECKPOINT, _checkpoint_identity(_newest_checkpoint(config.out)))
        result = train(config, stop_at_step=args.stop_at_step, resume=not args.no_resume)
    except HtmllmError as exc:
        print(f"htmllm train: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the run directory cannot be written (a file in the way, disk full)
        print(f"htmllm train: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    if not result.master:
        # Under torchrun, rank 0 reports the run: one JSON document on stdout, not one per process.
        return 0
    report = {"steps": result.steps, "model": str(result.model_dir) if result.model_dir else None}
    report.update(result.summary)
    print(json.dumps(report, indent=2))
    return 0
