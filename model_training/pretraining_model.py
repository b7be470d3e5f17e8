"""The model as pretrained: the encoder plus the heads that exist only while pretraining.

Kept apart from the loop in `pretrain` (after nanoGPT's model.py / train.py split): what the model
computes for the three objectives, which token ids it never masks, which of its parameters decay, and
the precision it runs at. The losses themselves live in `objectives`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from model_training.objectives import (
    LOSS_NAMES,
    DistillationHead,
    MaskingConfig,
    MlmHead,
    bow_counts,
    bow_loss,
    mask_tokens,
    mlm_loss,
    weighted_contrastive_distillation,
)
from model_training.train_config import TrainConfig
from service.core.modeling import HtmlEncoderModel
from service.core.tokenizer import HtmlTokenizer, SpecialIds


class PretrainingModel(nn.Module):
    """The encoder plus the heads that exist only while pretraining (MLM transform, distillation).

    The losses themselves are computed in float32 with autocast off (`objectives.full_precision`), so a
    caller may run the whole forward under bf16 autocast. `teacher_dim` None is a run without
    distillation (`loss_weights.distil = 0`, no teacher): no distillation head is built, rather than one
    that is never trained, so its parameters are not in the optimizer nor its random projection in the
    held-out figures, and `forward` returns the MLM and BOW losses only.
    """

    def __init__(
        self,
        model: HtmlEncoderModel,
        special: SpecialIds,
        *,
        teacher_dim: int | None,
        rank: int,
        temperature: float,
        special_ids: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.special = special
        # Every special token id: never masked, never a random replacement. The five named ones by
        # default; `all_special_ids(tokenizer)` adds the [unusedN] padding of the vocabulary.
        self.special_ids = sorted(set(_ids(special)) | set(special_ids or ()))
        hidden, vocab = model.embedding_dim, int(model.config.vocab_size)
        self.mlm_head = MlmHead(hidden, vocab, eps=float(model.config.norm_eps))
        self.distil_head: DistillationHead | None = (
            None if teacher_dim is None else DistillationHead(hidden, teacher_dim, rank=rank)
        )
        self.temperature = temperature

    @property
    def distils(self) -> bool:
        """Whether this model has a distillation head (the run trains with a teacher)."""
        return self.distil_head is not None

    @property
    def loss_names(self) -> tuple[str, ...]:
        """The losses `forward` returns, in `objectives.LOSS_NAMES` order."""
        return tuple(name for name in LOSS_NAMES if self.distils or name != "distil")

    def mask(
        self, input_ids: Tensor, attention_mask: Tensor, *, generator: torch.Generator, config: MaskingConfig
    ) -> tuple[Tensor, Tensor]:
        """`mask_tokens` with this model's special ids and vocabulary: `(masked_ids, labels)`."""
        return mask_tokens(
            input_ids,
            attention_mask,
            mask_id=self.special.mask,
            special_ids=self.special_ids,
            vocab_size=int(self.model.config.vocab_size),
            generator=generator,
            config=config,
        )

    def mlm(self, hidden: Tensor, labels: Tensor) -> Tensor:
        """MLM loss from the hidden states (B, L, D) of the masked input."""
        embedding_matrix = self.model.encoder.embeddings.tok_embeddings.weight  # (V, D), the tied decoder
        return mlm_loss(
            hidden, labels, embedding_matrix, decoder_bias=self.mlm_head.bias, transform=self.mlm_head
        )

    def bow(self, hidden: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Bag-of-words loss of the clean `input_ids` from the [CLS] row of `hidden` (B, L, D)."""
        embedding_matrix = self.model.encoder.embeddings.tok_embeddings.weight  # (V, D)
        counts = bow_counts(
            input_ids, attention_mask, vocab_size=embedding_matrix.shape[0], special_ids=self.special_ids
        )
        return bow_loss(hidden[:, 0], embedding_matrix, counts)  # (B, D) [CLS]

    def student(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """The pooled embedding projected into the teacher's space, (B, T)."""
        if self.distil_head is None:
            raise RuntimeError("this model was built without a distillation head (teacher_dim None)")
        projected: Tensor = self.distil_head(self.model.pool(hidden, attention_mask))
        return projected

    def distil(self, student: Tensor, teacher: Tensor, *, gather: bool = True) -> Tensor:
        return weighted_contrastive_distillation(
            student, teacher, temperature=self.temperature, gather=gather
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        masked_ids: Tensor,
        labels: Tensor,
        teacher: Tensor | None,
        *,
        gather: bool = True,
    ) -> dict[str, Tensor]:
        """The losses of one micro-batch: "mlm", "bow" and, with a distillation head, "distil"."""
        # One forward pass over the corrupted input serves all three objectives: a second, clean pass
        # for BOW/distillation would double the cost for little gain (masking acts as augmentation).
        # Held-out figures do take the clean pass (`heldout_eval.evaluate`).
        hidden = self.model.encoder(input_ids=masked_ids, attention_mask=attention_mask).last_hidden_state
        losses = {"mlm": self.mlm(hidden, labels), "bow": self.bow(hidden, input_ids, attention_mask)}
        if self.distil_head is not None:
            if teacher is None:
                raise ValueError("a model with a distillation head needs the batch's teacher vectors")
            losses["distil"] = self.distil(self.student(hidden, attention_mask), teacher, gather=gather)
        return losses


def _ids(special: SpecialIds) -> list[int]:
    return [special.pad, special.unk, special.cls, special.sep, special.mask]


def all_special_ids(tokenizer: HtmlTokenizer) -> list[int]:
    """Every special token id of `tokenizer`: the five named ones and every added special token.

    The tokenizer trainer pads a small vocabulary with `[unusedN]` special tokens; drawn as MLM random
    replacements they would teach the model tokens that never occur in a page.
    """
    added = tokenizer.backend.get_added_tokens_decoder()
    return sorted(set(_ids(tokenizer.special_ids)) | {int(i) for i, token in added.items() if token.special})


def autocast(config: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The precision the encoder runs at, in training and held-out evaluation alike."""
    bf16 = config.precision == "bf16" or (config.precision == "auto" and device.type == "cuda")
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only: biases, norms and the embedding table (the tied decoder) are not decayed."""
    decay, no_decay = split_decay((name, p) for name, p in module.named_parameters() if p.requires_grad)
    return [
        {"params": [p for _, p in decay], "weight_decay": weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]


def split_decay(
    named: Iterable[tuple[str, Tensor]],
) -> tuple[list[tuple[str, Tensor]], list[tuple[str, Tensor]]]:
    """`named` parameters split, in order, into those AdamW decays (matrices) and those it does not
    (biases, norms, the embedding table: the tied decoder): `param_groups`' two groups.

    Apart so that a saved optimizer state, which numbers the parameters group by group, can be mapped
    to names (`training_checkpoints` drops an untrained head's entries by them).
    """
    decay: list[tuple[str, Tensor]] = []
    no_decay: list[tuple[str, Tensor]] = []
    for name, param in named:
        (decay if param.ndim >= 2 and "tok_embeddings" not in name else no_decay).append((name, param))
    return decay, no_decay
