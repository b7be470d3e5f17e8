"""Training subcommands of `htmllm`, registered through the `htmllm.commands` entry point."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

# Each module exposes `register(subparsers)`, which adds its parser and sets `func`.
TRAINING_COMMANDS: tuple[str, ...] = (
    "model_training.commands.tokenizer",
    "model_training.commands.data",
    "model_training.commands.teacher",
    "model_training.commands.train",
    "model_training.commands.tasks",
    "model_training.commands.eval",
    "model_training.commands.heads",
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    for name in TRAINING_COMMANDS:
        importlib.import_module(name).register(subparsers)
