"""`Engine.info`'s prune versions: the pruner the engine runs and the one its checkpoint was trained on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from service.core.checkpoint import load_checkpoint
from service.core.prune import PRUNE_VERSION
from service.engine.engine import Engine
from service.engine.runners.torch import TorchRunner


def test_info_names_the_pruner_it_runs_and_the_one_the_checkpoint_recorded(tiny_checkpoint: Path) -> None:
    """`prune_version` had been the checkpoint's recorded version (9) while every page was pruned by this
    build's (10): a caller comparing engines could not see what prunes its pages."""
    checkpoint = load_checkpoint(tiny_checkpoint)
    older = dataclasses.replace(checkpoint.meta, prune_version=f"{PRUNE_VERSION}-old")
    engine = Engine(TorchRunner(checkpoint.model), checkpoint.tokenizer, older)
    try:
        info = engine.info
        assert (info.prune_version, info.checkpoint_prune_version) == (PRUNE_VERSION, f"{PRUNE_VERSION}-old")
    finally:
        engine.close()
    current = Engine(TorchRunner(checkpoint.model), checkpoint.tokenizer, checkpoint.meta)
    try:
        assert current.info.prune_version == current.info.checkpoint_prune_version == PRUNE_VERSION
    finally:
        current.close()
