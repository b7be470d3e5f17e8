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

logger = logging.getLogger(__name__)


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


def check_loads(checkpoint: Path, tasks: Sequence[Task], existing: Sequence[HeadSpec]) -> None:
    """Refuse a checkpoint that does not load (as the service, `htmllm embed` and export-onnx load it)
    before any page is embedded, with what to do about it.

    `save_heads` checks the heads it writes, not the ones it keeps: a checkpoint holding another, broken
    head had been given new heads after hours of embedding (or none, from a warm cache, where the Engine
    never loads it) and stayed unservable. A head this run replaces may be the broken one (a head fit on
    another encoder, retrained under its own name as the load error advises): the checkpoint is then
    loaded as the save will leave it, without those heads.
    """
    from service.core.checkpoint import load_checkpoint
    from service.core.errors import CheckpointError

    replaced = {task.spec.name for task in tasks} & {spec.name for spec in existing}
    try:
        load_checkpoint(checkpoint, without_heads=replaced)
    except CheckpointError as exc:
        raise CheckpointError(
            f"{exc}. Nothing was trained: the heads would go into a checkpoint that the service, `htmllm "
            "embed` and export-onnx refuse. Fix it first (a broken head: retrain it under its own name, with "
            "a task of that name, or remove its entry from htmllm.json's heads and its heads/<name>"
            ".safetensors), or train into a checkpoint that loads"
        ) from exc


def update_card(checkpoint: Path, before: Sequence[HeadSpec]) -> None:
    """Rewrite the heads section of the checkpoint's MODEL_CARD.md (`make default-model` writes one)
    from htmllm.json after a save, or say that the card is stale where it has no section to rewrite: a
    published checkpoint's card had gone on listing the heads it was bundled with. The card is left as
    it was where it cannot be rewritten; the heads are saved by then."""
    from model_training.default_model import CARD_FILE, update_card_heads
    from service.core.atomic_files import replaced_atomically
    from service.core.checkpoint import read_meta
    from service.core.errors import HtmllmError

    card = checkpoint / CARD_FILE
    if not card.is_file():
        return
    try:
        after = read_meta(checkpoint).heads
        text = card.read_text(encoding="utf-8")
        updated = update_card_heads(text, before, after)
        if updated is not None and updated != text:
            with replaced_atomically(card, mode=card.stat().st_mode & 0o777) as staged:
                staged.write_text(updated, encoding="utf-8")
    except (OSError, UnicodeError, HtmllmError) as exc:
        logger.warning(
            "%s could not be updated (%s): it still lists the heads as they were before this training; "
            "update it by hand",
            card,
            exc,
        )
        return
    if updated is None:
        logger.warning(
            "%s has no heads section `heads train` can rewrite (written by hand, or its section edited): "
            "it may not list the heads %s holds now (%s); update it by hand",
            card,
            checkpoint,
            ", ".join(spec.name for spec in after),
        )


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
        before = read_meta(args.checkpoint).heads
        check_columns(tasks, before)  # before the pages are embedded
        check_loads(args.checkpoint, tasks, before)
        trained = train_heads(args.checkpoint, tasks, config, max_length=args.max_length)
        save_heads(args.checkpoint, trained.heads, fit_on=trained.encoder)
    except (HtmllmError, ValueError) as exc:
        code = getattr(exc, "code", "validation_error")
        print(f"htmllm heads train: {code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the cache or the checkpoint cannot be written
        print(f"htmllm heads train: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    update_card(args.checkpoint, before)
    for name, (spec, _) in trained.heads.items():
        figures = ", ".join(_figure(k, v) for k, v in spec.metrics.items())
        print(f"{name}: {len(spec.labels)} labels; {figures}")
    if trained.excluded:
        # Every one: `eval run` lists them in report.json, and this command writes no report.
        print(f"{len(trained.excluded)} page(s) excluded from every head (failed pruning):")
        for line in trained.excluded:
            print(f"  {line}")
    return 0
