"""The data one pretraining run trains on: shards checked against their tokenizer, split into train and
held-out pages, with the teacher's vector of each page when the run distils.

`load_run_data(config)` is the first thing `pretrain.train` reads. A run distils when its
`loss_weights.distil` is above 0; at 0 it trains MLM + bag-of-words alone and reads no teacher vectors
at all (a language without a good teacher model needs none): its splits carry an (N, 0) teacher matrix
and `RunData.teacher_dim` is None, which is what tells the model to build no distillation head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_training.batches import SplitData, load_splits
from model_training.data import (
    TOKENIZER_FILE,
    DataError,
    read_manifest,
)
from model_training.teacher import TEACHER_META_FILE
from model_training.train_config import DEFAULT_TEACHER_DIR, TrainConfig
from service.core.tokenizer import HtmlTokenizer

logger = logging.getLogger(__name__)


def distils(config: TrainConfig) -> bool:
    """Whether the run trains the distillation objective (and so needs teacher vectors)."""
    return config.loss_weights.get("distil", 0.0) > 0


@dataclass
class RunData:
    """The run's tokenizer, its two splits, and the provenance its checkpoints record.

    `provenance` is `{"shards": manifest.json, "teacher": teacher.json's fields}`, the teacher None for
    a run without distillation.
    """

    tokenizer: HtmlTokenizer
    train: SplitData
    heldout: SplitData
    provenance: dict[str, Any]

    @property
    def teacher_dim(self) -> int | None:
        """The teacher vectors' dimension; None when the run does not distil."""
        return None if self.provenance["teacher"] is None else int(self.train.teacher.shape[1])

    @property
    def shards_length(self) -> int | None:
        """The length the shards' documents were cut to (None: not recorded)."""
        length = self.provenance["shards"].get("max_length")
        return int(length) if length else None

    def train_centroid(self) -> np.ndarray | None:
        """The mean training teacher vector (the held-out cosine's floor); None without a teacher."""
        teacher = self.train.teacher
        if self.teacher_dim is None:
            return None
        return teacher.mean(axis=0) if len(teacher) else np.zeros(teacher.shape[1], np.float32)


def load_run_data(config: TrainConfig) -> RunData:
    """The shards of `config.shards` and, when the run distils, the teacher vectors of `config.teacher`.

    The manifest first: a wrong --shards is "not a shards directory", not a missing tokenizer file.
    """
    manifest = read_manifest(config.shards)
    tokenizer_file = Path(config.shards) / TOKENIZER_FILE
    tokenizer = HtmlTokenizer.from_file(tokenizer_file)
    if tokenizer.sha256 != manifest.get("tokenizer_sha256"):
        # The ids in the shards are only meaningful under the tokenizer that made them: another one of the
        # same size trains silently and the checkpoint names the wrong tokenizer; a smaller one fails with
        # an IndexError in the embedding.
        raise DataError(
            f"{tokenizer_file} (sha256 {tokenizer.sha256[:16]}) is not the tokenizer the shards were made "
            f"with (manifest.json records {str(manifest.get('tokenizer_sha256'))[:16]}); restore it or "
            "re-run `htmllm data prepare`"
        )
    if distils(config):
        check_teacher_given(config)
        train, heldout, provenance = load_splits(config.shards, config.teacher)
        return RunData(tokenizer, train, heldout, provenance)
    if config.teacher != DEFAULT_TEACHER_DIR:
        # Given on purpose and then ignored without a word, a user would read the run as distilled.
        logger.warning(
            "loss_weights.distil = 0: training without distillation; the teacher vectors in %s are not read",
            config.teacher,
        )
    train, heldout, provenance = load_splits(config.shards, None)
    return RunData(tokenizer, train, heldout, provenance)


def check_teacher_given(config: TrainConfig) -> None:
    """Refuse a distilling run without teacher vectors in a line that says where the path came from.

    "runs/teacher/teacher.json is missing" named a path the user never gave (the config's default).
    """
    if (Path(config.teacher) / TEACHER_META_FILE).is_file():
        return
    given = (
        ""
        if config.teacher != DEFAULT_TEACHER_DIR
        else " (the default: neither the config nor --teacher set one)"
    )
    raise DataError(
        f"no teacher vectors in {config.teacher}{given}: {TEACHER_META_FILE} is missing; run `htmllm teacher "
        f"embed --input {config.shards} --out DIR` and pass --teacher DIR (or set teacher in the config), "
        "or set loss_weights.distil = 0 to train without distillation (MLM and bag-of-words only)"
    )
