"""`htmllm train` under torchrun (two gloo processes on CPU): what the run reports, and how often."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from model_training.batches import BatchOrder, load_splits
from tests.model_training.test_pretrain import _build_run_inputs

WORLD = 2
STEPS, BATCH, GRAD_ACCUM, MAX_LENGTH, SEED = 2, 4, 2, 64, 3


def _train_rank(rank: int, port: int, root: str, results: Any) -> None:
    """One torchrun process: the command line as `torchrun -m service.cli train ...` runs it."""
    from service.cli import main

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
    )
    base = Path(root)
    args = ["train", "--config", str(base / "config.toml"), "--shards", str(base / "shards"), "--teacher",
            str(base / "teacher"), "--out", str(base / "ddp"), "--no-progress"]  # fmt: skip
    with (base / f"stdout-{rank}").open("w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
        results[rank] = main(args)


def _tokens_trained(root: Path) -> int:
    """The real tokens both processes' micro-batches hold, each document cut to MAX_LENGTH."""
    train_data, _, _ = load_splits(root / "shards", root / "teacher")
    total = 0
    for rank in range(WORLD):
        order = BatchOrder(len(train_data.ids), BATCH, seed=SEED, rank=rank, world=WORLD)
        for micro in range(STEPS * GRAD_ACCUM):
            total += sum(min(len(train_data.ids[i]), MAX_LENGTH) for i in order.indices(micro))
    return total


@pytest.mark.slow
def test_under_ddp_the_tokens_of_every_process_are_counted_and_rank_0_alone_reports(tmp_path: Path) -> None:
    """summary.json counted rank 0's tokens only (half of what 2 processes trained on), and stdout held
    two JSON documents: rank 1 printed `{"steps": 2, "model": null}` beside rank 0's report."""
    _build_run_inputs(tmp_path, documents=24)
    (tmp_path / "config.toml").write_text(
        f'[model]\npreset = "tiny"\nmax_length = {MAX_LENGTH}\n\n[optim]\nbatch_size = {BATCH}\n'
        f"grad_accum = {GRAD_ACCUM}\nmax_steps = {STEPS}\n\n[loss]\ndistil_rank = 8\n\n[run]\n"
        f'seed = {SEED}\ndevice = "cpu"\nthreads = 1\neval_every = 0\ncheckpoint_every = 0\n'
        "tensorboard = false\n",
        encoding="utf-8",
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    results = mp.Manager().dict()
    mp.spawn(_train_rank, args=(port, str(tmp_path), results), nprocs=WORLD, join=True)
    assert dict(results) == {0: 0, 1: 0}

    expected = _tokens_trained(tmp_path)
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text(encoding="utf-8"))
    assert summary["tokens_seen_this_session"] == summary["tokens_seen_all_sessions"] == expected
    report = json.loads((tmp_path / "stdout-0").read_text(encoding="utf-8"))  # one document, or it fails
    assert report["steps"] == STEPS and report["tokens_seen_this_session"] == expected
    assert (tmp_path / "stdout-1").read_text(encoding="utf-8") == ""
