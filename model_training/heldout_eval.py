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
    train_centroid: np.ndarray,
) -> dict[str, float]:
    """Held-out figures: cosine to the teacher, retrieval top-1, losses.

    Everything but the MLM loss comes from the clean input (MLM needs the masked one, with masks fixed
    by `EVAL_MASK_SEED` so evaluations compare): the cosine, top-1, BOW and distillation figures describe
    the model as served, not as corrupted for training.

    `centroid_cosine` is the cosine a constant prediction (the mean training teacher vector) gets: the
    floor the student's cosine must be read against, since sentence embeddings share a large common
    direction. `top1` asks whether each page's projected student vector is closest to its own teacher
    among all held-out teachers.
    """
    if not data.ids:
        return {}
    was_training = pretraining.training
    pretraining.eval()
    special = pretraining.special
    encoder = pretraining.model.encoder
    generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
    masking = MaskingConfig(mask_prob=config.mask_prob)
    students, sums, weights = [], {"mlm": 0.0, "bow": 0.0, "distil": 0.0}, 0
    for rows in _batches(len(data.ids), config.eval_batch_size):
        ids, mask = collate(
            data.ids[rows], max_length=config.max_length, pad_id=special.pad, sep_id=special.sep
        )
        masked, labels = pretraining.mask(ids, mask, generator=generator, config=masking)
        teacher = torch.from_numpy(data.teacher[rows]).to(device)
        ids, mask, masked, labels = ids.to(device), mask.to(device), masked.to(device), labels.to(device)
        # Two passes: the masked input for MLM, the clean one for everything else. The losses switch
        # autocast off inside (float32).
        with autocast(config, device):
            masked_hidden = encoder(input_ids=masked, attention_mask=mask).last_hidden_state
            clean_hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            student = pretraining.student(clean_hidden, mask)  # (B, T)
            losses = {
                "mlm": pretraining.mlm(masked_hidden, labels),
                "bow": pretraining.bow(clean_hidden, ids, mask),
                "distil": pretraining.distil(student, teacher, gather=False),
            }
        students.append(student.float().cpu())
        n = rows.stop - rows.start
        for name in sums:
            sums[name] += float(losses[name]) * n
        weights += n
    student = torch.cat(students)  # (N, T)
    teacher_all = torch.from_numpy(data.teacher)
    cosine = distillation_cosine(student, teacher_all)
    sims = nn.functional.normalize(student, dim=-1) @ nn.functional.normalize(teacher_all, dim=-1).t()
    top1 = (sims.argmax(dim=1) == torch.arange(len(student))).float().mean()
    centroid = torch.from_numpy(train_centroid).expand_as(teacher_all)
    pretraining.train(was_training)
    return {
        "cosine": float(cosine.mean()),
        "centroid_cosine": float(distillation_cosine(centroid, teacher_all).mean()),
        "top1": float(top1),
        "documents": float(len(student)),
        **{f"{name}_loss": value / weights for name, value in sums.items()},
    }
