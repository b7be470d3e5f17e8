"""The pretraining losses against hand-computed values, and their invariants."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from model_training.objectives import (
    IGNORE_INDEX,
    DistillationHead,
    LossAggregator,
    MaskingConfig,
    MlmHead,
    bow_counts,
    bow_loss,
    linear_cross_entropy,
    mask_tokens,
    mlm_loss,
    weighted_contrastive_distillation,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = (PAD, UNK, CLS, SEP, MASK)


def _log_softmax_at(logits: list[float], index: int) -> float:
    """log softmax(logits)[index], by hand."""
    return logits[index] - math.log(sum(math.exp(v) for v in logits))


# --- MLM --------------------------------------------------------------------------------------------


def test_mlm_loss_matches_hand_computation_at_masked_positions_only() -> None:
    # Vocabulary of 3, D = 2. Position 1 is masked with target 2; positions 0 and 2 must not count.
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    hidden = torch.tensor([[[5.0, -3.0], [0.5, 2.0], [-4.0, 9.0]]])
    labels = torch.tensor([[IGNORE_INDEX, 2, IGNORE_INDEX]])
    loss = mlm_loss(hidden, labels, weight)
    # logits at position 1: [0.5, 2.0, 2.5]; target 2.
    expected = -_log_softmax_at([0.5, 2.0, 2.5], 2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_mlm_loss_bias_and_transform_are_applied() -> None:
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    bias = torch.tensor([0.0, 1.0])
    hidden = torch.tensor([[[1.0, 1.0], [2.0, 0.0]]])
    labels = torch.tensor([[0, 1]])
    loss = mlm_loss(hidden, labels, weight, decoder_bias=bias, transform=lambda h: 2 * h)
    # rows after transform: [2, 2] -> logits [2, 3] target 0; [4, 0] -> logits [4, 1] target 1.
    expected = -(_log_softmax_at([2.0, 3.0], 0) + _log_softmax_at([4.0, 1.0], 1)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_mlm_loss_without_masked_positions_is_zero_and_differentiable() -> None:
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    loss = mlm_loss(hidden, torch.full((2, 3), IGNORE_INDEX), torch.randn(7, 4))
    loss.backward()
    assert loss.item() == 0.0
    assert hidden.grad is not None


def test_mlm_loss_without_masked_positions_still_reaches_every_head_parameter() -> None:
    # A parameter without a gradient makes DDP (find_unused_parameters=False) fail on the next step;
    # the zero used to be `hidden.sum() * 0`, which left the whole MLM head out of the graph.
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4)
    head = MlmHead(4, 10)
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    loss = mlm_loss(
        hidden, torch.full((2, 3), IGNORE_INDEX), embedding.weight, decoder_bias=head.bias, transform=head
    )
    loss.backward()
    assert loss.item() == 0.0
    assert hidden.grad is not None and embedding.weight.grad is not None
    missing = [name for name, param in head.named_parameters() if param.grad is None]
    assert missing == []
    assert all(float(param.grad.abs().sum()) == 0.0 for param in head.parameters() if param.grad is not None)


def test_mlm_gradient_reaches_the_tied_embedding_matrix() -> None:
    embedding = torch.nn.Embedding(10, 4)
    head = MlmHead(4, 10)
    hidden = torch.randn(1, 5, 4)
    labels = torch.tensor([[IGNORE_INDEX, 7, IGNORE_INDEX, 8, IGNORE_INDEX]])
    mlm_loss(hidden, labels, embedding.weight, decoder_bias=head.bias, transform=head).backward()
    assert embedding.weight.grad is not None and embedding.weight.grad.abs().sum() > 0
    assert head.bias.grad is not None and head.bias.grad[7] != 0


def test_masking_follows_30_percent_and_80_10_10_and_spares_specials() -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (64, 512))
    ids[:, 0], ids[:, -1] = CLS, SEP
    mask = torch.ones_like(ids)
    mask[:8, 400:] = 0  # padding is never a candidate
    ids[:8, 400:] = PAD
    masked, labels = mask_tokens(
        ids, mask, mask_id=MASK, special_ids=SPECIALS, vocab_size=1000, generator=gen
    )
    candidates = mask.bool() & (ids >= 5)
    selected = labels != IGNORE_INDEX
    assert not (selected & ~candidates).any()
    assert (labels[selected] == ids[selected]).all()
    assert (masked[~selected] == ids[~selected]).all()
    rate = selected.sum().item() / candidates.sum().item()
    assert rate == pytest.approx(0.3, abs=0.01)
    n = selected.sum().item()
    became_mask = (masked[selected] == MASK).sum().item() / n
    unchanged = (masked[selected] == ids[selected]).sum().item() / n
    assert became_mask == pytest.approx(0.8, abs=0.01)
    assert unchanged == pytest.approx(0.1, abs=0.01)  # random picks equal to the original are rare
    random_ids = masked[selected & (masked != MASK) & (masked != ids)]
    assert (random_ids >= 5).all()  # random replacements are never special tokens


def test_masking_is_reproducible_from_the_generator() -> None:
    ids = torch.randint(5, 50, (4, 32))
    mask = torch.ones_like(ids)
    kwargs = {"mask_id": MASK, "special_ids": SPECIALS, "vocab_size": 50}
    a = mask_tokens(ids, mask, generator=torch.Generator().manual_seed(3), **kwargs)  # type: ignore[arg-type]
    b = mask_tokens(ids, mask, generator=torch.Generator().manual_seed(3), **kwargs)  # type: ignore[arg-type]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_masking_config_rejects_impossible_fractions() -> None:
    with pytest.raises(ValueError):
        MaskingConfig(mask_prob=0.0)
    with pytest.raises(ValueError):
        MaskingConfig(replace_with_mask=0.9, replace_with_random=0.2)


# --- bag of words -----------------------------------------------------------------------------------


def test_bow_counts_exclude_special_and_padding_tokens() -> None:
    ids = torch.tensor([[CLS, 5, 6, 5, SEP, PAD], [CLS, 7, SEP, PAD, PAD, PAD]])
    mask = (ids != PAD).long()
    counts = bow_counts(ids, mask, vocab_size=8, special_ids=SPECIALS)
    assert counts[0].tolist() == [0, 0, 0, 0, 0, 2, 1, 0]
    assert counts[1].tolist() == [0, 0, 0, 0, 0, 0, 0, 1]


def test_bow_loss_matches_hand_computation() -> None:
    weight = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    cls = torch.tensor([[1.0, 2.0]])  # logits [0, 1, 2]
    counts = torch.tensor([[0.0, 2.0, 1.0]])  # token 1 twice, token 2 once
    expected = -(2 * _log_softmax_at([0.0, 1.0, 2.0], 1) + _log_softmax_at([0.0, 1.0, 2.0], 2)) / 3
    assert bow_loss(cls, weight, counts).item() == pytest.approx(expected, rel=1e-6)


def test_bow_count_form_equals_cls_repeated_per_token() -> None:
    torch.manual_seed(0)
    vocab, dim = 40, 8
    ids = torch.randint(5, vocab, (3, 12))
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[2, 7:] = PAD
    ids[2, 6] = SEP
    mask = (ids != PAD).long()
    cls = torch.randn(3, dim, requires_grad=True)
    weight = torch.randn(vocab, dim, requires_grad=True)
    counts = bow_counts(ids, mask, vocab_size=vocab, special_ids=SPECIALS)
    count_form = bow_loss(cls, weight, counts)

    # Expanded form: one copy of a document's CLS logits per counted token, plain mean CE.
    keep = mask.bool() & (ids >= 5)
    doc_of_token = torch.arange(3).unsqueeze(1).expand_as(ids)[keep]
    expanded = F.cross_entropy((cls @ weight.t())[doc_of_token], ids[keep])
    assert count_form.item() == pytest.approx(expanded.item(), rel=1e-6)
    g_count = torch.autograd.grad(count_form, (cls, weight))
    g_expanded = torch.autograd.grad(expanded, (cls, weight))
    for a, b in zip(g_count, g_expanded, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


# --- distillation -----------------------------------------------------------------------------------


def test_weighted_contrastive_distillation_matches_hand_computation() -> None:
    # Unit vectors chosen so every cosine is a round number.
    # float64, so the comparison is about the formula, not float32 cancellation.
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    teacher = torch.tensor([[0.6, 0.8], [0.0, 2.0]], dtype=torch.float64)  # norm 2: cosine normalises
    tau = 0.1
    # s = cos(student_i, teacher_j): [[0.6, 0], [0.8, 1]]; teacher-teacher cos t~_01 = 0.8.
    w = (1 - 0.8) / 2
    loss_0 = -math.log(math.exp(0.6 / tau) / (math.exp(0.6 / tau) + w * math.exp(0.0 / tau)))
    loss_1 = -math.log(math.exp(1.0 / tau) / (math.exp(1.0 / tau) + w * math.exp(0.8 / tau)))
    loss = weighted_contrastive_distillation(student, teacher, temperature=tau)
    assert loss.item() == pytest.approx((loss_0 + loss_1) / 2, rel=1e-9)


def test_identical_teachers_are_not_negatives() -> None:
    # Two documents the teacher embeds identically: weight 0, the loss is the single-document loss (0).
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    teacher = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    assert weighted_contrastive_distillation(student, teacher).item() == pytest.approx(0.0, abs=1e-6)


def test_distillation_pulls_the_student_towards_its_teacher() -> None:
    torch.manual_seed(0)
    head = DistillationHead(16, 8, rank=4)
    student = torch.randn(6, 16)
    teacher = torch.randn(6, 8)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    first = weighted_contrastive_distillation(head(student), teacher).item()
    for _ in range(50):
        optimizer.zero_grad()
        weighted_contrastive_distillation(head(student), teacher).backward()
        optimizer.step()
    assert weighted_contrastive_distillation(head(student), teacher).item() < first * 0.5


def _ddp_worker(
    rank: int, world: int, store: Path, student: torch.Tensor, teacher: torch.Tensor, out: Any
) -> None:
    # A file store, not a TCP port: a port found free and released could be taken before rank 0 binds it.
    dist.init_process_group("gloo", init_method=store.as_uri(), rank=rank, world_size=world)
    try:
        rows = slice(rank * 2, rank * 2 + 2)
        local = student[rows].clone().requires_grad_(True)
        loss = weighted_contrastive_distillation(local, teacher[rows])
        loss.backward()
        assert local.grad is not None
        out[rank] = (loss.item(), local.grad.clone())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_gathers_negatives_from_every_rank(tmp_path: Path) -> None:
    # Two ranks of two rows each must see the same negatives as one process with all four rows.
    torch.manual_seed(1)
    student, teacher = torch.randn(4, 6), torch.randn(4, 6)
    full = student.clone().requires_grad_(True)
    reference = weighted_contrastive_distillation(full, teacher, gather=False)
    reference.backward()
    assert full.grad is not None

    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_ddp_worker, args=(2, tmp_path / "store", student, teacher, out), nprocs=2, join=True)
    # The global loss is the mean of the ranks' local means; DDP averages gradients the same way.
    assert (out[0][0] + out[1][0]) / 2 == pytest.approx(reference.item(), rel=1e-5)
    grads = torch.cat([out[0][1], out[1][1]]) / 2
    assert torch.allclose(grads, full.grad, atol=1e-6)


# --- precision --------------------------------------------------------------------------------------


def test_losses_stay_float32_under_bf16_autocast() -> None:
    # The training loop runs the model under bf16 autocast, which recasts matmuls to bf16 even on
    # `.float()` inputs: the losses must switch it off, or the near-converged contrastive loss (a
    # small difference of large logsumexps) and its gradient become noise.
    torch.manual_seed(0)
    rows, dim, vocab, teacher_dim = 16, 64, 2000, 64
    cls = torch.randn(rows, dim)
    weight = torch.randn(vocab, dim) * 0.05
    counts = torch.zeros(rows, vocab).scatter_add_(
        1, torch.randint(5, vocab, (rows, 50)), torch.ones(rows, 50)
    )
    targets = torch.randint(5, vocab, (rows,))
    teacher = torch.randn(rows, teacher_dim)
    near = teacher + 0.8 * torch.randn(rows, teacher_dim)  # a student close to its teacher
    hidden = torch.randn(1, rows, dim)
    labels = targets.unsqueeze(0)
    cases = {
        "bow": lambda x: bow_loss(x, weight, counts),
        "linear_ce": lambda x: linear_cross_entropy(x, weight, targets, use_cce=False),
        "mlm": lambda x: mlm_loss(x.unsqueeze(0), labels, weight),
        "distil": lambda x: weighted_contrastive_distillation(x, teacher, temperature=0.1, gather=False),
    }
    inputs = {"bow": cls, "linear_ce": hidden[0], "mlm": hidden[0], "distil": near}
    for name, fn in cases.items():
        x32 = inputs[name].clone().requires_grad_(True)
        reference = fn(x32)
        reference.backward()
        xac = inputs[name].clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            value = fn(xac)
        value.backward()
        assert value.dtype == torch.float32, name
        assert value.item() == pytest.approx(reference.item(), rel=1e-6, abs=1e-7), name
        assert x32.grad is not None and xac.grad is not None
        assert torch.allclose(xac.grad, x32.grad, rtol=1e-5, atol=1e-8), name


# --- aggregation ------------------------------------------------------------------------------------


def test_aggregation_normalises_by_first_batch_and_applies_lambda() -> None:
    agg = LossAggregator({"mlm": 0.1, "bow": 1.0, "distil": 1.0}, random_coefficients=False)
    first = {"mlm": torch.tensor(10.0), "bow": torch.tensor(4.0), "distil": torch.tensor(2.0)}
    ones = agg.draw()
    assert agg.combine(first, ones).item() == pytest.approx(0.1 + 1 + 1)
    later = {"mlm": torch.tensor(5.0), "bow": torch.tensor(1.0), "distil": torch.tensor(2.0)}
    # Scales stay those of the first batch: 0.1 * 5/10 + 1/4 + 2/2.
    assert agg.combine(later, ones).item() == pytest.approx(0.05 + 0.25 + 1.0)


def test_aggregation_draws_fresh_uniform_coefficients_each_step() -> None:
    agg = LossAggregator(seed=0)
    draws = [agg.draw() for _ in range(200)]
    for name in ("mlm", "bow", "distil"):
        values = [d[name] for d in draws]
        assert len(set(values)) == len(values)  # fresh every step
        assert all(0.0 <= v < 1.0 for v in values)
        assert sum(values) / len(values) == pytest.approx(0.5, abs=0.07)
    assert draws[0]["mlm"] != draws[0]["bow"]  # one per loss, not one shared
    losses = {"mlm": torch.tensor(2.0), "bow": torch.tensor(3.0), "distil": torch.tensor(1.0)}
    total = agg.combine(losses, draws[5]).item()
    assert total == pytest.approx(draws[5]["mlm"] * 0.1 + draws[5]["bow"] + draws[5]["distil"])


def test_aggregator_state_round_trip_repeats_the_same_draws() -> None:
    agg = LossAggregator(seed=7)
    agg.combine({"mlm": torch.tensor(1.0), "bow": torch.tensor(1.0), "distil": torch.tensor(1.0)}, agg.draw())
    state = agg.state_dict()
    expected = [agg.draw() for _ in range(3)]
    restored = LossAggregator(seed=123)
    restored.load_state_dict(state)
    assert [restored.draw() for _ in range(3)] == expected
    assert restored.scales == agg.scales


def test_aggregator_resume_keeps_the_configured_weights_and_flag() -> None:
    # A resumed run with new loss settings used to keep the checkpoint's weights and flag, while the
    # checkpoint's htmllm.json recorded the new config as the one trained with.
    old = LossAggregator({"mlm": 0.1, "bow": 1.0, "distil": 1.0}, seed=7, random_coefficients=True)
    first = {"mlm": torch.tensor(10.0), "bow": torch.tensor(4.0), "distil": torch.tensor(2.0)}
    old.combine(first, old.draw())
    new = LossAggregator({"mlm": 0.0, "bow": 1.0, "distil": 0.5}, seed=123, random_coefficients=False)
    new.load_state_dict(old.state_dict())
    assert new.weights == {"mlm": 0.0, "bow": 1.0, "distil": 0.5}
    assert new.random_coefficients is False
    assert new.draw() == {"mlm": 1.0, "bow": 1.0, "distil": 1.0}
    assert new.scales == old.scales  # the learned first-batch magnitudes carry over
    later = {"mlm": torch.tensor(5.0), "bow": torch.tensor(2.0), "distil": torch.tensor(2.0)}
    assert new.combine(later, new.draw()).item() == pytest.approx(0.0 + 2.0 / 4.0 + 0.5 * 2.0 / 2.0)
    # The coefficient generator carries over too: turning the coefficients back on continues the draws.
    again = LossAggregator({"mlm": 0.1, "bow": 1.0, "distil": 1.0}, seed=99)
    again.load_state_dict(old.state_dict())
    assert again.draw() == old.draw()


def test_aggregator_rejects_bad_weights_and_missing_losses() -> None:
    with pytest.raises(ValueError):
        LossAggregator({"mlm": -1.0})
    agg = LossAggregator()
    with pytest.raises(KeyError):
        agg.combine({"mlm": torch.tensor(1.0)}, agg.draw())


@pytest.mark.gpu
def test_cut_cross_entropy_matches_plain_cross_entropy_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("cut_cross_entropy")
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(64, 32, device="cuda", generator=gen).to(torch.bfloat16)
    weight = torch.randn(500, 32, device="cuda", generator=gen).to(torch.bfloat16)
    bias = torch.randn(500, device="cuda", generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, 500, (64,), device="cuda", generator=gen)
    fused = linear_cross_entropy(hidden, weight, targets, bias=bias, use_cce=True)
    plain = linear_cross_entropy(hidden, weight, targets, bias=bias, use_cce=False)
    assert fused.item() == pytest.approx(plain.item(), rel=2e-2)


def test_requesting_cut_cross_entropy_without_cuda_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="cut-cross-entropy"):
        linear_cross_entropy(torch.randn(2, 4), torch.randn(5, 4), torch.tensor([0, 1]), use_cce=True)
