"""The training data in memory and the batches drawn from it: what each micro-batch of a step holds.

`load_splits` reads the shards and their teacher vectors into aligned train and held-out splits;
`BatchOrder` decides which documents form micro-batch k as a pure function of (seed, epoch, rank), which
is what lets a resumed run continue the data exactly where the interrupted one stopped; `collate` turns
them into padded tensors. Kept apart from the loop in `pretrain`, which only asks for micro-batch k.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from model_training.data import HELDOUT, TRAIN, DataError, ids_digest, read_manifest, read_shard
from model_training.teacher import load_teacher_embeddings


@dataclass
class SplitData:
    """One split in memory: token id arrays, their teacher vectors (aligned rows), document ids."""

    ids: list[np.ndarray]
    teacher: np.ndarray  # (N, T) float32
    doc_ids: list[str]


def load_splits(
    shards: str | Path, teacher: str | Path | None
) -> tuple[SplitData, SplitData, dict[str, Any]]:
    """(train, heldout, provenance) from a shards directory and its teacher directory.

    `teacher` None (a run without distillation): no teacher vectors are read; each split carries an
    (N, 0) teacher matrix and the provenance's teacher is None.
    """
    manifest = read_manifest(shards)
    teacher_meta, arrays = (
        load_teacher_embeddings(teacher, shards)
        if teacher is not None
        else (None, [None] * len(manifest["shards"]))
    )
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[str]]] = {
        TRAIN: ([], [], []),
        HELDOUT: ([], [], []),
    }
    for entry, vectors in zip(manifest["shards"], arrays, strict=True):
        table = read_shard(shards, entry, columns=["id", "split", "input_ids"])
        splits = table.column("split").to_pylist()
        doc_ids = table.column("id").to_pylist()
        # The teacher's rows were checked against the manifest's ids hash; the shard's own rows must
        # match it too, or a shard rewritten under an old manifest would pair pages with other pages'
        # teacher vectors (same row count, so nothing else notices).
        if ids_digest([str(i) for i in doc_ids]) != entry["ids_sha256"]:
            raise DataError(
                f"shard {entry['file']} in {shards} does not hold the rows its manifest lists "
                f"(overwritten by an interrupted `htmllm data prepare`?); prepare the shards again"
            )
        for row, ids in enumerate(table.column("input_ids").to_pylist()):
            ids_list, vec_list, names = parts[str(splits[row])]
            ids_list.append(np.asarray(ids, dtype=np.int64))
            if vectors is not None:
                vec_list.append(vectors[row])
            names.append(str(doc_ids[row]))

    def build(name: str) -> SplitData:
        ids_list, vec_list, names = parts[name]
        if teacher_meta is None:
            return SplitData(ids=ids_list, teacher=np.zeros((len(ids_list), 0), np.float32), doc_ids=names)
        dim = teacher_meta.dim
        matrix = np.stack(vec_list).astype(np.float32) if vec_list else np.zeros((0, dim), np.float32)
        return SplitData(ids=ids_list, teacher=matrix, doc_ids=names)

    teacher_record = None if teacher_meta is None else teacher_meta.__dict__
    return build(TRAIN), build(HELDOUT), {"teacher": teacher_record, "shards": manifest}


def collate(seqs: list[np.ndarray], *, max_length: int, pad_id: int, sep_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded (B, L) ids and mask; longer documents are cut to `max_length`, keeping [SEP] last."""
    cut = [s if len(s) <= max_length else np.concatenate([s[: max_length - 1], [sep_id]]) for s in seqs]
    width = max(len(s) for s in cut)
    ids = torch.full((len(cut), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(cut), width), dtype=torch.long)
    for row, seq in enumerate(cut):
        ids[row, : len(seq)] = torch.from_numpy(seq)
        mask[row, : len(seq)] = 1
    return ids, mask


class BatchOrder:
    """Which documents form micro-batch k: a pure function of (seed, epoch, rank), so resumable.

    Every epoch is a fresh permutation; each rank takes every world-th document of it; a rank's last
    incomplete batch is dropped so all ranks take the same number of equally sized steps.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, rank: int = 0, world: int = 1) -> None:
        self.n, self.batch_size, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.per_epoch = (n // world) // batch_size
        if self.per_epoch < 1:
            raise DataError(
                f"{n} training documents cannot fill one batch of {batch_size} on each of {world} processes"
            )

    def indices(self, micro_batch: int) -> np.ndarray:
        epoch, index = divmod(micro_batch, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)[self.rank :: self.world]
        return order[index * self.batch_size : (index + 1) * self.batch_size]
