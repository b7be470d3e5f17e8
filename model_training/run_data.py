"""The data one pretraining run trains on: shards checked against their tokenizer, split into train and
held-out pages, with the teacher's vector of each page when the run distils.

`load_run_data(config)` is the first thing `pretrain.train` reads. A run distils when its
`loss_weights.distil` is above 0 (`TrainConfig.distils`); at 0 it trains MLM + bag-of-words alone and
reads no teacher vectors at all (a language without a good teacher model needs none): its splits carry
an (N, 0) teacher matrix and `RunData.teacher_dim` is None, which is what tells the model to build no
distillation head.
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
from model_training.train_config import TrainConfig
from service.core.tokenizer import HtmlTokenizer

logger = logging.getLogger(__name__)


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
    """The shards of `config.shards` and, when the run distils, the teacher vectors of
    `config.teacher_dir`.

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
    if config.distils:
        check_teacher_given(config)
        train, heldout, provenance = load_splits(config.shards, config.teacher_dir)
        return RunData(tokenizer, train, heldout, provenance)
    if config.teacher is not None:
        _warn_teacher_unread(config.teacher)
    train, heldout, provenance = load_splits(config.shards, None)
    return RunData(tokenizer, train, heldout, provenance)


def check_teacher_given(config: TrainConfig) -> None:
    """Refuse a distilling run without teacher vectors in a line that says where the path came from.

    "runs/teacher/teacher.json is missing" named a path the user never gave (the config's default).
    """
    if (Path(config.teacher_dir) / TEACHER_META_FILE).is_file():
        return
    given = "" if config.teacher is not None else " (the default: neither the config nor --teacher set one)"
    raise DataError(
        f"no teacher vectors in {config.teacher_dir}{given}: {TEACHER_META_FILE} is missing; run `htmllm "
        f"teacher embed --input {config.shards} --out DIR` and pass --teacher DIR (or set teacher in the "
        "config), or set loss_weights.distil = 0 to train without distillation (MLM and bag-of-words only)"
    )


def _warn_teacher_unread(teacher: str) -> None:
    """Say that the teacher the user named (--teacher, or the config's `teacher`) is not read.

    Given on purpose and then ignored without a word, a user would read the run as distilled. Named
    whatever the path (the default's too: given, it was meant), and not called "teacher vectors" where
    there are none (a path mistyped, or a config's teacher never embedded).
    """
    if (Path(teacher) / TEACHER_META_FILE).is_file():
        what = f"the teacher vectors in {teacher} (--teacher or the config's teacher) are"
    else:
        what = f"the teacher named by --teacher or the config, {teacher} (it holds no teacher vectors), is"
    logger.warning("loss_weights.distil = 0: training without distillation; %s not read", what)
