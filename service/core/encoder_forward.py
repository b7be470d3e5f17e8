"""ModernBERT's encoder forward pass for inference, over transformers' own modules and weights.

Why a second forward pass beside `ModernBertModel.forward`: the serving hot path pays for three things
that transformers' generic code does not avoid under SDPA (text-embeddings-inference keeps its own model
code for the same reason):
- local layers (two of every three) attend to keys within `sliding_window` (64) positions, but
  transformers gives SDPA a full (B, 1, L, L) mask, so every layer computes all L x L scores. Here a
  local layer takes its queries in chunks of `window` with only the 3 x window keys around each chunk:
  the same result (the same keys, the same softmax), with attention work per query bounded by 192 keys
  instead of L (2.7x less at 512 tokens, 43x less at 8192);
- global layers get a (B, 1, 1, L) key-padding mask that SDPA broadcasts, or none when nothing is padded
  (which lets CUDA pick its flash kernel), instead of a materialised (B, 1, L, L) one;
- rotary embeddings go on queries and keys in one pass (three elementwise operators instead of about
  sixteen), with the same float32 tables transformers computes.

Outputs match transformers' forward to float32 rounding (tests/core/test_encoder_forward.py). Only the
configurations that code reproduces take this path (`supports_fast_forward`): SDPA attention, default
RoPE, eval mode, no autograd. Training, other attention implementations and the ONNX export use
transformers' forward.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import ModernBertModel
from transformers.models.modernbert.modeling_modernbert import ModernBertEncoderLayer

# Local layers take the banded path from this many windows of tokens on (384 at ModernBERT's window of
# 64); each query then reads 3 x window keys (192), 1.5x the 2 x window + 1 it may see.
BANDED_FROM = 6


def reproduces_encoder(encoder: ModernBertModel) -> bool:
    """True when `encoder_hidden_states` computes what this encoder's own forward computes: SDPA
    attention and default RoPE on every layer type (other RoPE variants rescale per length)."""
    config = encoder.config
    if config._attn_implementation != "sdpa":
        return False
    rope = cast(dict[str, Any], config.rope_parameters or {})
    return all(
        (rope.get(layer_type) or {}).get("rope_type", "default") == "default"
        for layer_type in set(config.layer_types or ())
    )


def supports_fast_forward(encoder: ModernBertModel) -> bool:
    """True when `encoder_hidden_states` may replace `encoder(...)` here: it reproduces the encoder, the
    encoder is in eval mode and no gradient is wanted.

    Under autograd (training, or a frozen encoder inside a graph) transformers' forward stays in charge:
    this one is written for inference and is not checked against it for gradients.
    """
    return not encoder.training and not torch.is_grad_enabled() and reproduces_encoder(encoder)


def rotary_tables(
    encoder: ModernBertModel, layer_type: str, length: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """float32 (L, 1, 1, Dh) cos and sign-folded sin for `apply_rotary` on (B, L, 2, H, Dh) inputs.

    The angles are transformers' (float32 positions times float32 inverse frequencies); the sin table
    carries rotate-half's sign, so the rotation is x * cos + roll(x, Dh / 2) * sin.
    """
    rotary = encoder.rotary_emb
    inv_freq = getattr(rotary, f"{layer_type}_inv_freq").to(device=device, dtype=torch.float32)  # (Dh/2,)
    scaling = float(getattr(rotary, f"{layer_type}_attention_scaling"))
    positions = torch.arange(length, device=device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None]  # (L, Dh/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (L, Dh)
    cos = angles.cos() * scaling
    sin = angles.sin() * scaling
    half = sin.shape[-1] // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos[:, None, None], signed_sin[:, None, None]


def apply_rotary(qk: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """RoPE on stacked queries and keys (B, L, 2, H, Dh), computed in float32 as transformers does."""
    x = qk.float()
    rolled = torch.roll(x, x.shape[-1] // 2, dims=-1)  # [x2, x1]: with the signed sin, rotate_half(x) * sin
    return torch.addcmul(x * cos, rolled, signed_sin).to(qk.dtype)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor, window: int) -> Tensor:
    """Bidirectional local attention, |i - j| <= window, on (B, L, H, Dh) inputs; (B, L, H, Dh) out.

    Queries go in chunks of `window`; chunk c sees its own keys and its two neighbour chunks' (3 x window
    keys, built by slicing), a band mask keeps each query to its own window
    and `key_valid` (B, L) drops padding. Padded query rows keep their band unfiltered so that no row is
    fully masked: torch's CPU kernels return zeros for such a row, but not every SDPA kernel promises
    to, and a NaN there would reach real rows in the next layer (a zero attention weight times NaN).
    Their outputs are never read.
    """
    batch, length, heads, dim = q.shape
    chunks = (length + window - 1) // window
    tail = chunks * window - length

    def framed(x: Tensor, before: int, after: int) -> Tensor:  # (B, L, ...) -> (B, L', window, ...)
        pads = (0, 0) * (x.dim() - 2) + (before, after)
        padded = F.pad(x, pads)
        return padded.view(batch, -1, window, *x.shape[2:])

    def neighbours(x: Tensor) -> Tensor:  # (B, chunks + 2, window, ...) -> (B, chunks, 3 window, ...)
        return torch.cat((x[:, :-2], x[:, 1:-1], x[:, 2:]), dim=2)

    def keys(x: Tensor) -> Tensor:  # (B, L, H, Dh) -> (B * chunks, H, 3 window, Dh)
        return (
            neighbours(framed(x, window, tail + window))
            .reshape(batch * chunks, 3 * window, heads, dim)
            .transpose(1, 2)
        )

    queries = framed(q, 0, tail).reshape(batch * chunks, window, heads, dim).transpose(1, 2)
    valid = neighbours(framed(key_valid, window, tail + window))  # (B, chunks, 3 window)
    query_valid = framed(key_valid, 0, tail)  # (B, chunks, window)
    i = torch.arange(window, device=q.device)[:, None]
    j = torch.arange(3 * window, device=q.device)[None]
    band = (j - i - window).abs() <= window  # (window, 3 window): key j of the span is query i's neighbour
    keep = band & (valid[:, :, None, :] | ~query_valid[..., None])  # (B, chunks, window, 3 window)
    out = F.scaled_dot_product_attention(
        queries, keys(k), keys(v), attn_mask=keep.reshape(batch * chunks, 1, window, 3 * window)
    )  # (B * chunks, H, window, Dh)
    return out.transpose(1, 2).reshape(batch, chunks * window, heads, dim)[:, :length]


def local_attention(q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor, window: int) -> Tensor:
    """|i - j| <= window attention on (B, L, H, Dh): banded on long inputs, one masked SDPA call on short.

    The band costs copies of K and V (each key sits in three chunks' spans) and a chunked mask, which
    pay for themselves from about twice the span (BANDED_FROM windows): measured on CPU for the `mini`
    preset, whole forward pass, equal at 256 tokens, 1.06-1.15x at 512 and 1.5-1.8x at 2048.
    """
    length = q.shape[1]
    if length >= BANDED_FROM * window:
        return banded_attention(q, k, v, key_valid, window)
    positions = torch.arange(length, device=q.device)
    near = (positions[:, None] - positions[None]).abs() <= window  # (L, L)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=near & key_valid[:, None, None, :]
    )  # (B, H, L, Dh)
    return out.transpose(1, 2)


def encoder_hidden_states(encoder: ModernBertModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(B, L) right-padded ids and mask to (B, L, D) final hidden states, as `encoder(...)` gives them.

    Rows at padded positions hold finite values that mean nothing; pooling must ignore them.
    """
    config = encoder.config
    batch, length = input_ids.shape
    heads = int(config.num_attention_heads)
    window = int(config.sliding_window)
    key_valid = attention_mask.bool()  # (B, L)
    global_mask = None if bool(key_valid.all()) else key_valid[:, None, None, :]  # (B, 1, 1, L)
    tables = {t: rotary_tables(encoder, t, length, input_ids.device) for t in set(config.layer_types or ())}

    hidden = encoder.embeddings(input_ids=input_ids)  # (B, L, D)
    for module in encoder.layers:
        layer = cast(ModernBertEncoderLayer, module)
        attention = layer.attn
        qkv = attention.Wqkv(layer.attn_norm(hidden)).view(batch, length, 3, heads, attention.head_dim)
        qk = apply_rotary(qkv[:, :, :2], *tables[layer.attention_type])  # (B, L, 2, H, Dh)
        q, k, v = qk[:, :, 0], qk[:, :, 1], qkv[:, :, 2]  # (B, L, H, Dh)
        if layer.attention_type == "sliding_attention":
            context = local_attention(q, k, v, key_valid, window)
        else:
            context = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=global_mask
            ).transpose(1, 2)
        hidden = hidden + attention.Wo(context.reshape(batch, length, -1))  # context (B, L, H, Dh)
        hidden = hidden + layer.mlp(layer.mlp_norm(hidden))
    normed: Tensor = encoder.final_norm(hidden)
    return normed
