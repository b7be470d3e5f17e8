"""The encoder, its pooling and the task heads: transformers' ModernBERT plus what we add on top.

The encoder is `transformers.ModernBertModel` unchanged, so a checkpoint's encoder loads with
`AutoModel.from_pretrained`. We add pooling (CLS by default, mean optionally), small MLP task heads
(classification with softmax over named classes, or regression) and a padding-free packed forward for
FlashAttention-2, where documents are concatenated into one row and separated by `cu_seq_lens`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from transformers import ModernBertConfig, ModernBertModel

from service.core.encoder_forward import (
    PackedCut,
    VarlenAttention,
    encoder_hidden_states,
    packed_hidden_states,
    packed_positions,
    supports_fast_forward,
)

if TYPE_CHECKING:
    from service.core.tokenizer import HtmlTokenizer

# ModernBertConfig kwargs per named size. `base` is the paper's encoder (22 layers, 12 heads, hidden 768,
# 8192-token context); `mini` is the CPU-friendly bundled default; `tiny` keeps tests fast while still
# exercising both global and sliding-window layers (local_attention is small enough to matter).
PRESETS: dict[str, dict[str, int]] = {
    "base": {
        "hidden_size": 768,
        "intermediate_size": 1152,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "local_attention": 128,
        "global_attn_every_n_layers": 3,
        "max_position_embeddings": 8192,
    },
    "small": {
        "hidden_size": 512,
        "intermediate_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "local_attention": 128,
        "global_attn_every_n_layers": 3,
        "max_position_embeddings": 8192,
    },
    "mini": {
        "hidden_size": 384,
        "intermediate_size": 576,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "local_attention": 128,
        "global_attn_every_n_layers": 3,
        "max_position_embeddings": 8192,
    },
    "tiny": {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "local_attention": 8,
        "global_attn_every_n_layers": 3,
        "max_position_embeddings": 512,
    },
}

POOLINGS = ("cls", "mean")
# ModernBERT's local layers see `local_attention // 2` positions either side: below 2 that window is
# empty, and the banded forward divides by it (every batch then failed; transformers' forward runs).
MIN_LOCAL_ATTENTION = 2
HEAD_KINDS = ("classification", "regression")


def build_config(
    preset: str, tokenizer: HtmlTokenizer, *, max_length: int, **overrides: Any
) -> ModernBertConfig:
    """A ModernBertConfig for `preset` whose vocabulary and five special ids come from `tokenizer`.

    ModernBertConfig's defaults name ids of the original 50K vocabulary; with a custom vocabulary they
    point at arbitrary tokens (or past the end), so every special id is set from the tokenizer.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 ([CLS] and [SEP]), got {max_length}")
    special = tokenizer.special_ids
    kwargs: dict[str, Any] = dict(PRESETS[preset])
    kwargs.update(
        vocab_size=tokenizer.vocab_size,
        max_position_embeddings=max_length,
        pad_token_id=special.pad,
        unk_token_id=special.unk,
        cls_token_id=special.cls,
        sep_token_id=special.sep,
        mask_token_id=special.mask,
        bos_token_id=special.cls,
        eos_token_id=special.sep,
    )
    kwargs.update(overrides)
    if kwargs["local_attention"] < MIN_LOCAL_ATTENTION:
        raise ValueError(
            f"local_attention {kwargs['local_attention']} is below {MIN_LOCAL_ATTENTION}: the sliding window "
            "(local_attention // 2) would be empty"
        )
    if kwargs["hidden_size"] % kwargs["num_attention_heads"]:
        raise ValueError(
            f"hidden_size {kwargs['hidden_size']} is not a multiple of "
            f"num_attention_heads {kwargs['num_attention_heads']}"
        )
    return ModernBertConfig(**kwargs)


@dataclass(frozen=True)
class HeadSpec:
    """What a task head predicts; recorded in htmllm.json beside the head's weights."""

    name: str
    kind: str  # "classification" | "regression"
    labels: list[str] = field(default_factory=list)  # class names; [] for regression
    hidden: int = 256
    metrics: dict[str, float] = field(default_factory=dict)  # evaluation figures recorded when trained

    def __post_init__(self) -> None:
        _check_head_name(self.name)
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head {self.name!r}: kind {self.kind!r} is not one of {HEAD_KINDS}")
        if self.kind == "classification" and len(self.labels) < 2:
            raise ValueError(f"classification head {self.name!r} needs at least two labels")
        if self.kind == "regression" and self.labels:
            raise ValueError(f"regression head {self.name!r} takes no labels")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"head {self.name!r} has duplicate labels")
        if self.hidden < 1:
            raise ValueError(f"head {self.name!r}: hidden must be positive")
        # A NaN had been written into htmllm.json as a bare `NaN`, which is no JSON (jq and browsers refuse
        # the file). A metric that is no number says its evaluation broke: refused where it is recorded.
        bad = {k: v for k, v in self.metrics.items() if not _is_finite_number(v)}
        if bad:
            raise ValueError(f"head {self.name!r}: metrics must be finite numbers, not {bad}")

    @property
    def outputs(self) -> int:
        return len(self.labels) if self.kind == "classification" else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "labels": list(self.labels),
            "hidden": self.hidden,
            "metrics": dict(self.metrics),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HeadSpec:
        """A spec from its JSON form, strictly: a field of the wrong JSON type raises TypeError rather
        than being coerced (labels given as the string "abc" had become the classes a, b and c)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a head is a JSON object, not {type(data).__name__}")
        labels = data.get("labels", [])
        if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
            raise TypeError(f"head {data.get('name')!r}: labels must be a list of strings, not {labels!r}")
        metrics = data.get("metrics", {})
        if not isinstance(metrics, Mapping) or not all(_is_number(v) for v in metrics.values()):
            raise TypeError(f"head {data.get('name')!r}: metrics must map names to numbers, not {metrics!r}")
        return cls(
            name=typed_field(data, "name", str),
            kind=typed_field(data, "kind", str),
            labels=list(labels),
            hidden=typed_field(data, "hidden", int),
            # Counts (folds, pages) stay ints: a float(v) here turned them into 3.0 at every later save.
            metrics={str(k): v if isinstance(v, int) else float(v) for k, v in metrics.items()},
        )


# A head's file is heads/<name>.safetensors, staged as .<name>.safetensors.<8 characters>: 200 bytes of
# name leave room for both within the 255 bytes most file systems allow a file name.
MAX_HEAD_NAME_BYTES = 200


def _check_head_name(name: object) -> None:
    """A head name that can be its file's name on any file system the checkpoint may be copied to.

    A name with a NUL, a control character or a backslash, or longer than a file name may be, had passed,
    to fail later as a raw OSError or ValueError: at load, or at save after the encoder was written.
    """
    if not isinstance(name, str) or not name or name.startswith("."):
        raise ValueError(f"head name {name!r} must be a non-empty string not starting with '.'")
    if "/" in name or "\\" in name or not name.isprintable():
        raise ValueError(
            f"head name {name!r} must be a file-name-safe string: no '/', no backslash, no control or "
            "other non-printable characters"
        )
    if "." in name:
        # The head is a module of the model's ModuleDict, whose names torch refuses to hold a '.': such
        # a head had been saved, and then no command could load the checkpoint (a raw KeyError).
        raise ValueError(f"head name {name!r} must not contain '.' (use '_' or '-')")
    size = len(name.encode("utf-8"))
    if size > MAX_HEAD_NAME_BYTES:
        raise ValueError(
            f"head name {name[:40]!r}… is {size} bytes in UTF-8, over the {MAX_HEAD_NAME_BYTES} that fit "
            "a file name"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite_number(value: object) -> bool:
    """A number JSON can hold: an int (of any size: math.isfinite overflows on 10**400), or a finite float."""
    return _is_number(value) and (isinstance(value, int) or math.isfinite(cast(float, value)))


def typed_field(data: Mapping[str, Any], key: str, kind: type[Any]) -> Any:
    """`data[key]`, which must be a `kind` (a bool is no int): KeyError when absent, TypeError else."""
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{key} must be a JSON {_JSON_TYPES.get(kind, kind.__name__)}, not {value!r}")
    return value


_JSON_TYPES = {str: "string", int: "integer"}


class TaskHead(nn.Module):
    """LayerNorm -> Linear -> GELU -> Dropout -> Linear on the pooled embedding."""

    def __init__(self, spec: HeadSpec, embedding_dim: int, *, dropout: float = 0.1) -> None:
        super().__init__()
        self.spec = spec
        self.norm = nn.LayerNorm(embedding_dim)
        self.dense = nn.Linear(embedding_dim, spec.hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(spec.hidden, spec.outputs)

    def logits(self, pooled: Tensor) -> Tensor:
        """Raw outputs, (B, C) for classification or (B,) for regression; what training losses take."""
        x: Tensor = self.out(self.drop(self.act(self.dense(self.norm(pooled)))))  # (B, C)
        return x.squeeze(-1) if self.spec.kind == "regression" else x

    def forward(self, pooled: Tensor) -> Tensor:
        """(B, C) class probabilities or (B,) regression values."""
        logits = self.logits(pooled)
        return logits.softmax(dim=-1) if self.spec.kind == "classification" else logits


class HtmlEncoderModel(nn.Module):
    """A ModernBERT encoder, a pooling rule and named task heads."""

    def __init__(
        self,
        encoder: ModernBertModel,
        *,
        pooling: str = "cls",
        heads: Mapping[str, TaskHead] | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {POOLINGS}")
        self.encoder = encoder
        self.pooling = pooling
        self.heads = nn.ModuleDict()
        for name, head in (heads or {}).items():
            self.add_head(head, name=name)

    @classmethod
    def from_config(
        cls, config: ModernBertConfig, *, pooling: str = "cls", attn_implementation: str | None = None
    ) -> HtmlEncoderModel:
        """A randomly initialised model (the start of pre-training, or speed benchmarks)."""
        encoder = ModernBertModel(config)
        if attn_implementation is not None:
            encoder.set_attn_implementation(attn_implementation)
        return cls(encoder, pooling=pooling)

    @property
    def config(self) -> ModernBertConfig:
        config: ModernBertConfig = self.encoder.config
        return config

    @property
    def embedding_dim(self) -> int:
        return int(self.config.hidden_size)

    @property
    def head_specs(self) -> dict[str, HeadSpec]:
        return {name: cast(TaskHead, head).spec for name, head in self.heads.items()}

    def add_head(self, head: TaskHead, *, name: str | None = None) -> None:
        """Attach (or replace) a head; its input width must be the embedding width."""
        name = name or head.spec.name
        if name != head.spec.name:
            raise ValueError(f"head registered as {name!r} but its spec is named {head.spec.name!r}")
        if head.norm.normalized_shape != (self.embedding_dim,):
            raise ValueError(
                f"head {name!r} takes {head.norm.normalized_shape[0]}-d input; the encoder gives "
                f"{self.embedding_dim}"
            )
        self.heads[name] = head

    def place(self, device: str | torch.device, dtype: torch.dtype | None = None) -> HtmlEncoderModel:
        """Move the encoder to `device`/`dtype` and the heads to `device` in float32.

        RoPE's inverse frequencies stay float32: rounded to bfloat16 they would shift the angles of
        distant positions (the rotary module casts them back up, but the lost bits are gone).
        """
        rotary = self.encoder.rotary_emb
        saved = {name: buffer.detach().clone() for name, buffer in rotary.named_buffers(recurse=False)}
        cast(nn.Module, self.encoder).to(device=device, dtype=dtype)
        for name, buffer in saved.items():
            setattr(rotary, name, buffer.to(device=device))
        self.heads.to(device=device, dtype=torch.float32)
        return self

    def pool(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, L, D) hidden states to (B, D) by the model's pooling rule."""
        if self.pooling == "cls":
            return hidden[:, 0]  # (B, D)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, D)

    def embed(self, input_ids: Tensor, attention_mask: Tensor, *, fast: bool = True) -> Tensor:
        """(B, L) right-padded ids and mask to (B, D) unnormalised embeddings.

        In eval mode under SDPA this runs `encoder_forward` (banded local attention); `fast=False` forces
        transformers' own forward, which the ONNX export traces (its control flow is shape-free).
        """
        if fast and supports_fast_forward(self.encoder):
            first_only = self.pooling == "cls"  # then only position 0 is computed through the last layers
            hidden = encoder_hidden_states(self.encoder, input_ids, attention_mask, first_only=first_only)
        else:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.pool(hidden, attention_mask)

    def embed_packed(
        self,
        input_ids: Tensor,
        cu_seq_lens: Tensor,
        max_length: int,
        *,
        attention: VarlenAttention | None = None,
        positions: Tensor | None = None,
        cuts: Sequence[PackedCut] = (),
    ) -> Tensor:
        """Padding-free forward: (T,) concatenated ids, (N+1,) int32 offsets, to (N, D) embeddings.

        With `attention` (a varlen kernel: torch's FlashAttention-2, or the per-document reference) this
        runs `packed_hidden_states`, which needs what `encoder_forward` needs (SDPA configured, eval mode,
        no autograd). Without it, transformers' forward under the flash-attn package's FlashAttention-2.
        Any other attention would let packed documents attend to each other, so both refuse it.
        `positions` (T,), each token's position in its document, are derived from the offsets when not
        given (which reads them back from the device: the runner passes them). `cuts`
        (`packed_first_position_cuts`, with a varlen kernel and CLS pooling) run the trailing local
        layers on each document's leading tokens only.
        """
        if cuts and (attention is None or self.pooling != "cls"):
            raise ValueError("cuts are for CLS pooling with a varlen kernel: they keep position 0 only")
        if positions is None:
            _, positions = packed_positions(cu_seq_lens)  # (T,)
        if attention is not None:
            if not supports_fast_forward(self.encoder):
                raise ValueError("packed batches with a varlen kernel need SDPA, eval mode and no autograd")
            hidden = packed_hidden_states(
                self.encoder, input_ids, positions, cu_seq_lens, max_length, attention, cuts
            )
        else:
            implementation = self.config._attn_implementation
            if implementation != "flash_attention_2":
                raise ValueError(
                    f"packed batches need flash_attention_2 or a varlen kernel, not {implementation!r}"
                )
            hidden = self.encoder(
                input_ids=input_ids.unsqueeze(0),  # (1, T)
                position_ids=positions.unsqueeze(0),  # (1, T): each document's restart at 0, as alone
                cu_seq_lens_q=cu_seq_lens,
                cu_seq_lens_k=cu_seq_lens,
                max_length_q=max_length,
                max_length_k=max_length,
            ).last_hidden_state[0]  # (T, D)
        return self.pool_packed(hidden, cu_seq_lens, positions, cuts)

    def pool_packed(
        self, hidden: Tensor, cu_seq_lens: Tensor, positions: Tensor, cuts: Sequence[PackedCut] = ()
    ) -> Tensor:
        """(T, D) packed hidden states to (N, D) by the model's pooling rule; after `cuts`, each
        document's first row is at the last cut's offsets."""
        if cuts:
            cu_seq_lens = cuts[-1].cu_seq_lens
        starts = cu_seq_lens[:-1].long()  # (N,)
        if self.pooling == "cls":
            return hidden[starts]  # (N, D)
        lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).float()  # (N,)
        document = torch.cumsum(positions == 0, dim=0) - 1  # (T,): every document starts at position 0
        sums = torch.zeros(len(starts), hidden.shape[-1], device=hidden.device, dtype=torch.float32)
        sums.index_add_(0, document, hidden.float())  # (N, D)
        return (sums / lengths.unsqueeze(-1)).to(hidden.dtype)

    def score(self, embedding: Tensor) -> dict[str, Tensor]:
        """Every head's output on (B, D) pooled embeddings, in each head's own dtype."""
        out: dict[str, Tensor] = {}
        for name, module in self.heads.items():
            head = cast(TaskHead, module)
            out[name] = head(embedding.to(head.dense.weight.dtype))
        return out

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, *, fast: bool = True
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(B, D) embedding; per head (B, C) probabilities or (B,) regression values."""
        embedding = self.embed(input_ids, attention_mask, fast=fast)
        return embedding, self.score(embedding)
