"""`resolve_device`: the one device check of the teacher command and of pretraining."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_training.data import DataError
from model_training.devices import resolve_device
from model_training.pretrain import train
from model_training.train_config import TrainConfig


def test_auto_and_cpu_devices_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (resolve_device("auto"), resolve_device("cpu")) == ("cpu", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert (resolve_device("auto"), resolve_device("cuda:0")) == ("cuda", "cuda:0")
    with pytest.raises(DataError, match="1 CUDA device"):
        resolve_device("cuda:1")


def test_a_local_rank_numbers_a_cuda_device_given_without_an_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun each process takes the GPU of its local rank, whether asked for cuda or auto."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [resolve_device(d, local_rank=1) for d in ("auto", "cuda", "cuda:0", "cpu")] == [
        "cuda:1",
        "cuda:1",
        "cuda:0",
        "cpu",
    ]
    with pytest.raises(
        DataError, match=r"config: device 'cuda' for local rank 2 \(cuda:2\): torch sees 2 CUDA"
    ):
        resolve_device("cuda", local_rank=2, source="config: ")
    # A launcher that shows each rank only its own GPU: the one visible device, not cuda:<rank>.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda", local_rank=3) == "cuda:0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", local_rank=1) == "cpu"


def test_training_on_cuda_without_one_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = TrainConfig(shards=str(tmp_path / "none"), out=str(tmp_path / "run"), device="cuda")
    with pytest.raises(DataError, match="config: device 'cuda': torch sees no CUDA device here"):
        train(config)
    assert not (tmp_path / "run").exists()
