"""`htmllm eval run`: frozen-encoder evaluation with MLP heads, baselines, NMM and the two studies.

Every page is embedded by the same Engine the service runs (cached by content hash under `--cache`),
an MLP head is trained per task with 5-fold cross-validation by site, and the report (Markdown, JSON and
a plot of metric vs context length) compares the checkpoints with random embeddings, TF-IDF and MiniLM.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model_training.evaluation.runner import EvalConfig


def int_list(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None


def seed_list(value: str) -> tuple[int, ...]:
    """`int_list`, each seed once: `--seeds 0,0` had run seed 0 once and said nothing of the other."""
    seeds = int_list(value)
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(
            f"seed {', '.join(map(str, repeated))} is given more than once in {value!r}: each seed is one "
            "run of the heads, so a repeat would run the same one again"
        )
    return seeds


def name_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def add_head_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by `eval run` and `heads train`: the head, its training, the cache, the device."""
    parser.add_argument("--tasks", required=True, type=Path, help="a task directory, or a directory of them")
    parser.add_argument(
        "--cache",
        default="runs/eval-cache",  # a str: Path("") would become "." and cache into the working directory
        help="embedding cache directory (content-hash keyed); '' for none",
    )
    parser.add_argument("--hidden", type=int, default=512, help="hidden units of the MLP head")
    parser.add_argument("--max-epochs", type=int, default=200, help="upper bound on head training epochs")
    parser.add_argument(
        "--patience", type=int, default=15, help="epochs without validation gain before stopping"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate of the head")
    parser.add_argument("--folds", type=int, default=5, help="folds for tasks whose rows carry none")
    parser.add_argument("--seed", type=int, default=0, help="seed of head initialisation and data order")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device of the encoder")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="encoder precision (reduced precision on CUDA only)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for the encoder (default: torch's)"
    )


def unusable_precision(args: argparse.Namespace, prog: str) -> bool:
    """Whether the Engine cannot run at `--dtype` on `--device` (`precision_problem`), said in one line on
    stderr: a command of `add_head_flags` returns 2 then, before any page is read. The Engine had refused
    float16 on a CPU only when it started, once every page was pruned."""
    from model_training.devices import precision_problem

    problem = precision_problem(args.device, args.dtype)
    if problem is None:
        return False
    print(f"{prog}: --dtype {args.dtype} cannot run on --device {args.device}: {problem}", file=sys.stderr)
    return True


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("eval", help="evaluate frozen encoders with MLP heads (NMM, studies)")
    parser.set_defaults(func=lambda _args: usage(parser))
    commands = parser.add_subparsers(dest="eval_command", metavar="ACTION")
    run_parser = commands.add_parser("run", help="embed, train heads with 5-fold CV, write the report")
    run_parser.add_argument(
        "--checkpoint",
        action="append",
        type=Path,
        default=[],
        help="checkpoint directory; repeat to compare several",
    )
    run_parser.add_argument(
        "--truncate",
        type=int_list,
        default=(),
        help="comma-separated max token lengths (the truncation study), e.g. 512,2048,4096,8192; "
        "default: each checkpoint's max_length",
    )
    run_parser.add_argument(
        "--input",
        type=name_list,
        # A string, which argparse passes through `type` as it would the flag's: the help shows
        # "(default: html)", where the tuple had shown as "(default: ('html',))".
        default="html",
        help="html (pruned HTML), text (union-extracted text) or html,text (the input study)",
    )
    run_parser.add_argument(
        "--baselines",
        type=name_list,
        default="random,tfidf,minilm",
        help="comma-separated baselines: random, tfidf, minilm ('' for none)",
    )
    run_parser.add_argument(
        "--seeds",
        type=seed_list,
        default=(),
        help="comma-separated seeds: repeat the heads' training (and fold assignment where rows carry no "
        "folds) per seed on the cached embeddings and report each figure's mean and std over them "
        "(default: --seed alone)",
    )
    run_parser.add_argument("--out", type=Path, default=Path("runs/eval"), help="report directory")
    run_parser.add_argument("--title", default="Evaluation report", help="the report's heading")
    add_head_flags(run_parser)
    run_parser.set_defaults(func=run)


def cache_kept(args: argparse.Namespace) -> str:
    """What an interrupted `eval run` or `heads train` keeps: each stage finished, in the cache, where the
    same command finds it (a stage's results are saved when it ends, each cache file replaced whole)."""
    if not args.cache:
        return "nothing is kept (--cache ''): run the same command again to start over"
    return (
        f"the stages finished (pages pruned, extracted, a checkpoint's or baseline's embeddings) are kept "
        f"in the cache {args.cache}: run the same command again to go on from them"
    )


def interrupted_run(args: argparse.Namespace) -> str:
    """The cache, and the report directory as it was (the report is written at the end), or none where
    the run made it (`run`)."""
    if not Path(args.out).exists():
        return f"no {args.out} is left behind (the report is written at the end); {cache_kept(args)}"
    return f"the report in {args.out} is written at the end; {cache_kept(args)}"


ON_INTERRUPT = {"run": interrupted_run}


def usage(parser: argparse.ArgumentParser) -> int:
    """What a command group does without its ACTION: print its help, exit status 2."""
    parser.print_help()
    return 2


def eval_config(args: argparse.Namespace, **overrides: Any) -> EvalConfig:
    """The `EvalConfig` of `eval run`'s or `heads train`'s flags, its `checkpoints` checked to be
    checkpoint directories first (`check_checkpoint_path`, as `htmllm embed`, `serve` and `export-onnx`
    check theirs): a training run's folder named for its `model/` had been "htmllm.json is missing" with
    no word of the checkpoint inside, where those commands say which one was meant."""
    from model_training.evaluation.heads import HeadConfig
    from model_training.evaluation.runner import EvalConfig
    from service.core.checkpoint_path import check_checkpoint_path

    for checkpoint in overrides.get("checkpoints", ()):
        check_checkpoint_path(Path(checkpoint), "--checkpoint")
    head = HeadConfig(
        hidden=args.hidden, max_epochs=args.max_epochs, patience=args.patience, lr=args.lr, seed=args.seed
    )
    cache = Path(args.cache) if args.cache else None
    return EvalConfig(
        head=head,
        cache_dir=cache,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        threads=args.threads,
        **overrides,
    )


def run(args: argparse.Namespace) -> int:
    """Evaluate and write the report into `--out`.

    A run that fails (bad tasks, Ctrl-C, a full disk) leaves no `--out` it made itself, nor part of a
    report (`output_dir`): an empty directory had looked like a report's to whoever listed it later. What
    a rerun goes on from is the cache, which is never removed: its files are none of the report's, so a
    `--cache` inside `--out` (or inside a parent the run made) keeps that directory."""
    from model_training.evaluation.report import JSON_FILE, MARKDOWN_FILE, PLOT_FILE, write_report
    from model_training.evaluation.runner import run_evaluation, seed_spread, unservable_line
    from model_training.evaluation.tasks import load_tasks
    from model_training.outputs import file_names, output_dir
    from service.core.errors import HtmllmError

    if unusable_precision(args, "htmllm eval run"):
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    report = file_names(MARKDOWN_FILE, JSON_FILE, PLOT_FILE)
    try:
        # Made before the run, not after an hour of embedding.
        with output_dir(args.out, written=report, complete=JSON_FILE):
            seeds = list(args.seeds) or [args.seed]
            results = []
            for seed in seeds:  # the embeddings are cached by the first run: the next ones train heads only
                seeded = argparse.Namespace(**{**vars(args), "seed": seed})
                config = eval_config(
                    seeded,
                    checkpoints=tuple(args.checkpoint),
                    truncate=args.truncate,
                    inputs=args.input,
                    baselines=args.baselines,
                )
                tasks = load_tasks(args.tasks, k=args.folds, seed=seed)
                results.append(run_evaluation(tasks, config))
            result = results[0]
            # The seeds run, in report.json's config beside `seed` (the first's, whose tables it shows).
            result.config["seeds"] = seeds
            if len(results) > 1:
                result.spread = seed_spread(results)
            written = write_report(result, args.out, title=args.title)
    except (HtmllmError, ValueError) as exc:
        code = getattr(exc, "code", "validation_error")
        print(f"htmllm eval run: {code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the cache or the report directory cannot be written
        print(f"htmllm eval run: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    for entry in result.unservable_heads:  # said again last, where a long run's log ends
        print(f"htmllm eval run: warning: {unservable_line(entry)}", file=sys.stderr)
    return 0
