"""The PyTorch runner: padded SDPA batches on CPU, packed varlen batches on CUDA.

Attention backends (`ATTENTION_MODES`): under SDPA or eager attention every document keeps its own row
and padding is masked; documents are never packed into one row there, because SDPA with a padding mask
lets packed documents attend to each other. Under a varlen kernel the batch is packed padding-free into
one row and `cu_seq_lens` tells the kernel where each document starts, so no compute is spent on padding
and the token budget counts real tokens. Two such kernels: `flash_attention_2` (the flash-attn package,
through transformers' forward) and `varlen` (torch's own FlashAttention-2 varlen kernel, through
`service.core.encoder_forward.packed_hidden_states`; no extra package). On CUDA in half precision the
runner picks the first available, `varlen` only after a probe on the device agrees with padded SDPA.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import ClassVar, cast

import numpy as np
import torch
from transformers import ModernBertConfig

from service.core.cpus import intra_op_threads as choose_threads
from service.core.encoder_forward import (
    PackedCut,
    VarlenAttention,
    packed_first_position_cuts,
    packed_hidden_states,
    reference_varlen_attention,
    torch_varlen_attention,
)
from service.core.modeling import HtmlEncoderModel
from service.engine.runners import PreparedBatch, RunnerOutput, batch_cost, pad_batch
from service.engine.types import ShuttingDownError

logger = logging.getLogger(__name__)

# attention implementation -> batch layout
ATTENTION_MODES: dict[str, str] = {
    "sdpa": "padded",
    "eager": "padded",
    "flash_attention_2": "packed",
    "varlen": "packed",
}
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
    """The attention implementation for this device.

    Asked for: checked against the device. Not asked for: on CUDA in half precision the flash-attn
    package when installed, else torch's own varlen kernel when this torch has it (the runner still
    probes it), else padded SDPA; on CPU padded SDPA. `varlen` on a CPU runs the per-document reference
    kernel: correct, for checking, and slower than SDPA there.
    """
    half = dtype != "float32"
    if requested is not None:
        if requested not in ATTENTION_MODES:
            raise ValueError(f"attention {requested!r} is not one of {sorted(ATTENTION_MODES)}")
        if requested == "flash_attention_2" and (device != "cuda" or not half):
            raise ValueError("flash_attention_2 needs CUDA and bfloat16 or float16")
        if requested == "varlen" and device == "cuda":
            if not half:
                raise ValueError("varlen on CUDA needs bfloat16 or float16 (FlashAttention-2)")
            if torch_varlen_attention() is None:
                raise ValueError(
                    f"varlen needs torch.nn.attention.varlen: torch {torch.__version__} lacks it"
                )
        return requested
    if device == "cuda" and half:
        if flash_attention_available():
            return "flash_attention_2"
        if torch_varlen_attention() is not None:
            return "varlen"
    return "sdpa"


def varlen_probe_error(
    attention: VarlenAttention, config: ModernBertConfig, device: str, dtype: torch.dtype
) -> str | None:
    """None when `attention` computes on this device what `reference_varlen_attention` computes, else why.

    Random queries, keys and values for a packed row of four documents (one token, a short one, ones
    spanning several local windows), global and local, in the runner's dtype, against the reference in
    float32. A kernel this GPU cannot run (FlashAttention-2 wants Ampere or newer) raises; one that lets
    documents see each other or reads the window differently is off by the size of the values (the
    threshold, a tenth of their norm, is over ten times bfloat16's rounding). Whole-model embeddings
    would not tell: with random weights they barely move when documents mix.
    """
    window = int(config.sliding_window)
    heads = int(config.num_attention_heads)
    head_dim = int(config.hidden_size) // heads
    lengths = [1, 7, 4 * window + 9, 2 * window]
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)  # (N+1,)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), heads, head_dim, generator=generator) for _ in range(3))
    for span in (-1, window):
        expected = reference_varlen_attention(q, k, v, offsets, max(lengths), span)  # float32 on the CPU
        try:
            with torch.inference_mode():
                qd, kd, vd = (x.to(device=device, dtype=dtype) for x in (q, k, v))
                got = attention(qd, kd, vd, offsets.to(device), max(lengths), span).float().cpu()
        except Exception as failure:  # whatever this kernel raises here (a TypeError from another
            # torch's signature, too), the server must fall back to SDPA, not fail to start
            return f"{type(failure).__name__}: {failure}"
        drift = float((got - expected).norm() / expected.norm())
        if not drift < 0.1:
            return f"its output differs from per-document attention by {drift:.3f} (window {span})"
    return None


class TorchRunner:
    """Runs an `HtmlEncoderModel` in inference mode; one instance is used from one thread at a time."""

    backend = "torch"
    # What the last runner built in this process set torch's thread count to (`__init__` warns when a
    # later one changes it: the count is torch's, one per process, not the runner's).
    _process_threads: ClassVar[int | None] = None

    def __init__(
        self,
        model: HtmlEncoderModel,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        attn_implementation: str | None = None,
        intra_op_threads: int | None = None,
        fast_forward: bool = True,
        compile_backend: str | None = None,
    ) -> None:
        """`fast_forward=False` runs transformers' own encoder forward instead of `encoder_forward`'s
        (which SDPA batches take by default); benchmarks compare the two. `intra_op_threads=None` sizes
        the CPU thread pool from OMP_NUM_THREADS or the CPU budget (`service.core.cpus`).
        `compile_backend` ("inductor") runs the `varlen` forward through `torch.compile` with dynamic
        shapes (one graph for every batch: the kernel is a custom op, positions and offsets are inputs);
        for benchmarks/gpu_engine.sh to measure what fusing the layers' elementwise work buys on a GPU."""
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
        # torch's default is one thread per CPU in the affinity mask, which a container's CPU limit
        # turns into throttling (service.core.cpus); the choice is process-wide, as torch's pool is.
        choice = choose_threads(intra_op_threads)
        earlier = TorchRunner._process_threads
        if earlier is not None and earlier != choice.threads:
            logger.warning(
                "torch's intra-op thread count is one per process: this runner sets it to %d, which an "
                "earlier runner in this process had set to %d; every runner here now runs %d threads",
                choice.threads,
                earlier,
                choice.threads,
            )
        torch.set_num_threads(choice.threads)
        TorchRunner._process_threads = choice.threads
        logger.info("torch runs %d intra-op threads (%s)", choice.threads, choice.reason)
        # Place first: transformers checks flash-attn against the weights' device and dtype.
        model.place(device, TORCH_DTYPES[dtype])  # heads stay float32: tiny, and scores stay exact
        self.model = model.eval()
        self.kernel: VarlenAttention | None = None  # the varlen kernel of a `varlen` runner
        if self.attention == "varlen":
            model.encoder.set_attn_implementation("sdpa")  # the packed forward reads SDPA's configuration
            self.kernel = self._varlen_kernel(explicit=attn_implementation is not None)
        if self.attention != "varlen":
            model.encoder.set_attn_implementation(self.attention)
        self.packed = ATTENTION_MODES[self.attention] == "packed"
        self._compiled: Callable[..., torch.Tensor] | None = None
        if compile_backend is not None:
            if self.kernel is None:
                raise ValueError(f"compile_backend is for the varlen attention, not {self.attention!r}")
            forward = functools.partial(packed_hidden_states, model.encoder, attention=self.kernel)
            self._compiled = torch.compile(forward, backend=compile_backend, dynamic=True)
        pad_id = model.config.pad_token_id
        if pad_id is None:
            raise ValueError("the model config has no pad_token_id")
        self.pad_id = int(pad_id)
        self._pin = device == "cuda"
        self.fast_forward = fast_forward
        # With CLS pooling a varlen pass runs the local layers after the last global one on each
        # document's leading tokens only (encoder_forward.PackedCut), as padded SDPA batches do.
        self.first_only = self.kernel is not None and model.pooling == "cls"
        self._layer_types = list(model.config.layer_types or ())
        self._window = int(model.config.sliding_window)
        self._closed = False

    @property
    def threads(self) -> int:
        """The CPU threads a forward pass runs on, read from torch when asked: the count is one per
        process, so a second runner (a second Engine) built with another count changes this one's too,
        and a count remembered at construction had reported 1 while both ran 2."""
        return torch.get_num_threads()

    def _varlen_kernel(self, *, explicit: bool) -> VarlenAttention | None:
        """The kernel for `varlen`, probed on CUDA; a chosen-by-default one that fails the probe falls
        back to padded SDPA (with a warning), an asked-for one raises."""
        if self.device != "cuda":
            return reference_varlen_attention
        kernel = torch_varlen_attention()
        error = "this torch has no varlen kernel" if kernel is None else None
        if kernel is not None:
            error = varlen_probe_error(kernel, self.model.config, self.device, TORCH_DTYPES[self.dtype])
        if error is None:
            return kernel
        if explicit:
            raise ValueError(f"attention 'varlen' does not work on this device: {error}")
        logger.warning("torch's varlen attention failed its probe (%s); padded SDPA instead", error)
        self.attention = "sdpa"
        return None

    def cost(self, lengths: Sequence[int]) -> int:
        return batch_cost(lengths, packed=self.packed)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        tokens = sum(len(ids) for ids in batch)
        payload: dict[str, torch.Tensor | int]
        cuts: list[PackedCut] = []
        if self.packed:
            flat = torch.tensor([t for ids in batch for t in ids], dtype=torch.long)  # (T,)
            lengths = torch.tensor([len(ids) for ids in batch], dtype=torch.int32)  # (N,)
            offsets = torch.zeros(len(batch) + 1, dtype=torch.int32)  # (N+1,)
            offsets[1:] = torch.cumsum(lengths, 0)
            positions = torch.from_numpy(np.concatenate([np.arange(len(ids)) for ids in batch]))  # (T,)
            payload = {
                "ids": flat,
                "positions": positions,
                "cu_seq_lens": offsets,
                "max_length": int(lengths.max()),
            }
            if self.first_only:
                cuts = packed_first_position_cuts(lengths.tolist(), self._layer_types, self._window)
            padded = tokens
        else:
            ids_np, mask_np = pad_batch(batch, self.pad_id, pad_to=pad_to)
            payload = {"ids": torch.from_numpy(ids_np), "mask": torch.from_numpy(mask_np)}  # (B, L) each
            padded = int(ids_np.size)
        if self._pin:
            payload = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
            cuts = [PackedCut(c.keep.pin_memory(), c.cu_seq_lens.pin_memory(), c.max_length) for c in cuts]
        return PreparedBatch(
            payload=(payload, cuts), documents=len(batch), tokens=tokens, padded_tokens=padded
        )

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        if self._closed:
            raise ShuttingDownError("the torch runner has been closed")
        payload, host_cuts = cast(tuple[dict[str, torch.Tensor | int], list[PackedCut]], prepared.payload)
        started = time.perf_counter()
        with torch.inference_mode():
            ids = cast(torch.Tensor, payload["ids"]).to(self.device, non_blocking=True)
            if self.packed:
                offsets = cast(torch.Tensor, payload["cu_seq_lens"]).to(self.device, non_blocking=True)
                positions = cast(torch.Tensor, payload["positions"]).to(self.device, non_blocking=True)
                longest = int(payload["max_length"])
                cuts = [
                    PackedCut(
                        c.keep.to(self.device, non_blocking=True),
                        c.cu_seq_lens.to(self.device, non_blocking=True),
                        c.max_length,
                    )
                    for c in host_cuts
                ]
                if self._compiled is not None:
                    hidden = self._compiled(ids, positions, offsets, longest, cuts=cuts)  # (T', D)
                    embedding = self.model.pool_packed(hidden, offsets, positions, cuts)  # (N, D)
                else:
                    embedding = self.model.embed_packed(
                        ids, offsets, longest, attention=self.kernel, positions=positions, cuts=cuts
                    )  # (N, D)
            else:
                mask = cast(torch.Tensor, payload["mask"]).to(self.device, non_blocking=True)
                embedding = self.model.embed(ids, mask, fast=self.fast_forward)  # (B, D)
            embedding = embedding.float()
            scores = {name: value.float() for name, value in self.model.score(embedding).items()}
            issued = time.perf_counter() - started  # on CUDA, nothing above waited for the device
            return RunnerOutput(
                embeddings=embedding.cpu().numpy().astype(np.float32, copy=False),  # waits for it
                scores={name: value.cpu().numpy() for name, value in scores.items()},
                host_s=issued if self.device == "cuda" else None,
            )

    def abort(self) -> None:
        """A pass in this process cannot be stopped; it ends on its own."""

    def close(self) -> None:
        """Refuse later passes (ShuttingDownError, as every runner does once closed) and return the CUDA
        cache; a pass in flight ends as usual."""
        self._closed = True
        if self.device == "cuda":
            torch.cuda.empty_cache()
