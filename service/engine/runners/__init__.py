"""Model runners: one per backend, each turning token-id batches into embeddings and head outputs.

A runner works in two steps so the batcher can overlap them: `prepare` (host-side collation, on a
worker thread, for batch n+1) and `run` (the forward pass, on the inference thread, for batch n).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class RunnerOutput:
    embeddings: np.ndarray  # float32 (B, D), unnormalised, rows in the order of the prepared batch
    scores: dict[str, np.ndarray]  # head -> float32 (B, C) probabilities or (B,) values
    # On an asynchronous device (CUDA): seconds the host took to issue the pass, up to waiting for the
    # device's results. Near the whole pass, the host is the bottleneck (kernel launches, the GIL shared
    # with the event loop); far below it, the device is. None where the host computes (CPU, onnx).
    host_s: float | None = None


@dataclass
class PreparedBatch:
    """Host-side tensors for one forward pass plus what the batcher reports about it."""

    payload: object  # backend-specific (padded arrays, or packed ids and offsets)
    documents: int
    tokens: int
    padded_tokens: int


class Runner(Protocol):
    backend: str
    device: str
    dtype: str
    attention: str  # the attention implementation (torch), or "graph" (onnx: the exported graph's)

    @property
    def threads(self) -> int:
        """CPU threads one forward pass runs on (torch's: the process's count, read when asked)."""
        ...

    def cost(self, lengths: Sequence[int]) -> int:
        """Tokens a batch of these lengths costs against `max_batch_tokens` (padded or packed)."""
        ...

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        """Collate token-id lists (each framed by [CLS]/[SEP]) into backend inputs."""
        ...

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        """The forward pass; raises whatever the backend raises (the batcher wraps it)."""
        ...

    def abort(self) -> None:
        """Stop a forward pass in flight, if the backend can (a child process is killed; a pass in this
        process cannot be stopped): at the shutdown deadline, when its documents have been failed."""
        ...

    def close(self) -> None:
        """Release sessions and device memory. Final: a `run` after it raises ShuttingDownError (never
        an AttributeError, nor a model process started again), so that a pass queued behind the close
        fails as the shutdown it is, not as a backend failure."""
        ...


def batch_cost(lengths: Sequence[int], *, packed: bool, pad_to: int | None = None) -> int:
    """Tokens a forward pass computes for documents of these lengths: their sum when packed
    padding-free, else every row padded to the longest (or to `pad_to`, when longer)."""
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(*lengths, pad_to or 0)


def pad_batch(
    batch: Sequence[Sequence[int]], pad_id: int, *, pad_to: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad to the longest (or `pad_to`) length: (B, L) int64 ids and (B, L) int64 attention mask."""
    length = max(len(ids) for ids in batch)
    if pad_to is not None:
        if pad_to < length:
            raise ValueError(f"pad_to {pad_to} is shorter than the longest document ({length})")
        length = pad_to
    ids = np.full((len(batch), length), pad_id, dtype=np.int64)  # (B, L)
    mask = np.zeros((len(batch), length), dtype=np.int64)  # (B, L)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask
