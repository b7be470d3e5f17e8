"""The three pretraining objectives and how they are combined (paper sections 2.3-2.4).

Everything here is a pure function of tensors, or a small module whose weights exist only during
pretraining (the MLM transform, the distillation projection). The encoder itself is not imported: the
training loop hands in hidden states and the (tied) input embedding matrix, so each loss can be checked
against a hand-computed value on a two-token batch.

- `mask_tokens` + `mlm_loss`: masked language modelling on text *and* tag tokens, 30% of them, the
  80/10/10 rule; logits are computed only at masked positions and through the input embedding matrix.
- `bow_counts` + `bow_loss`: bag-of-words, every non-special token of a document predicted from its
  [CLS] vector, written as a count-weighted cross-entropy over one row of logits per document.
- `DistillationHead` + `weighted_contrastive_distillation`: the student embedding projected D -> R -> T
  into the teacher's space and trained contrastively against the teachers of the other documents,
  negatives down-weighted by how similar the teachers themselves find the pair.
- `LossAggregator`: each loss divided by its first-batch magnitude, times lambda, times a fresh U(0, 1)
  coefficient per loss per step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

IGNORE_INDEX = -100
LOSS_NAMES: tuple[str, ...] = ("mlm", "bow", "distil")
# lambda per loss (paper): MLM is down-weighted because its gradient is the noisiest of the three.
DEFAULT_LOSS_WEIGHTS: dict[str, float] = {"mlm": 0.1, "bow": 1.0, "distil": 1.0}


# --- masked language modelling ----------------------------------------------------------------------


@dataclass(frozen=True)
class MaskingConfig:
    """The BERT masking rule; ModernBERT's 30% rather than BERT's 15% (more signal per sequence)."""

    mask_prob: float = 0.3
    replace_with_mask: float = 0.8  # of the selected tokens: becomes [MASK]
    replace_with_random: float = 0.1  # becomes a random non-special token; the rest stays unchanged

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.replace_with_mask < 0 or self.replace_with_random < 0:
            raise ValueError("replacement fractions must be non-negative")
        if self.replace_with_mask + self.replace_with_random > 1.0:
            raise ValueError("replace_with_mask + replace_with_random must be <= 1")


def full_precision(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast switched off on `device`: the losses' float32 must stay float32.

    `.float()` alone is not enough under `torch.autocast`: it recasts every matmul to the autocast dtype
    whatever its inputs are, and bfloat16's 8-bit mantissa turns the contrastive loss (a small difference
    of large logsumexps) and its gradient into noise. The encoder still runs under the caller's autocast.
    """
    return torch.autocast(device_type=device.type, enabled=False)


def special_token_mask(input_ids: Tensor, special_ids: Sequence[int]) -> Tensor:
    """True where the token is one of `special_ids` ([PAD], [CLS], [SEP], ...)."""
    specials = torch.tensor(list(special_ids), dtype=input_ids.dtype, device=input_ids.device)
    return torch.isin(input_ids, specials)


def mask_tokens(
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    mask_id: int,
    special_ids: Sequence[int],
    vocab_size: int,
    generator: torch.Generator,
    config: MaskingConfig = MaskingConfig(),
) -> tuple[Tensor, Tensor]:
    """Corrupt a batch for MLM: `(masked_ids, labels)`, labels `IGNORE_INDEX` where nothing is predicted.

    Every real token that is not special is a candidate, tag tokens included: the encoder must learn
    document structure, not only prose. The generator is explicit so a resumed run masks identically.
    `special_ids` must list every special token of the tokenizer (the `[unusedN]` padding of the
    vocabulary included), since random replacements are drawn from the ids it leaves out.
    """
    device = input_ids.device
    candidates = attention_mask.bool() & ~special_token_mask(input_ids, special_ids)  # (B, L)
    draws = torch.rand(input_ids.shape, generator=generator, device=generator.device).to(device)
    selected = candidates & (draws < config.mask_prob)  # (B, L)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

    # One more uniform per position decides which of the three fates a selected token meets.
    fate = torch.rand(input_ids.shape, generator=generator, device=generator.device).to(device)
    to_mask = selected & (fate < config.replace_with_mask)
    to_random = selected & (fate >= config.replace_with_mask)
    to_random &= fate < config.replace_with_mask + config.replace_with_random

    # Random replacements are drawn from the non-special vocabulary only.
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[torch.tensor(list(special_ids), dtype=torch.long)] = False
    pool = allowed.nonzero().squeeze(1)  # (V',)
    picks = torch.randint(len(pool), input_ids.shape, generator=generator, device=generator.device)
    random_ids = pool[picks.cpu()].to(device=device, dtype=input_ids.dtype)

    masked = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels


class MlmHead(nn.Module):
    """ModernBERT's prediction transform (dense -> GELU -> LayerNorm) plus the decoder bias.

    The decoder weight is not here: it is the encoder's input embedding matrix, passed in at call time,
    so the tie survives any re-wrapping (DDP, compile) and the served checkpoint needs no extra weight.
    """

    def __init__(self, hidden: int, vocab_size: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden_states: Tensor) -> Tensor:
        out: Tensor = self.norm(self.act(self.dense(hidden_states)))
        return out


def _cut_cross_entropy() -> Callable[..., Tensor] | None:
    """`cut_cross_entropy.linear_cross_entropy` when the package is installed, else None."""
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError:
        return None
    return linear_cross_entropy  # type: ignore[no-any-return]


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    use_cce: bool | None = None,
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T + bias` against `targets`, rows (M, D) -> scalar.

    On CUDA with `cut-cross-entropy` installed the (M, V) logits are never materialised; elsewhere it
    is the plain computation in float32. `use_cce=None` picks automatically.
    """
    cce = _cut_cross_entropy() if use_cce is not False and hidden.is_cuda else None
    if use_cce and cce is None:
        raise RuntimeError("use_cce=True needs CUDA tensors and the cut-cross-entropy package")
    if cce is not None:
        # The kernel accumulates in float32 itself, whatever the autocast state.
        # Keyword arguments only: the positional order of this API has changed between releases.
        # The kernel wants one dtype for embeddings, classifier and bias (bf16 under autocast).
        return cce(
            e=hidden.contiguous(),
            c=weight.to(hidden.dtype),
            targets=targets,
            bias=None if bias is None else bias.to(hidden.dtype),
            reduction="mean",
        )
    with full_precision(hidden.device):
        logits = hidden.float() @ weight.float().t()  # (M, V)
        if bias is not None:
            logits = logits + bias.float()
        return F.cross_entropy(logits, targets)


def mlm_loss(
    hidden_states: Tensor,
    labels: Tensor,
    decoder_weight: Tensor,
    *,
    decoder_bias: Tensor | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
    use_cce: bool | None = None,
) -> Tensor:
    """MLM cross-entropy, computed only at the masked positions.

    hidden_states (B, L, D), labels (B, L) with `IGNORE_INDEX` off the masked positions, decoder_weight
    (V, D) = the tied input embeddings. Gathering the ~30% masked rows before the transform and the
    vocabulary projection (ModernBERT's sparse prediction) saves ~70% of the largest matmul.
    """
    selected = labels != IGNORE_INDEX  # (B, L)
    masked_hidden = hidden_states[selected]  # (M, D)
    targets = labels[selected]  # (M,)
    if transform is not None:
        masked_hidden = transform(masked_hidden)
    if targets.numel() == 0:
        # Nothing was masked (tiny documents). The loss is zero, but it must still reach every
        # parameter the normal path reaches (transform, decoder weight and bias): DDP without
        # find_unused_parameters fails on the next step when one of them got no gradient. The plain
        # computation on the empty selection does that; the fused kernel is not asked about 0 rows.
        with full_precision(hidden_states.device):
            logits = masked_hidden.float() @ decoder_weight.float().t()  # (0, V)
            if decoder_bias is not None:
                logits = logits + decoder_bias.float()
            return logits.sum() * 0.0
    return linear_cross_entropy(masked_hidden, decoder_weight, targets, bias=decoder_bias, use_cce=use_cce)


# --- bag of words -----------------------------------------------------------------------------------


def bow_counts(
    input_ids: Tensor, attention_mask: Tensor, *, vocab_size: int, special_ids: Sequence[int]
) -> Tensor:
    """(B, V) float counts of each non-special token in each document (the BOW targets)."""
    valid = attention_mask.bool() & ~special_token_mask(input_ids, special_ids)  # (B, L)
    counts = torch.zeros(input_ids.shape[0], vocab_size, device=input_ids.device)
    counts.scatter_add_(1, input_ids.long(), valid.float())
    return counts


def bow_loss(
    cls_hidden: Tensor, embedding_weight: Tensor, counts: Tensor, *, bias: Tensor | None = None
) -> Tensor:
    """Bag-of-words cross-entropy from the [CLS] vector through the tied embedding matrix.

    cls_hidden (B, D), embedding_weight (V, D), counts (B, V). Repeating CLS once per token and taking
    the mean token cross-entropy gives the same number, because all copies share one softmax row:
    sum_t -log p(x_t) = sum_v count_v * -log p(v). One (B, V) logit matrix instead of (B * L, V).
    The mean is over all counted tokens of the batch, exactly as the expanded form.
    """
    with full_precision(cls_hidden.device):
        logits = cls_hidden.float() @ embedding_weight.float().t()  # (B, V)
        if bias is not None:
            logits = logits + bias.float()
        log_probs = F.log_softmax(logits, dim=-1)  # (B, V)
        # No counted token (documents of special tokens only) gives 0 / 1 = 0, through the same graph.
        return -(counts.float() * log_probs).sum() / counts.sum().float().clamp_min(1.0)


# --- teacher-space weighted contrastive distillation ------------------------------------------------


class DistillationHead(nn.Module):
    """Low-rank projection D -> R -> T from the student's embedding into the teacher's space.

    Used only during pretraining and discarded: the served embedding is the student's own (B, D), and
    the bottleneck keeps the head from doing the work the encoder should do.
    """

    def __init__(self, student_dim: int, teacher_dim: int, *, rank: int = 256) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"rank must be positive, got {rank}")
        self.down = nn.Linear(student_dim, rank, bias=False)
        self.up = nn.Linear(rank, teacher_dim)

    def forward(self, student: Tensor) -> Tensor:
        out: Tensor = self.up(self.down(student))  # (B, T)
        return out


def all_gather_rows(x: Tensor) -> tuple[Tensor, int]:
    """Rows of `x` from every rank, in rank order, and the offset of this rank's rows.

    The local slice is the caller's tensor itself, so gradients flow through it; the other ranks'
    rows are constants here (their own rank differentiates them). Ranks may hold different row counts
    (the last batch of an epoch). Without an initialised process group it returns `x` unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    world, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([x.shape[0]], device=x.device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    padded = x.detach().new_zeros((max(counts), *x.shape[1:]))
    padded[: x.shape[0]] = x.detach()
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded.contiguous())
    parts = [g[:n] for g, n in zip(gathered, counts, strict=True)]
    parts[rank] = x
    return torch.cat(parts), sum(counts[:rank])


def weighted_contrastive_distillation(
    student: Tensor, teacher: Tensor, *, temperature: float = 0.1, gather: bool = True
) -> Tensor:
    """Contrastive loss in teacher space with teacher-similarity-weighted negatives.

    student (B, T): projected student embeddings; teacher (B, T): the teacher's embeddings of the same
    documents. s_ij = cos(student_i, teacher_j); the positive is j = i, every other teacher j (gathered
    from all ranks under DDP) is a negative with weight w_ij = (1 - t~_ij) / 2, t~_ij =
    cos(teacher_i, teacher_j). Two pages the teacher finds identical are not pushed apart, two
    unrelated pages are pushed with weight ~1/2, opposites with ~1:

        loss_i = -log( e^{s_ii/tau} / (e^{s_ii/tau} + sum_{j != i} w_ij e^{s_ij/tau}) )

    averaged over the local rows.
    """
    # At least float32, autocast off: the loss is a small difference of large logsumexps (1/tau
    # amplifies), and bf16 matmuls here left the gradient of a near-converged student mostly noise.
    with full_precision(student.device):
        return _weighted_contrastive(student, teacher, temperature=temperature, gather=gather)


def _weighted_contrastive(student: Tensor, teacher: Tensor, *, temperature: float, gather: bool) -> Tensor:
    dtype = torch.promote_types(student.dtype, torch.float32)
    s = F.normalize(student.to(dtype), dim=-1)  # (B, T)
    t_local = F.normalize(teacher.to(dtype), dim=-1)  # (B, T)
    # The student appears only on the anchor side, so the gathered teacher block needs no gradient.
    t_all, offset = all_gather_rows(t_local) if gather else (t_local, 0)  # (N, T)
    rows = torch.arange(s.shape[0], device=s.device)
    positives = rows + offset  # column of each anchor's own teacher

    sims = s @ t_all.t()  # (B, N) s_ij
    teacher_sims = t_local @ t_all.t()  # (B, N) t~_ij
    weights = ((1.0 - teacher_sims) / 2.0).clamp_min(0.0)
    weights[rows, positives] = 1.0
    # log w folds the weights into one logsumexp; w = 0 gives -inf, which logsumexp treats as absent.
    logits = sims / temperature + torch.log(weights)  # (B, N)
    return (torch.logsumexp(logits, dim=-1) - logits[rows, positives]).mean()


def distillation_cosine(student: Tensor, teacher: Tensor) -> Tensor:
    """Per-row cosine between projected student and teacher (B,): the held-out figure we report."""
    return F.cosine_similarity(student.float(), teacher.float(), dim=-1)


# --- aggregation ------------------------------------------------------------------------------------


class LossAggregator:
    """total = sum_k u_k * lambda_k * loss_k / |loss_k on the first batch|, u_k ~ U(0, 1) fresh each step.

    Dividing by the first-batch magnitude puts the three losses (MLM ~ log V, BOW ~ log V, contrastive
    ~ log B) on one scale so lambda means what it says; the random coefficients keep any single loss
    from dominating for long stretches (the paper's choice). The generator is owned here and saved in
    the training state, so a resumed run draws the same coefficients.
    """

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        *,
        seed: int = 0,
        random_coefficients: bool = True,
    ) -> None:
        self.weights = dict(DEFAULT_LOSS_WEIGHTS if weights is None else weights)
        for name, value in self.weights.items():
            if value < 0 or not math.isfinite(value):
                raise ValueError(f"loss weight {name}={value} must be a finite non-negative number")
        self.random_coefficients = random_coefficients
        self.scales: dict[str, float] | None = None
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self) -> dict[str, float]:
        """Fresh U(0, 1) coefficients for one optimisation step (all 1.0 when disabled)."""
        if not self.random_coefficients:
            return dict.fromkeys(self.weights, 1.0)
        values = torch.rand(len(self.weights), generator=self.generator).tolist()
        return dict(zip(self.weights, values, strict=True))

    def calibrate(self, losses: Mapping[str, Tensor]) -> None:
        """Record the first batch's magnitudes (averaged over ranks under DDP) once."""
        if self.scales is not None:
            return
        values = torch.tensor([float(losses[name].detach().abs()) for name in self.weights])
        if dist.is_available() and dist.is_initialized():
            device = next(iter(losses.values())).device
            values = values.to(device)
            dist.all_reduce(values)
            values = (values / dist.get_world_size()).cpu()
        # A loss that starts at exactly zero would divide by zero; it then keeps its raw scale.
        self.scales = {
            name: (v if v > 1e-12 else 1.0) for name, v in zip(self.weights, values.tolist(), strict=True)
        }

    def combine(self, losses: Mapping[str, Tensor], coefficients: Mapping[str, float]) -> Tensor:
        """The weighted total to back-propagate; calibrates on its first call."""
        missing = set(self.weights) - set(losses)
        if missing:
            raise KeyError(f"losses missing: {sorted(missing)}")
        self.calibrate(losses)
        assert self.scales is not None
        terms = [
            losses[name] * (coefficients[name] * self.weights[name] / self.scales[name])
            for name in self.weights
        ]
        return torch.stack(terms).sum()

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": dict(self.weights),
            "random_coefficients": self.random_coefficients,
            "scales": None if self.scales is None else dict(self.scales),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what the run learned or drew (first-batch scales, coefficient generator) only.

        The weights and the random-coefficients flag stay the ones this aggregator was built with, i.e.
        the current config's: a resume with new loss settings trains with them, as the checkpoint's
        htmllm.json then records (the saved values used to win silently); `check_resumable` warns about
        the change. `state["weights"]` and `state["random_coefficients"]` remain in the state as a record.
        """
        scales = state["scales"]
        if scales is not None and set(scales) >= set(self.weights):
            self.scales = {name: float(scales[name]) for name in self.weights}
        else:
            self.scales = None  # never calibrated, or a loss without a saved scale: calibrate afresh
        self.generator.set_state(state["generator"])
