"""The PyTorch runner: padded SDPA batches on CPU (and CUDA without flash-attn), packed varlen on CUDA.

Attention backends (`ATTENTION_MODES`): under SDPA or eager attention every document keeps its own row
and padding is masked; documents are never packed into one row there, because SDPA with a padding mask
lets packed documents attend to each other. Under FlashAttention-2 the batch is packed padding-free into
one row and `cu_seq_lens` tells the varlen kernel where each document starts, so no compute is spent on
padding and the token budget counts real tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from service.core.cpus import intra_op_threads as choose_threads
from service.core.modeling import HtmlEncoderModel
from service.engine.runners import PreparedBatch, RunnerOutput, pad_batch

logger = logging.getLogger(__name__)

# attention implementation -> batch layout
ATTENTION_MODES: dict[str, str] = {"sdpa": "padded", "eager": "padded", "flash_attention_2": "packed"}
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def flash_attention_available() -> bool:
    """True when transformers can use the flash-attn package's FlashAttention-2 kernels."""
    from transformers.utils.import_utils import is_flash_attn_2_available

    return bool(is_flash_attn_2_available())


def cpu_has_fast_bfloat16() -> bool:
    """True when this CPU multiplies bfloat16 natively (AMX tiles or AVX512-BF16), as oneDNN needs.

    Elsewhere bfloat16 on CPU is emulated and slower than float32. torch exposes the check only
    privately, so a torch without it reads as "no".
    """
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def choose_attention(device: str, dtype: str, requested: str | None) -> str:
    """The attention implementation for this device: flash-attn on CUDA in half precision when present."""
    if requested is not None:
        if requested not in ATTENTION_MODES:
            raise ValueError(f"attention {requested!r} is not one of {sorted(ATTENTION_MODES)}")
        if requested == "flash_attention_2" and (device != "cuda" or dtype == "float32"):
            raise ValueError("flash_attention_2 needs CUDA and bfloat16 or float16")
        return requested
    if device == "cuda" and dtype != "float32" and flash_attention_available():
        return "flash_attention_2"
    return "sdpa"


class TorchRunner:
    """Runs an `HtmlEncoderModel` in inference mode; one instance is used from one thread at a time."""

    backend = "torch"

    def __init__(
        self,
        model: HtmlEncoderModel,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        attn_implementation: str | None = None,
        intra_op_threads: int | None = None,
        fast_forward: bool = True,
    ) -> None:
        """`fast_forward=False` runs transformers' own encoder forward instead of `encoder_forward`'s
        (which SDPA batches take by default); benchmarks compare the two. `intra_op_threads=None` sizes
        the CPU thread pool from OMP_NUM_THREADS or the CPU budget (`service.core.cpus`)."""
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(TORCH_DTYPES)}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for but CUDA is not available")
        if device == "cpu" and dtype == "float16":
            raise ValueError("float16 is for CUDA; on CPU use float32 or bfloat16")
        if device == "cpu" and dtype == "bfloat16" and not cpu_has_fast_bfloat16():
            logger.warning("bfloat16 on a CPU without AMX or AVX512-BF16 runs slower than float32")
        self.device = device
        self.dtype = dtype
        self.attention = choose_attention(device, dtype, attn_implementation)
        self.packed = ATTENTION_MODES[self.attention] == "packed"
        # torch's default is one thread per CPU in the affinity mask, which a container's CPU limit
        # turns into throttling (service.core.cpus); the choice is process-wide, as torch's pool is.
        choice = choose_threads(intra_op_threads)
        torch.set_num_threads(choice.threads)
        self.threads = choice.threads
        logger.info("torch runs %d intra-op threads (%s)", choice.threads, choice.reason)
        # Place first: transformers checks flash-attn against the weights' device and dtype.
        model.place(device, TORCH_DTYPES[dtype])  # heads stay float32: tiny, and scores stay exact
        model.encoder.set_attn_implementation(self.attention)
        self.model = model.eval()
        pad_id = model.config.pad_token_id
        if pad_id is None:
            raise ValueError("the model config has no pad_token_id")
        self.pad_id = int(pad_id)
        self._pin = device == "cuda"
        self.fast_forward = fast_forward

    def cost(self, lengths: Sequence[int]) -> int:
        if not lengths:
            return 0
        return sum(lengths) if self.packed else len(lengths) * max(lengths)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        tokens = sum(len(ids) for ids in batch)
        payload: dict[str, torch.Tensor | int]
        if self.packed:
            flat = torch.tensor([t for ids in batch for t in ids], dtype=torch.long)  # (T,)
            lengths = torch.tensor([len(ids) for ids in batch], dtype=torch.int32)  # (N,)
            offsets = torch.zeros(len(batch) + 1, dtype=torch.int32)  # (N+1,)
            offsets[1:] = torch.cumsum(lengths, 0)
            payload = {"ids": flat, "cu_seq_lens": offsets, "max_length": int(lengths.max())}
            padded = tokens
        else:
            ids_np, mask_np = pad_batch(batch, self.pad_id, pad_to=pad_to)
            payload = {"ids": torch.from_numpy(ids_np), "mask": torch.from_numpy(mask_np)}  # (B, L) each
            padded = int(ids_np.size)
        if self._pin:
            payload = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
        return PreparedBatch(payload=payload, documents=len(batch), tokens=tokens, padded_tokens=padded)

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        payload = cast(dict[str, torch.Tensor | int], prepared.payload)
        with torch.inference_mode():
            ids = cast(torch.Tensor, payload["ids"]).to(self.device, non_blocking=True)
            if self.packed:
                offsets = cast(torch.Tensor, payload["cu_seq_lens"]).to(self.device, non_blocking=True)
                embedding = self.model.embed_packed(ids, offsets, int(payload["max_length"]))  # (N, D)
            else:
                mask = cast(torch.Tensor, payload["mask"]).to(self.device, non_blocking=True)
                embedding = self.model.embed(ids, mask, fast=self.fast_forward)  # (B, D)
            embedding = embedding.float()
            scores = self.model.score(embedding)
            return RunnerOutput(
                embeddings=embedding.cpu().numpy().astype(np.float32, copy=False),
                scores={name: value.float().cpu().numpy() for name, value in scores.items()},
            )

    def close(self) -> None:
        if self.device == "cuda":
            torch.cuda.empty_cache()
