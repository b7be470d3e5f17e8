"""CUDA paths: bf16 SDPA with padding, packed batches under torch's varlen kernel and under flash-attn
(each skipped without CUDA, or without its kernel)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

from service.core.checkpoint import checkpoint_fingerprint, load_checkpoint
from service.core.encoder_forward import apply_rotary, rotary_tables, torch_varlen_attention
from service.engine import Engine, EngineConfig
from service.engine.runners.torch import TorchRunner, flash_attention_available
from tests.factories.checkpoint import build_tiny_model
from tests.factories.pages import make_pages

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LENGTHS = [3, 9, 17, 40, 128, 64, 5, 100]


def _docs(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[2, *(rng.randrange(5, vocab) for _ in range(n - 2)), 3] for n in LENGTHS]


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_bf16_sdpa_batch_matches_single_and_float32(tiny_checkpoint: Path) -> None:
    reference = TorchRunner(load_checkpoint(tiny_checkpoint).model)
    runner = TorchRunner(
        load_checkpoint(tiny_checkpoint).model, device="cuda", dtype="bfloat16", attn_implementation="sdpa"
    )
    assert not runner.packed
    docs = _docs(runner.model.config.vocab_size)
    out = runner.run(runner.prepare(docs, pad_to=160))
    assert out.host_s is not None and out.host_s > 0  # the time to issue the pass, measured on CUDA
    batched = out.embeddings
    alone = np.concatenate([runner.run(runner.prepare([d])).embeddings for d in docs])
    exact = reference.run(reference.prepare(docs)).embeddings
    assert _cosine(batched, alone).min() > 0.999
    assert _cosine(batched, exact).min() > 0.99


def _packed_matches_padded(packed: TorchRunner, tiny_checkpoint: Path) -> None:
    """Packed documents must not see each other: each equals itself alone and the padded SDPA result."""
    padded = TorchRunner(
        load_checkpoint(tiny_checkpoint).model, device="cuda", dtype="bfloat16", attn_implementation="sdpa"
    )
    assert packed.packed
    docs = _docs(packed.model.config.vocab_size)
    prepared = packed.prepare(docs)
    assert prepared.padded_tokens == prepared.tokens == sum(LENGTHS)
    a = packed.run(prepared)
    b = padded.run(padded.prepare(docs))
    alone = np.concatenate([packed.run(packed.prepare([d])).embeddings for d in docs])
    assert _cosine(a.embeddings, alone).min() > 0.999
    assert _cosine(a.embeddings, b.embeddings).min() > 0.99
    np.testing.assert_allclose(a.scores["page_type"], b.scores["page_type"], atol=2e-2)


@pytest.mark.skipif(not flash_attention_available(), reason="needs flash-attn")
def test_flash_packed_batches_match_padded_sdpa(tiny_checkpoint: Path) -> None:
    packed = TorchRunner(load_checkpoint(tiny_checkpoint).model, device="cuda", dtype="bfloat16")
    assert packed.attention == "flash_attention_2"
    _packed_matches_padded(packed, tiny_checkpoint)


@pytest.mark.skipif(torch_varlen_attention() is None, reason="needs torch.nn.attention.varlen")
def test_torch_varlen_packed_batches_match_padded_sdpa(tiny_checkpoint: Path) -> None:
    # Asked for explicitly, the runner raises when the kernel fails its probe on this GPU.
    packed = TorchRunner(
        load_checkpoint(tiny_checkpoint).model, device="cuda", dtype="bfloat16", attn_implementation="varlen"
    )
    assert packed.kernel is not None
    _packed_matches_padded(packed, tiny_checkpoint)
    if not flash_attention_available():  # what a CUDA runner picks by default here
        default = TorchRunner(load_checkpoint(tiny_checkpoint).model, device="cuda", dtype="bfloat16")
        assert default.attention == "varlen"


async def test_engine_on_cuda_end_to_end(tiny_checkpoint: Path) -> None:
    pages = make_pages(16)
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_requests=4)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        await engine.warmup()
        batched = await engine.embed(pages)
        single = [(await engine.embed([p]))[0] for p in pages[:4]]
    assert engine.info.device == "cuda" and engine.info.dtype == "bfloat16"
    for a, b in zip(batched, single, strict=False):
        assert float(a.embedding @ b.embedding) > 0.999


def test_onnx_runner_on_cuda_runs_on_the_cuda_provider(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # An onnxruntime-gpu built for another CUDA lists CUDAExecutionProvider yet runs on the CPU; the
    # runner refuses that, so on a GPU machine with the image's wheel it must come up on CUDA.
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    from service.engine.onnx_export import export_onnx
    from service.engine.runners.onnx import OnnxRunner

    fingerprint = checkpoint_fingerprint(tiny_checkpoint)
    ckpt = load_checkpoint(tiny_checkpoint)
    path = export_onnx(ckpt, tmp_path / "model.onnx", fingerprint=fingerprint)
    pad_id = TorchRunner(ckpt.model).pad_id
    runner = OnnxRunner(path, pad_id=pad_id, head_names=["page_type", "quality"], device="cuda")
    out = runner.run(runner.prepare(_docs(ckpt.model.config.vocab_size)))
    assert out.embeddings.shape[0] == len(LENGTHS)


def test_rotary_on_cuda_gives_transformers_bfloat16_values() -> None:
    """The per-half RoPE (mixed bfloat16 x float32 kernels on CUDA) rounds to transformers' values."""
    model = build_tiny_model(heads=False, max_length=512).place("cuda", torch.bfloat16)
    generator = torch.Generator(device="cuda").manual_seed(7)
    qkv = torch.randn(4, 300, 3, 2, 16, device="cuda", generator=generator).to(torch.bfloat16)
    positions = torch.arange(300, device="cuda").unsqueeze(0)
    for layer_type in sorted(set(model.encoder.config.layer_types)):
        cos, sin = model.encoder.rotary_emb(qkv, positions, layer_type)
        q, k = apply_rotary_pos_emb(qkv[:, :, 0], qkv[:, :, 1], cos, sin, unsqueeze_dim=2)
        ours = apply_rotary(qkv[:, :, :2], *rotary_tables(model.encoder, layer_type, qkv[:, :, 0, 0]))
        # Both compute in float32 and round once; a fused multiply-add may move a value by one ulp.
        torch.testing.assert_close(ours[:, :, 0], q, atol=0, rtol=2**-7)
        torch.testing.assert_close(ours[:, :, 1], k, atol=0, rtol=2**-7)
