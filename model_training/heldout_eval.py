"""Held-out evaluation during pretraining: how the model as served does on pages it never trained on.

Run by `pretrain.train` every `eval_every` steps and at the end (rank 0 only); the figures go to the
metrics log and the run's summary. Kept apart from the loop, which only asks for `evaluate(...)`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from model_training.batches import SplitData, collate
from model_training.objectives import MaskingConfig, distillation_cosine
from model_training.pretraining_model import PretrainingModel, autocast
from model_training.train_config import TrainConfig

EVAL_MASK_SEED = 12345  # held-out MLM masks are the same at every evaluation


def _batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


@torch.no_grad()
def evaluate(
    pretraining: PretrainingModel,
    data: SplitData,
    *,
    config: TrainConfig,
    device: torch.device,
    train_centroid: np.ndarray | None,
) -> dict[str, float]:
    """Held-out figures: cosine to the teacher, retrieval top-1, losses, and the pages (`documents`, an
    int) they were measured on; none at all without held-out pages.

    Everything but the MLM loss comes from the clean input (MLM needs the masked one, with masks fixed
    by `EVAL_MASK_SEED` so evaluations compare): the cosine, top-1, BOW and distillation figures describe
    the model as served, not as corrupted for training.

    `centroid_cosine` is the cosine a constant prediction (the mean training teacher vector) gets: the
    floor the student's cosine must be read against, since sentence embeddings share a large common
    direction. `top1` asks whether each page's projected student vector is closest to its own teacher
    among all held-out teachers.

    A model without a distillation head (a run with `loss_weights.distil = 0`, no teacher) has none of
    the teacher figures: `cosine`, `centroid_cosine`, `top1` and `distil_loss` are left out, not given as
    0, which a reader (or the model card) would take for a measurement.
    """
    if not data.ids:
        return {}
    was_training = pretraining.training
    pretraining.eval()
    distils = pretraining.distils
    special = pretraining.special
    encoder = pretraining.model.encoder
    generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
    masking = MaskingConfig(mask_prob=config.mask_prob)
    students: list[torch.Tensor] = []
    sums = dict.fromkeys(("mlm", "bow", "distil") if distils else ("mlm", "bow"), 0.0)
    weights = 0
    for rows in _batches(len(data.ids), config.eval_batch_size):
        ids, mask = collate(
            data.ids[rows], max_length=config.max_length, pad_id=special.pad, sep_id=special.sep
        )
        masked, labels = pretraining.mask(ids, mask, generator=generator, config=masking)
        ids, mask, masked, labels = ids.to(device), mask.to(device), masked.to(device), labels.to(device)
        # Two passes: the masked input for MLM, the clean one for everything else. The losses switch
        # autocast off inside (float32).
        with autocast(config, device):
            masked_hidden = encoder(input_ids=masked, attention_mask=mask).last_hidden_state
            clean_hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            losses = {
                "mlm": pretraining.mlm(masked_hidden, labels),
                "bow": pretraining.bow(clean_hidden, ids, mask),
            }
            if distils:
                teacher = torch.from_numpy(data.teacher[rows]).to(device)
                student = pretraining.student(clean_hidden, mask)  # (B, T)
                losses["distil"] = pretraining.distil(student, teacher, gather=False)
                students.append(student.float().cpu())
        n = rows.stop - rows.start
        for name in sums:
            sums[name] += float(losses[name]) * n
        weights += n
    pretraining.train(was_training)
    figures: dict[str, float] = {}
    if distils:
        if train_centroid is None:
            raise ValueError("a model with a distillation head is evaluated against a train_centroid")
        figures.update(_teacher_figures(torch.cat(students), data.teacher, train_centroid))
    figures["documents"] = weights  # a count: 10, not the 10.0 summary.json and htmllm.json had said
    figures.update({f"{name}_loss": value / weights for name, value in sums.items()})
    return figures


def _teacher_figures(
    student: torch.Tensor, teacher: np.ndarray, train_centroid: np.ndarray
) -> dict[str, float]:
    """`cosine`, `centroid_cosine` and `top1` of the projected students (N, T) against their teachers."""
    teacher_all = torch.from_numpy(teacher)
    cosine = distillation_cosine(student, teacher_all)
    sims = nn.functional.normalize(student, dim=-1) @ nn.functional.normalize(teacher_all, dim=-1).t()
    top1 = (sims.argmax(dim=1) == torch.arange(len(student))).float().mean()
    centroid = torch.from_numpy(train_centroid).expand_as(teacher_all)
    return {
        "cosine": float(cosine.mean()),
        "centroid_cosine": float(distillation_cosine(centroid, teacher_all).mean()),
        "top1": float(top1),
    }
