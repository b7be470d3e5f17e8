"""Training subcommands of `htmllm`, registered through the `htmllm.commands` entry point.

Every training command runs under `interruptible`: Ctrl-C and SIGTERM (what Slurm, Kubernetes and `kill`
send) end it with one line saying what was kept and how to go on, and the shell's status (130, 143), as
`htmllm embed` and `htmllm extract` end; Python's default was a KeyboardInterrupt traceback and status
-2, or for SIGTERM death on the spot. Each command module says what its run keeps (`ON_INTERRUPT`, by
the command's last word), since only it knows: a training run its last checkpoint, an evaluation its
embedding cache, a data preparation nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from service.commands.resume_state import sigterm_as_ctrl_c

# Each module exposes `register(subparsers)`, which adds its parser and sets `func`, and `ON_INTERRUPT`:
# for each command it adds (by its name's last word), what an interrupted run leaves, as a function of
# the command's arguments: "<what is kept>: <how to go on>".
TRAINING_COMMANDS: tuple[str, ...] = (
    "model_training.commands.tokenizer",
    "model_training.commands.data",
    "model_training.commands.teacher",
    "model_training.commands.train",
    "model_training.commands.tasks",
    "model_training.commands.eval",
    "model_training.commands.heads",
)

Command = Callable[[argparse.Namespace], int]
Kept = Callable[[argparse.Namespace], str]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    for name in TRAINING_COMMANDS:
        module = importlib.import_module(name)
        before = set(subparsers.choices)
        module.register(subparsers)
        kept: dict[str, Kept] = module.ON_INTERRUPT
        for added in sorted(set(subparsers.choices) - before):
            for command in commands(subparsers.choices[added]):
                word = command.prog.rsplit(" ", 1)[-1]
                if word not in kept:  # a command added without saying what its interruption leaves
                    raise RuntimeError(f"{name}.ON_INTERRUPT says nothing of `{command.prog}`")
                command.set_defaults(
                    func=interruptible(command.prog, command.get_default("func"), kept[word])
                )


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parsers below `parser` (itself included) that run something: those without an ACTION to
    choose (`htmllm data` alone only prints its help)."""
    groups = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not groups:
        yield parser
    for group in groups:
        for child in dict.fromkeys(group.choices.values()):  # an alias names its parser twice
            yield from commands(child)


def interruptible(prog: str, func: Command, kept: Kept) -> Command:
    """`func` with Ctrl-C, SIGTERM and SIGHUP ending it in one line on stderr, `<prog>: interrupted;
    <kept>` (`terminated (SIGTERM)`, `hung up (SIGHUP)`), and the shell's status for the signal: 130, 143
    or 129. The line is not written where it cannot be (a terminal hung up: EIO), and the status stands.

    Under torchrun every worker gets the signal: only rank 0 (`RANK`, torchrun's global rank) says the
    line, which would otherwise be printed once per process, interleaved."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        with sigterm_as_ctrl_c() as termination:
            try:
                return func(args)
            except KeyboardInterrupt:
                pass
        if os.environ.get("RANK", "0").strip() in ("0", ""):
            with contextlib.suppress(OSError):  # a hung-up terminal: the status still says what happened
                print(f"{prog}: {termination.how}; {kept(args)}", file=sys.stderr)
        return termination.status

    return run
