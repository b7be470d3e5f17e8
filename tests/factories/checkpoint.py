"""Tiny checkpoints for tests: the `tiny` preset with a real tokenizer and two task heads, built in-process.

`build_tiny_checkpoint(path)` is what engine, API, training and evaluation tests call when they need a
loadable checkpoint directory; it takes well under a second and never touches the shared corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from service.core.checkpoint import CheckpointMeta, save_checkpoint
from service.core.modeling import HeadSpec, HtmlEncoderModel, TaskHead, build_config
from service.core.prune import PRUNE_VERSION
from tests.factories.tokenizer import build_tiny_tokenizer

TINY_MAX_LENGTH = 128
CLASSIFICATION_HEAD = HeadSpec(
    name="page_type",
    kind="classification",
    labels=["article", "listing", "other"],
    hidden=16,
    metrics={"f1_macro": 0.5, "cv_folds": 5, "pages": 40},  # as evaluation records them: counts are ints
)
REGRESSION_HEAD = HeadSpec(name="quality", kind="regression", hidden=16)


def build_tiny_model(
    *,
    heads: bool = True,
    pooling: str = "cls",
    max_length: int = TINY_MAX_LENGTH,
    seed: int = 0,
    **config_overrides: Any,
) -> HtmlEncoderModel:
    """A randomly initialised `tiny` model (deterministic for a given seed), in eval mode; keyword
    arguments beyond these override the preset's config (e.g. `local_attention`)."""
    torch.manual_seed(seed)
    config = build_config("tiny", build_tiny_tokenizer(), max_length=max_length, **config_overrides)
    model = HtmlEncoderModel.from_config(config, pooling=pooling, attn_implementation="sdpa")
    if heads:
        for spec in (CLASSIFICATION_HEAD, REGRESSION_HEAD):
            model.add_head(TaskHead(spec, model.embedding_dim))
    return model.eval()


def build_tiny_checkpoint(
    path: str | Path,
    *,
    heads: bool = True,
    pooling: str = "cls",
    max_length: int = TINY_MAX_LENGTH,
    seed: int = 0,
) -> Path:
    """Write a tiny checkpoint directory at `path` (a classification and a regression head by default)."""
    root = Path(path)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(heads=heads, pooling=pooling, max_length=max_length, seed=seed)
    meta = CheckpointMeta(
        name="tiny-test",
        pooling=pooling,
        prune_version=PRUNE_VERSION,
        tokenizer_sha256=tokenizer.sha256,
        max_length=max_length,
        embedding_dim=model.embedding_dim,
        training={"preset": "tiny", "seed": seed, "note": "random weights, for tests only"},
    )
    save_checkpoint(root, model, tokenizer, meta)
    return root
