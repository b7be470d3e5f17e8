"""Runners and batch formation: a batch gives each document what it gets alone, whatever the company."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from service.core.attention import ATTENTION_CHOICES, AUTO_ATTENTION, attention_option
from service.core.checkpoint import load_checkpoint
from service.core.cpus import cpu_budget
from service.core.encoder_forward import VarlenAttention, attend, reference_varlen_attention
from service.engine.batcher import form_batches
from service.engine.runners import pad_batch
from service.engine.runners import torch as torch_runner
from service.engine.runners.torch import TorchRunner, choose_attention, varlen_probe_error
from tests.factories.checkpoint import build_tiny_checkpoint


def _docs(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[2, *(rng.randrange(5, vocab) for _ in range(n - 2)), 3] for n in lengths]


@pytest.fixture(scope="module")
def runner(tiny_checkpoint: Path) -> TorchRunner:
    return TorchRunner(load_checkpoint(tiny_checkpoint).model)


def test_batch_equals_each_document_alone_in_any_order_and_padding(runner: TorchRunner) -> None:
    # Lengths straddle the tiny preset's 8-token sliding window so local layers see padding too.
    docs = _docs(runner.model.config.vocab_size, [3, 7, 9, 16, 33, 64, 128, 5])
    alone = [runner.run(runner.prepare([d])) for d in docs]
    rng = random.Random(1)
    for extra in (0, 5, 40):
        order = list(range(len(docs)))
        rng.shuffle(order)
        longest = max(len(d) for d in docs)
        out = runner.run(runner.prepare([docs[i] for i in order], pad_to=longest + extra))
        for row, i in enumerate(order):
            np.testing.assert_allclose(out.embeddings[row], alone[i].embeddings[0], atol=1e-5, rtol=0)
            for head, values in out.scores.items():
                np.testing.assert_allclose(values[row], alone[i].scores[head][0], atol=1e-5, rtol=0)


def test_the_inference_forward_gives_what_transformers_forward_gives(tiny_checkpoint: Path) -> None:
    """The default runner (service/core/encoder_forward.py) against `fast_forward=False`, padded far
    enough that the local layers take the banded path."""
    reference = TorchRunner(load_checkpoint(tiny_checkpoint).model, fast_forward=False)
    runner = TorchRunner(load_checkpoint(tiny_checkpoint).model)
    docs = _docs(runner.model.config.vocab_size, [128, 90, 12, 3], seed=4)
    for pad_to in (128, 200):
        ours = runner.run(runner.prepare(docs, pad_to=pad_to))
        theirs = reference.run(reference.prepare(docs, pad_to=pad_to))
        np.testing.assert_allclose(ours.embeddings, theirs.embeddings, atol=1e-5, rtol=0)
        for head, values in ours.scores.items():
            np.testing.assert_allclose(values, theirs.scores[head], atol=1e-5, rtol=0)


def test_padding_is_masked_not_attended(runner: TorchRunner) -> None:
    """Sanity check of the check above: the same ids without the mask give a different embedding."""
    doc = _docs(runner.model.config.vocab_size, [10])[0]
    masked = runner.run(runner.prepare([doc], pad_to=30)).embeddings[0]
    ids, _ = pad_batch([doc], runner.pad_id, pad_to=30)
    unmasked = runner.run(runner.prepare([ids[0].tolist()])).embeddings[0]
    assert np.abs(masked - unmasked).max() > 1e-3


def test_runner_reports_scores_per_head(runner: TorchRunner) -> None:
    out = runner.run(runner.prepare(_docs(runner.model.config.vocab_size, [4, 12])))
    assert out.embeddings.shape == (2, 32) and out.embeddings.dtype == np.float32
    assert out.host_s is None  # on a CPU the host computes the pass: no separate issuing time
    assert out.scores["page_type"].shape == (2, 3) and out.scores["quality"].shape == (2,)
    np.testing.assert_allclose(out.scores["page_type"].sum(axis=1), 1.0, atol=1e-6)


def test_cpu_uses_sdpa_with_padding_and_never_packs(runner: TorchRunner) -> None:
    assert runner.attention == "sdpa" and not runner.packed
    assert runner.cost([3, 10, 4]) == 30  # padded: every row costs the longest
    assert choose_attention("cpu", "float32", None) == "sdpa"
    with pytest.raises(ValueError):
        choose_attention("cpu", "float32", "flash_attention_2")


def test_varlen_packs_and_gives_each_document_what_padded_sdpa_gives(
    runner: TorchRunner, tiny_checkpoint: Path
) -> None:
    """`varlen` on a CPU: the packed layout through the per-document reference kernel; what the CUDA
    kernel gets, checked against the default padded runner (tests/engine/test_gpu.py does the kernel)."""
    packed = TorchRunner(load_checkpoint(tiny_checkpoint).model, attn_implementation="varlen")
    assert packed.attention == "varlen" and packed.packed
    assert packed.kernel is reference_varlen_attention
    assert packed.cost([3, 10, 4]) == 17  # packed: real tokens only
    docs = _docs(packed.model.config.vocab_size, [3, 70, 9, 33, 128, 5])
    prepared = packed.prepare(docs)
    assert prepared.padded_tokens == prepared.tokens == sum(len(d) for d in docs)
    # CLS pooling: the tiny preset's two trailing local layers run on each document's leading tokens.
    assert packed.first_only and len(prepared.payload[1]) == 2  # type: ignore[index]
    ours, theirs = packed.run(prepared), runner.run(runner.prepare(docs))
    np.testing.assert_allclose(ours.embeddings, theirs.embeddings, atol=1e-5, rtol=0)
    for head, values in ours.scores.items():
        np.testing.assert_allclose(values, theirs.scores[head], atol=1e-5, rtol=0)


def test_a_compiled_varlen_forward_gives_what_the_eager_one_gives(
    runner: TorchRunner, tiny_checkpoint: Path
) -> None:
    """`compile_backend` with dynamic shapes: batches of other sizes and lengths reuse the capture and
    give the padded runner's results (aot_eager here: the capture, without inductor's compile time)."""
    compiled = TorchRunner(
        load_checkpoint(tiny_checkpoint).model, attn_implementation="varlen", compile_backend="aot_eager"
    )
    vocab = compiled.model.config.vocab_size
    for lengths in ([3, 70, 9], [33, 128, 5, 12]):
        docs = _docs(vocab, lengths)
        ours, theirs = compiled.run(compiled.prepare(docs)), runner.run(runner.prepare(docs))
        np.testing.assert_allclose(ours.embeddings, theirs.embeddings, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="varlen"):
        TorchRunner(load_checkpoint(tiny_checkpoint).model, compile_backend="aot_eager")


def test_a_mean_pooling_varlen_runner_computes_every_position(tmp_path: Path) -> None:
    """The first-position shortcut is CLS pooling's: under mean pooling every token counts."""
    checkpoint = build_tiny_checkpoint(tmp_path / "mean", pooling="mean")
    packed = TorchRunner(load_checkpoint(checkpoint).model, attn_implementation="varlen")
    padded = TorchRunner(load_checkpoint(checkpoint).model)
    assert not packed.first_only
    docs = _docs(packed.model.config.vocab_size, [3, 70, 9, 33])
    np.testing.assert_allclose(
        packed.run(packed.prepare(docs)).embeddings, padded.run(padded.prepare(docs)).embeddings, atol=1e-5
    )


def test_every_attention_the_settings_accept_is_one_the_runner_knows() -> None:
    assert set(ATTENTION_CHOICES) - {AUTO_ATTENTION} == set(torch_runner.ATTENTION_MODES)
    assert attention_option(AUTO_ATTENTION) is None and attention_option("varlen") == "varlen"
    with pytest.raises(ValueError):
        attention_option("flash")


def test_cuda_in_half_precision_prefers_a_varlen_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_runner, "flash_attention_available", lambda: False)
    monkeypatch.setattr(torch_runner, "torch_varlen_attention", lambda: reference_varlen_attention)
    assert choose_attention("cuda", "bfloat16", None) == "varlen"
    assert choose_attention("cuda", "float32", None) == "sdpa"
    with pytest.raises(ValueError, match="bfloat16"):
        choose_attention("cuda", "float32", "varlen")
    monkeypatch.setattr(torch_runner, "flash_attention_available", lambda: True)
    assert choose_attention("cuda", "float16", None) == "flash_attention_2"
    monkeypatch.setattr(torch_runner, "flash_attention_available", lambda: False)
    monkeypatch.setattr(torch_runner, "torch_varlen_attention", lambda: None)
    assert choose_attention("cuda", "bfloat16", None) == "sdpa"  # an older torch: padded
    with pytest.raises(ValueError, match=r"torch\.nn\.attention\.varlen"):
        choose_attention("cuda", "bfloat16", "varlen")


def test_the_varlen_probe_passes_a_right_kernel_and_names_a_wrong_one(tiny_checkpoint: Path) -> None:
    """What decides, on a GPU, whether torch's kernel is trusted (a failing one falls back to SDPA)."""
    config = load_checkpoint(tiny_checkpoint).model.config
    window = int(config.sliding_window)

    def probe(kernel: VarlenAttention, dtype: torch.dtype = torch.float32) -> str:
        return varlen_probe_error(kernel, config, "cpu", dtype) or ""

    def mixing(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object) -> torch.Tensor:
        return attend(q[None], k[None], v[None], None)[0]  # ignores the offsets: documents see each other

    def wider(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, n: int, span: int):
        return reference_varlen_attention(q, k, v, offsets, n, span + 1 if span >= 0 else span)

    def unsupported(*_: object) -> torch.Tensor:
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    assert probe(reference_varlen_attention) == ""
    assert probe(reference_varlen_attention, torch.bfloat16) == ""  # rounding is not an error
    assert "differs" in probe(mixing) and "window -1" in probe(mixing)
    assert f"window {window}" in probe(wider)  # an off-by-one window convention is caught
    assert "Ampere" in probe(unsupported)

    def other_signature(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object) -> torch.Tensor:
        raise TypeError("varlen_attn() got an unexpected keyword argument 'window_size'")

    assert "TypeError" in probe(other_signature)  # an older torch's kernel: SDPA, not a failed start


def test_pad_batch_refuses_to_cut() -> None:
    with pytest.raises(ValueError):
        pad_batch([[1, 2, 3]], 0, pad_to=2)


def padded(lengths: list[int]) -> int:
    return len(lengths) * max(lengths) if lengths else 0


@pytest.mark.parametrize("seed", range(5))
def test_form_batches_respects_both_budgets_and_sorts(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(2, 100) for _ in range(rng.randint(1, 60))]
    batches = form_batches(lengths, padded, max_tokens=256, max_requests=8)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 8
        assert padded([lengths[i] for i in batch]) <= 256
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)


def test_form_batches_gives_an_oversized_document_its_own_batch() -> None:
    assert form_batches([500, 3, 4], padded, max_tokens=100, max_requests=8) == [[1, 2], [0]]
    assert form_batches([5, 5, 5], sum, max_tokens=10, max_requests=8) == [[0, 1], [2]]


def test_form_batches_does_not_pad_many_short_pages_to_one_long_one() -> None:
    """63 pages of 30 tokens and one of 256, the defaults' budget (16,384 tokens, 64 documents): filled
    to the budget, one batch padded to 256 (16,384 tokens computed for 2,146; 6x slower on the CPU
    than two passes)."""
    lengths = [256] + [30] * 63
    plan = form_batches(lengths, padded, max_tokens=16384, max_requests=64)
    assert plan == [list(range(1, 64)), [0]]
    assert sum(padded([lengths[i] for i in batch]) for batch in plan) == 63 * 30 + 256
    # Close lengths still share a pass: a pass costs more than their padding.
    assert len(form_batches([30] * 32 + [31] * 32, padded, max_tokens=16384, max_requests=64)) == 1


@pytest.mark.parametrize("max_requests", [1, 3, 64])
def test_form_batches_fills_batches_in_order_where_the_cost_has_no_padding(max_requests: int) -> None:
    """A packed runner computes the same tokens however the window is cut: the fewest passes, filled in
    length order as before, the smallest last."""
    rng = random.Random(max_requests)
    lengths = [rng.randint(3, 300) for _ in range(150)]
    plan = form_batches(lengths, sum, max_tokens=4096, max_requests=max_requests)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    greedy: list[list[int]] = [[]]
    for index in order:
        candidate = [*greedy[-1], index]
        if greedy[-1] and (len(candidate) > max_requests or sum(lengths[i] for i in candidate) > 4096):
            greedy.append([index])
        else:
            greedy[-1] = candidate
    assert plan == greedy


@pytest.mark.parametrize("seed", range(20))
def test_form_batches_finds_the_cheapest_cut_of_the_sorted_window(seed: int) -> None:
    """Against every way of cutting the sorted window into contiguous batches within both caps."""
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(2, 20), rng.randint(2, 300)]) for _ in range(rng.randint(1, 9))]
    overhead, max_tokens, max_requests = rng.choice([0, 10, 80, 500]), 600, 4
    ordered = sorted(lengths)

    def cheapest(start: int) -> int:
        if start == len(ordered):
            return 0
        options = []
        for end in range(start + 1, min(start + max_requests, len(ordered)) + 1):
            cost = padded(ordered[start:end])
            if cost <= max_tokens or end == start + 1:
                options.append(cost + overhead + cheapest(end))
        return min(options)

    plan = form_batches(
        lengths, padded, max_tokens=max_tokens, max_requests=max_requests, pass_overhead=overhead
    )
    assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))
    assert [lengths[i] for batch in plan for i in batch] == ordered
    for batch in plan:
        assert len(batch) <= max_requests and (
            len(batch) == 1 or padded([lengths[i] for i in batch]) <= max_tokens
        )
    assert sum(padded([lengths[i] for i in batch]) + overhead for batch in plan) == cheapest(0)


def test_cpu_threads_follow_the_setting_then_omp_num_threads(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        set_here = TorchRunner(load_checkpoint(tiny_checkpoint).model, intra_op_threads=1)
        assert set_here.threads == torch.get_num_threads() == 1
        from_env = TorchRunner(load_checkpoint(tiny_checkpoint).model)
        assert from_env.threads == torch.get_num_threads() == 3
        monkeypatch.delenv("OMP_NUM_THREADS")
        budget = TorchRunner(load_checkpoint(tiny_checkpoint).model)
        assert budget.threads == torch.get_num_threads() == cpu_budget().threads
    finally:
        torch.set_num_threads(before)


def test_bfloat16_on_cpu_stays_close_to_float32(tiny_checkpoint: Path) -> None:
    # bfloat16 is a CPU option where AMX/AVX512-BF16 exist; float16 stays CUDA-only.
    full = TorchRunner(load_checkpoint(tiny_checkpoint).model)
    half = TorchRunner(load_checkpoint(tiny_checkpoint).model, dtype="bfloat16")
    assert next(half.model.encoder.parameters()).dtype == torch.bfloat16
    docs = _docs(full.model.config.vocab_size, [5, 60, 128])
    a = full.run(full.prepare(docs)).embeddings
    b = half.run(half.prepare(docs)).embeddings
    assert b.dtype == np.float32
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cos.min() > 0.99 and np.abs(a - b).max() > 1e-6
    with pytest.raises(ValueError):
        TorchRunner(load_checkpoint(tiny_checkpoint).model, dtype="float16")
