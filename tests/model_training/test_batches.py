"""The training data in memory and its batches: the document order, padding, shard/teacher alignment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_training.batches import BatchOrder, collate, load_splits
from service.core.errors import HtmllmError
from tests.model_training.test_pretrain import _build_run_inputs


def test_batch_order_is_deterministic_and_splits_ranks() -> None:
    a = BatchOrder(20, 3, seed=1, rank=0, world=2)
    b = BatchOrder(20, 3, seed=1, rank=1, world=2)
    assert a.per_epoch == 3
    assert np.array_equal(a.indices(4), BatchOrder(20, 3, seed=1, rank=0, world=2).indices(4))
    epoch0 = np.concatenate([a.indices(k) for k in range(3)] + [b.indices(k) for k in range(3)])
    assert len(set(epoch0.tolist())) == 18  # no document twice within an epoch across ranks
    assert not np.array_equal(a.indices(0), a.indices(3))  # the next epoch is reshuffled
    with pytest.raises(HtmllmError):
        BatchOrder(3, 4, seed=0)


def test_collate_pads_and_cuts_keeping_sep_last() -> None:
    ids, mask = collate([np.array([2, 7, 8, 9, 3]), np.array([2, 7, 3])], max_length=4, pad_id=0, sep_id=3)
    assert ids.tolist() == [[2, 7, 8, 3], [2, 7, 3, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_a_shard_rewritten_under_an_old_manifest_is_refused(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    shards, teacher = _build_run_inputs(tmp_path, documents=32)
    load_splits(shards, teacher)
    # What an interrupted `data prepare` into the same directory used to leave: a full shard of other
    # rows (same count) under the old manifest, which training paired with the old teacher vectors.
    path = shards / "shard-00000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.take(list(reversed(range(table.num_rows)))), path)
    with pytest.raises(HtmllmError, match="does not hold the rows its manifest lists"):
        load_splits(shards, teacher)
