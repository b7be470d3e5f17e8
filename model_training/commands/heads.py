"""`htmllm heads train`: train a task head per task on a checkpoint's embeddings and save it into it;
`htmllm heads remove` and `htmllm heads rename`: remove or rename a head of a checkpoint.

The heads are `TaskHead`s written by `service.core.checkpoint.save_heads` with their labels and their
cross-validated metrics, so the service serves them; the encoder's weights are never touched. Each
command changes htmllm.json and heads/ as one commit, and rewrites the heads of the checkpoint's
MODEL_CARD.md within the same hold of the heads lock, so that two commands run at once cannot leave a
card listing other heads than htmllm.json.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_training.commands.eval import add_head_flags, cache_kept, eval_config, unusable_precision, usage

if TYPE_CHECKING:
    from model_training.evaluation.tasks import Task
    from service.core.modeling import HeadSpec

logger = logging.getLogger(__name__)


# What argparse takes for a negative number, and so as a positional argument (`-1`), not an option.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


class HeadNamesParser(argparse.ArgumentParser):
    """The parser of each `htmllm heads` command: where the command takes head names (`remove NAME`,
    `rename OLD NEW`), a name that begins with '-' is refused with a usage error that says to put the
    names after `--`.

    A head may be called `-x` (`new_head_name_problem` allows it, as a task's name), but argparse reads
    any argument that begins with '-' as an option, wherever it stands, and cannot be told to take it
    as a positional; `--` (the end of the options) is its one way. Its own error named another
    argument: `htmllm heads rename --checkpoint c a -x` said "the following arguments are required:
    new", of an argument that was given."""

    def parse_known_args(  # type: ignore[override]  # typeshed overloads it on the namespace's type
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = list(sys.argv[1:] if args is None else args)
        names = [action.dest for action in self._actions if not action.option_strings]
        if names:
            options = given[: given.index("--")] if "--" in given else given
            dashed = next((arg for arg in options if self._unknown_option(arg)), None)
            if dashed is not None:
                self.error(
                    f"{dashed!r} reads as an option (it begins with '-'), and the command has none of that "
                    "name: a head name that begins with '-' goes after `--`, which ends the options: "
                    f"{self.prog} --checkpoint CHECKPOINT -- {' '.join(names)}"
                )
        return super().parse_known_args(args, namespace)

    def _unknown_option(self, arg: str) -> bool:
        """Whether argparse reads `arg` as an option this parser does not have (by its rules: a '-'
        first, not a negative number, no space; an option may be abbreviated, or given `=VALUE`)."""
        if not arg.startswith("-") or arg == "-" or " " in arg or _NEGATIVE_NUMBER.fullmatch(arg):
            return False
        name = arg.split("=", 1)[0]
        options = [option for action in self._actions for option in action.option_strings]
        if name in options:
            return False
        long_name = name.startswith("--") and len(name) > 2
        return not (long_name and self.allow_abbrev and any(option.startswith(name) for option in options))


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "heads", help="train task heads into a checkpoint, for the service to serve; remove or rename them"
    )
    parser.set_defaults(func=lambda _args: usage(parser))
    commands = parser.add_subparsers(dest="heads_command", metavar="ACTION", parser_class=HeadNamesParser)
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
    remove = commands.add_parser(
        "remove", help="remove a head from a checkpoint: its htmllm.json entry and its file, at once"
    )
    remove.add_argument(
        "--checkpoint", required=True, type=Path, help="checkpoint directory holding the head"
    )
    remove.add_argument(
        "name",
        help="the head to remove (as htmllm.json and /info name it; after `--` where it begins with '-')",
    )
    remove.set_defaults(func=run_remove)
    rename = commands.add_parser(
        "rename", help="rename a head of a checkpoint (its weights, labels and metrics kept)"
    )
    rename.add_argument(
        "--checkpoint", required=True, type=Path, help="checkpoint directory holding the head"
    )
    rename.add_argument("old", help="the head's name now")
    rename.add_argument(
        "new",
        help="its new name: ASCII letters, digits, '_' and '-', no other head's (the names after `--` where "
        "one begins with '-')",
    )
    rename.set_defaults(func=run_rename)


def interrupted_train(args: argparse.Namespace) -> str:
    """The cache, and the checkpoint's heads as they were (`save_heads` commits them all at once, at
    the end)."""
    return f"no head was written into {args.checkpoint}; {cache_kept(args)}"


def interrupted_edit(args: argparse.Namespace) -> str:
    """A remove or rename commits htmllm.json and heads/ at once; the card is rewritten after."""
    return (
        f"the heads of {args.checkpoint} are as they were or as edited, never a mix (an edit interrupted "
        "once committed is completed by the next load): its htmllm.json says which, and its MODEL_CARD.md "
        "may still list them as they were"
    )


ON_INTERRUPT = {"train": interrupted_train, "remove": interrupted_edit, "rename": interrupted_edit}


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
    from service.core.head_files import case_clash

    for task in tasks:
        problem = new_head_name_problem(task.spec.name)
        if problem is not None:
            raise EvaluationError(
                f"task {task.spec.name!r} ({task.path}) cannot be a head: {problem}; rename the task in its "
                "task.json"
            )
    replaced = {task.spec.name for task in tasks}
    kept = [spec.name for spec in existing if spec.name not in replaced]
    alike = case_clash([*kept, *(task.spec.name for task in tasks)])  # in order: the message names the later
    if alike is not None:  # as `save_heads` would refuse it, once every page was embedded
        raise EvaluationError(
            f"task {alike[1]!r} differs from head or task {alike[0]!r} only in case, one file on a "
            "case-insensitive file system: rename the task in its task.json"
        )
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
            f"a task of that name, or remove it: `htmllm heads remove --checkpoint {checkpoint} NAME`), or "
            "train into a checkpoint that loads"
        ) from exc


def update_card(checkpoint: Path, before: Sequence[HeadSpec]) -> None:
    """Rewrite the heads section of the checkpoint's MODEL_CARD.md (`make default-model` writes one)
    from htmllm.json after a change of its heads (`before`: the heads before it), or say that the card
    is stale where it has no section to rewrite: a published checkpoint's card had gone on listing the
    heads it was bundled with. The card is left as it was where it cannot be rewritten; the heads are
    saved by then. The caller holds the heads lock since before it read `before` (`_changing_heads`)."""
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
            "%s could not be updated (%s): it still lists the heads as they were before this change; "
            "update it by hand",
            card,
            exc,
        )
        return
    if updated is None:
        logger.warning(
            "%s has no heads section `htmllm heads` can rewrite (written by hand, or its section edited): "
            "it may not list the heads %s holds now (%s); update it by hand",
            card,
            checkpoint,
            ", ".join(spec.name for spec in after),
        )


@contextlib.contextmanager
def _changing_heads(checkpoint: Path) -> Iterator[None]:
    """Hold the checkpoint's heads lock over a change of its heads (the block) and the rewrite of its
    card that follows, reading the heads before the change under it too. Rewritten after the lock was
    let go, two runs at once had left a card listing the heads of the one that wrote its card last,
    not those htmllm.json holds (its heads read before the other's save, its card written after). The
    block's own `save_heads`, `remove_head` or `rename_head` takes the lock again (re-entrant). Not
    over a failed change: it wrote nothing, and the card is left as it was."""
    from service.core.checkpoint import read_meta
    from service.core.heads_stage import heads_lock

    read_meta(checkpoint)  # a checkpoint, its stage completed, before its heads/ or lock file is made
    with heads_lock(checkpoint):
        before = read_meta(checkpoint).heads
        yield
        update_card(checkpoint, before)


def run_remove(args: argparse.Namespace) -> int:
    from service.core.head_files import remove_head

    def remove() -> str:
        remove_head(args.checkpoint, args.name)
        return f"removed head {args.name!r} from {args.checkpoint}"

    return _edit("remove", args.checkpoint, remove)


def run_rename(args: argparse.Namespace) -> int:
    from service.core.head_files import rename_head

    def rename() -> str:
        rename_head(args.checkpoint, args.old, args.new)
        return f"renamed head {args.old!r} of {args.checkpoint} to {args.new!r}"

    return _edit("rename", args.checkpoint, rename)


def _edit(command: str, checkpoint: Path, edit: Callable[[], str]) -> int:
    """Run a remove or rename (`edit`, which says what it did) with the card rewritten under the same
    lock: exit status 0; 2 for a head name refused (no such head, a new name taken or not allowed), as
    for any other misuse of the command line; 1 for a checkpoint that cannot be read or written."""
    from service.core.checkpoint_path import check_checkpoint_path
    from service.core.errors import ErrorCode, HtmllmError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        # A training run's folder is pointed to its `model/`, as `heads train` points it.
        check_checkpoint_path(Path(checkpoint), "--checkpoint")
        with _changing_heads(checkpoint):
            done = edit()
    except HtmllmError as exc:
        print(f"htmllm heads {command}: {exc.code}: {exc}", file=sys.stderr)
        return 2 if exc.code in (ErrorCode.UNKNOWN_HEAD, ErrorCode.VALIDATION) else 1
    except OSError as exc:  # heads/ cannot be written (a read-only mount)
        print(f"htmllm heads {command}: cannot read or write a file: {exc}", file=sys.stderr)
        return 1
    print(done)
    return 0


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

    if unusable_precision(args, "htmllm heads train"):  # a usage error, before any page is pruned
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        # The options first (cheap, and a bad --lr had failed only once every page was embedded).
        config = eval_config(args, checkpoints=(args.checkpoint,), baselines=())
        tasks = load_tasks(args.tasks, k=args.folds, seed=args.seed)
        before = read_meta(args.checkpoint).heads
        check_columns(tasks, before)  # before the pages are embedded
        check_loads(args.checkpoint, tasks, before)
        trained = train_heads(args.checkpoint, tasks, config, max_length=args.max_length)
        with _changing_heads(args.checkpoint):
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
