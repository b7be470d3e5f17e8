"""`htmllm heads train`: train a task head per task on a checkpoint's embeddings and save it into it.

The heads are `TaskHead`s written by `service.core.checkpoint.save_heads` with their labels and their
cross-validated metrics, so the service serves them; the encoder's weights are never touched.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_training.commands.eval import add_head_flags, cache_kept, eval_config, usage

if TYPE_CHECKING:
    from model_training.evaluation.tasks import Task
    from service.core.modeling import HeadSpec


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "heads", help="train task heads into a checkpoint, for the service to serve"
    )
    parser.set_defaults(func=lambda _args: usage(parser))
    commands = parser.add_subparsers(dest="heads_command", metavar="ACTION")
    train = commands.add_parser("train", help="train one MLP head per task and write it into the checkpoint")
    train.add_argument(
        "--checkpoint", required=True, type=Path, help="checkpoint directory to add the heads to"
    )
    train.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="max tokens per page, as the service will run (default: the checkpoint's)",
    )
    add_head_flags(train)
    train.set_defaults(func=run)


def interrupted_train(args: argparse.Namespace) -> str:
    """The cache, and the checkpoint's heads as they were (`save_heads` commits them all at once, at
    the end)."""
    return f"no head was written into {args.checkpoint}; {cache_kept(args)}"


ON_INTERRUPT = {"train": interrupted_train}


def check_columns(tasks: Sequence[Task], existing: Sequence[HeadSpec]) -> None:
    """Refuse a task whose head `save_heads` would refuse, or `htmllm embed` could not write: a head
    writes the column `<name>` (and `<name>.probs` for a classification head), which must be none of
    embed's fixed columns (`id`, `embedding`, `tokens`, ...) and no other head's.

    `htmllm embed` refuses such a checkpoint, so a head named `embedding` was trained and saved only to
    make the checkpoint's heads unusable there. The name rule is `save_heads`'s own
    (`new_head_name_problem`), checked here before any page is embedded; the heads kept from earlier
    runs count as taken.
    """
    from model_training.evaluation.metrics import EvaluationError
    from service.commands.embed import head_columns
    from service.core.checkpoint import new_head_name_problem

    for task in tasks:
        problem = new_head_name_problem(task.spec.name)
        if problem is not None:
            raise EvaluationError(
                f"task {task.spec.name!r} ({task.path}) cannot be a head: {problem}; rename the task in its "
                "task.json"
            )
    replaced = {task.spec.name for task in tasks}
    taken: dict[str, str] = {}
    for spec in existing:
        if spec.name not in replaced:
            what = f"the column of head {spec.name!r}"
            taken.update(dict.fromkeys(head_columns(spec.name, spec.kind), what))
    for task in tasks:
        name = task.spec.name
        for column in head_columns(name, task.spec.kind):
            if column in taken:
                raise EvaluationError(
                    f"task {name!r} ({task.path}) would be a head writing the column {column!r}, "
                    f"{taken[column]}; `htmllm embed` would refuse it: rename the task in its task.json"
                )
            taken[column] = f"the column of task {name!r}"


def _figure(name: str, value: float) -> str:
    """One recorded metric as printed: the tasks' hash in hex, as report.json shows it."""
    from model_training.evaluation.tasks import HASH_METRIC

    if name == HASH_METRIC:
        return f"tasks sha256 {int(value):012x}"
    return f"{name} {value}" if isinstance(value, int) else f"{name} {value:.4f}"


def run(args: argparse.Namespace) -> int:
    from model_training.evaluation.runner import train_heads
    from model_training.evaluation.tasks import load_tasks
    from service.core.checkpoint import read_meta, save_heads
    from service.core.errors import HtmllmError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        # The options first (cheap, and a bad --lr had failed only once every page was embedded).
        config = eval_config(args, checkpoints=(args.checkpoint,), baselines=())
        tasks = load_tasks(args.tasks, k=args.folds, seed=args.seed)
        check_columns(tasks, read_meta(args.checkpoint).heads)  # before the pages are embedded
        trained = train_heads(args.checkpoint, tasks, config, max_length=args.max_length)
        save_heads(args.checkpoint, trained.heads, fit_on=trained.encoder)
    except (HtmllmError, ValueError) as exc:
        code = getattr(exc, "code", "validation_error")
        print(f"htmllm heads train: {code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the cache or the checkpoint cannot be written
        print(f"htmllm heads train: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    for name, (spec, _) in trained.heads.items():
        figures = ", ".join(_figure(k, v) for k, v in spec.metrics.items())
        print(f"{name}: {len(spec.labels)} labels; {figures}")
    if trained.excluded:
        # Every one: `eval run` lists them in report.json, and this command writes no report.
        print(f"{len(trained.excluded)} page(s) excluded from every head (failed pruning):")
        for line in trained.excluded:
            print(f"  {line}")
    return 0
