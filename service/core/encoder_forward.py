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
- rotary embeddings go on queries and keys in one pass (four elementwise operators, each reading the
  half-precision input once, instead of about sixteen), with the tables of transformers' own rotary
  module.

Outputs match transformers' forward to float32 rounding (tests/core/test_encoder_forward.py). Only the
configurations that code reproduces take this path (`supports_fast_forward`): SDPA attention, default
RoPE, eval mode, no autograd. Training, other attention implementations and the ONNX export use
transformers' forward.

`packed_hidden_states` is the same layer loop over a padding-free batch: documents concatenated into one
(T,) row, `cu_seq_lens` offsets, positions restarting per document, and a varlen attention kernel that
keeps each document to itself (`window_size` for local layers). The kernel is torch's own FlashAttention-2
varlen (`torch.nn.attention.varlen`, torch >= 2.10; no flash-attn package, which has no binary wheel) on
CUDA, or `reference_varlen_attention` (per-document SDPA, any device) to check the layout against.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import ModernBertModel
from transformers.models.modernbert.modeling_modernbert import ModernBertEncoderLayer

# Local layers take the banded path from this many windows of tokens on (384 at ModernBERT's window of
# 64); each query then reads 3 x window keys (192), 1.5x the 2 x window + 1 it may see.
BANDED_FROM = 6


def supports_fast_forward(encoder: ModernBertModel) -> bool:
    """True when `encoder_hidden_states` may replace `encoder(...)` here: SDPA attention and default RoPE
    on every layer type (other RoPE variants rescale per length), a sliding window of at least one
    position, eval mode, and no gradient wanted.

    Under autograd (training, or a frozen encoder inside a graph) transformers' forward stays in charge:
    this one is written for inference and is not checked against it for gradients.
    """
    config = encoder.config
    if encoder.training or torch.is_grad_enabled() or config._attn_implementation != "sdpa":
        return False
    local = getattr(config, "local_attention", None)
    if not isinstance(local, int) or local // 2 < 1:  # an empty sliding window: the banded path divides by it
        return False
    rope = cast(dict[str, Any], config.rope_parameters or {})
    return all(
        (rope.get(layer_type) or {}).get("rope_type", "default") == "default"
        for layer_type in set(config.layer_types or ())
    )


def rotary_tables(
    encoder: ModernBertModel, layer_type: str, hidden: Tensor, positions: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(L, 1, 1, Dh / 2) float32 cos and sin for `apply_rotary` on (B, L, 2, H, Dh) inputs.

    The tables are transformers' own (its rotary module, in `hidden`'s dtype, as its forward gets them),
    widened to float32 for the arithmetic; one half of each, since default RoPE repeats its frequencies
    over both halves of a head (`cat((freqs, freqs))`, the only kind `supports_fast_forward` admits).
    `positions` (1, L) default to 0..L-1; a packed row passes each token's position in its document.
    """
    if positions is None:
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)  # (1, L)
    cos, sin = encoder.rotary_emb(hidden, positions, layer_type)  # (1, L, Dh) each
    half = sin.shape[-1] // 2
    return cos[0, :, None, None, :half].float(), sin[0, :, None, None, :half].float()


def apply_rotary(qk: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on stacked queries and keys (B, L, 2, H, Dh), in float32 as transformers computes it.

    transformers' x * cos + rotate_half(x) * sin is, per half of a head, x1 * cos - x2 * sin and
    x2 * cos + x1 * sin. Written that way, each half is two kernels that read the half-precision input
    directly and round once into the output (float32 inside, as transformers: the same bfloat16 values,
    bit for bit), where a widened copy, a roll, a multiply, a multiply-add and a narrowing copy moved
    about 2.9x the bytes (40 against 14 per query-or-key element in bfloat16). That matters where the
    rotary is memory-bound: on a GPU, at 64K tokens a pass, it read and wrote ~4 GB a layer. On CPU
    (float32, out of cache) 3.9x faster at 8 x 512 tokens x 12 heads, 2.4x at 32 x 512; the mini
    preset's whole forward pass on CPU is unchanged (its rotary fits the cache; bfloat16 within 2%).
    """
    half = qk.shape[-1] // 2
    x1, x2 = qk[..., :half], qk[..., half:]
    if torch.compiler.is_compiling():  # inductor fuses this form into one kernel; `out=` views break graphs
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(qk.dtype)
    out = torch.empty(qk.shape, dtype=qk.dtype, device=qk.device)
    torch.addcmul(x1 * cos, x2, sin, value=-1, out=out[..., :half])
    torch.addcmul(x2 * cos, x1, sin, out=out[..., half:])
    return out


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA on (B, L, H, Dh) queries, keys and values; (B, L, H, Dh) out."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    )
    return out.transpose(1, 2)


def _framed(x: Tensor, window: int, before: int, after: int) -> Tensor:
    """(B, L, ...) padded along L by `before`/`after` and cut into windows: (B, L' / window, window, ...)."""
    padded = F.pad(x, (0, 0) * (x.dim() - 2) + (before, after))
    return padded.view(x.shape[0], -1, window, *x.shape[2:])


def _neighbours(x: Tensor) -> Tensor:
    """(B, chunks + 2, window, ...) to (B, chunks, 3 window, ...): each chunk with the one on either side."""
    return torch.cat((x[:, :-2], x[:, 1:-1], x[:, 2:]), dim=2)


def window_mask(key_valid: Tensor, window: int) -> Tensor:
    """(B, 1, L, L) boolean mask of |i - j| <= window over real keys, for one SDPA call on short inputs.

    A padded query row keeps its window unfiltered, as in `band_mask`: one more than `window` positions
    past a document's last token would otherwise see no key at all, and a kernel that answers such a row
    with NaN (not every one promises zeros) would pass it to real rows in the next layer."""
    positions = torch.arange(key_valid.shape[1], device=key_valid.device)
    near = (positions[:, None] - positions[None]).abs() <= window  # (L, L)
    return near & (key_valid[:, None, None, :] | ~key_valid[:, None, :, None])


def band_mask(key_valid: Tensor, window: int) -> Tensor:
    """(B * chunks, 1, window, 3 window) boolean mask for `banded_attention`; chunks = ceil(L / window).

    Query i of a chunk may see key j of its 3-chunk span when |j - i - window| <= window and the key is
    real. Padded query rows keep their band unfiltered so that no row is fully masked: torch's CPU
    kernels return zeros for such a row, but not every SDPA kernel promises to, and a NaN there would
    reach real rows in the next layer (a zero attention weight times NaN). Their outputs are never read.
    """
    length = key_valid.shape[1]
    tail = -length % window
    valid = _neighbours(_framed(key_valid, window, window, tail + window))  # (B, chunks, 3 window)
    query_valid = _framed(key_valid, window, 0, tail)  # (B, chunks, window)
    i = torch.arange(window, device=key_valid.device)[:, None]
    j = torch.arange(3 * window, device=key_valid.device)[None]
    band = (j - i - window).abs() <= window  # (window, 3 window)
    keep = band & (valid[:, :, None, :] | ~query_valid[..., None])  # (B, chunks, window, 3 window)
    return keep.reshape(-1, 1, window, 3 * window)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, window: int) -> Tensor:
    """Bidirectional local attention, |i - j| <= window, on (B, L, H, Dh) inputs; (B, L, H, Dh) out.

    Queries go in chunks of `window`; chunk c sees its own keys and its two neighbour chunks' (3 x window
    keys, built by slicing); `mask` is `band_mask(key_valid, window)`, which keeps each query to its own
    window and drops padding.
    """
    batch, length, heads, dim = q.shape
    tail = -length % window
    chunks = (length + tail) // window

    def spans(x: Tensor) -> Tensor:  # (B, L, H, Dh) -> (B * chunks, H, 3 window, Dh)
        framed = _neighbours(_framed(x, window, window, tail + window))  # (B, chunks, 3 window, H, Dh)
        return framed.reshape(batch * chunks, 3 * window, heads, dim).transpose(1, 2)

    queries = _framed(q, window, 0, tail).reshape(batch * chunks, window, heads, dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        queries, spans(k), spans(v), attn_mask=mask
    )  # (B * chunks, H, window, Dh)
    return out.transpose(1, 2).reshape(batch, chunks * window, heads, dim)[:, :length]


def first_position_prefixes(layer_types: Sequence[str], window: int, length: int) -> list[int]:
    """Per layer, how many leading positions it must compute for position 0's final state to be exact.

    Every layer up to the last global one needs the whole length. After it, local layers only: the last
    one's position 0 reads keys 0..window, which the layer before computes correctly from keys
    0..2 x window, and so on back. So the k-th local layer from the end runs on the first
    1 + k x window positions (for ModernBERT's window of 64 and a 256-token document, the last two
    layers of the `mini` preset run on 129 and 65 positions).
    """
    prefixes = [length] * len(layer_types)
    needed = 1
    for index in reversed(range(len(layer_types))):
        if layer_types[index] != "sliding_attention":
            break
        needed += window
        prefixes[index] = min(length, needed)
    return prefixes


def encoder_hidden_states(
    encoder: ModernBertModel, input_ids: Tensor, attention_mask: Tensor, *, first_only: bool = False
) -> Tensor:
    """(B, L) right-padded ids and mask to (B, L, D) final hidden states, as `encoder(...)` gives them.

    Rows at padded positions hold finite values that mean nothing; pooling must ignore them. With
    `first_only` (CLS pooling) only position 0's state is wanted: the trailing local layers then run on
    the prefixes `first_position_prefixes` gives, and the result is (B, P, D) of which only row 0 is
    exact (the mini preset's forward pass costs about a fifth less at 256 tokens).
    """
    config = encoder.config
    batch, length = input_ids.shape
    heads = int(config.num_attention_heads)
    window = int(config.sliding_window)
    layer_types = [cast(ModernBertEncoderLayer, module).attention_type for module in encoder.layers]
    prefixes = (
        first_position_prefixes(layer_types, window, length) if first_only else [length] * len(layer_types)
    )
    key_valid = attention_mask.bool()  # (B, L)
    global_mask = None if bool(key_valid.all()) else key_valid[:, None, None, :]  # (B, 1, 1, L)

    def local_masks(valid: Tensor) -> tuple[bool, Tensor]:
        # The band costs copies of K and V (each key sits in three chunks' spans) and a chunked mask,
        # which pay for themselves from about twice the span: measured on CPU for the `mini` preset,
        # whole forward pass, equal at 256 tokens, 1.06-1.15x at 512 and 1.5-1.8x at 2048. Below, one
        # masked SDPA call.
        banded = valid.shape[1] >= BANDED_FROM * window
        return banded, band_mask(valid, window) if banded else window_mask(valid, window)

    banded, local_mask = local_masks(key_valid)
    hidden = encoder.embeddings(input_ids=input_ids)  # (B, L, D)
    tables = {t: rotary_tables(encoder, t, hidden) for t in set(config.layer_types or ())}
    for module, prefix in zip(encoder.layers, prefixes, strict=True):
        layer = cast(ModernBertEncoderLayer, module)
        if prefix < length:  # only local layers follow: a shorter run keeps position 0 exact
            length = prefix
            hidden, key_valid = hidden[:, :length], key_valid[:, :length]
            banded, local_mask = local_masks(key_valid)
        attention = layer.attn
        qkv = attention.Wqkv(layer.attn_norm(hidden)).view(batch, length, 3, heads, attention.head_dim)
        cos, sin = tables[layer.attention_type]
        qk = apply_rotary(qkv[:, :, :2], cos[:length], sin[:length])  # (B, L, 2, H, Dh)
        q, k, v = qk[:, :, 0], qk[:, :, 1], qkv[:, :, 2]  # (B, L, H, Dh)
        if layer.attention_type != "sliding_attention":
            context = attend(q, k, v, global_mask)
        elif banded:
            context = banded_attention(q, k, v, local_mask, window)
        else:
            context = attend(q, k, v, local_mask)
        hidden = hidden + attention.Wo(context.reshape(batch, length, -1))  # context (B, L, H, Dh)
        hidden = hidden + layer.mlp(layer.mlp_norm(hidden))
    normed: Tensor = encoder.final_norm(hidden)
    return normed


# (T, H, Dh) queries, keys and values of a packed row; (N+1,) int32 document offsets; the longest
# document's length; the half-window of a local layer (keys with |i - j| <= window) or -1 for a global
# one. Returns (T, H, Dh). No document may see another's keys.
VarlenAttention = Callable[[Tensor, Tensor, Tensor, Tensor, int, int], Tensor]


def torch_varlen_attention() -> VarlenAttention | None:
    """torch's FlashAttention-2 varlen kernel as a `VarlenAttention`, or None when this torch lacks it.

    It needs `window_size` (torch 2.10 on) for ModernBERT's local layers, CUDA on an Ampere or newer GPU,
    and float16 or bfloat16; the runner probes it once on its device before trusting it.
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    if "window_size" not in inspect.signature(varlen_attn).parameters:
        return None

    def attend(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, longest: int, window: int) -> Tensor:
        out = varlen_attn(q, k, v, offsets, offsets, longest, longest, window_size=(window, window))
        return cast(Tensor, out)

    return attend


def reference_varlen_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, longest: int, window: int
) -> Tensor:
    """`VarlenAttention` by one SDPA call per document (with the window mask on local layers).

    What the kernel computes, on any device and dtype: the packed path's CPU form and its test oracle.
    One call per document makes it slow for many short documents; it is not the CPU's default path.
    """
    out = torch.empty_like(q)
    bounds = offsets.tolist()
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        mask = None
        if 0 <= window < end - start - 1:
            positions = torch.arange(end - start, device=q.device)
            mask = (positions[:, None] - positions[None]).abs() <= window  # (n, n)
        doc = attend(q[None, start:end], k[None, start:end], v[None, start:end], mask)  # (1, n, H, Dh)
        out[start:end] = doc[0]
    return out


def packed_positions(cu_seq_lens: Tensor) -> tuple[Tensor, Tensor]:
    """(N+1,) offsets to (T,) each token's document index and (T,) its position within that document."""
    lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).long()  # (N,)
    document = torch.repeat_interleave(torch.arange(len(lengths), device=cu_seq_lens.device), lengths)
    starts = cu_seq_lens[:-1].long()[document]  # (T,)
    return document, torch.arange(int(cu_seq_lens[-1]), device=cu_seq_lens.device) - starts


class PackedCut(NamedTuple):
    """A packed row shortened before one of the trailing local layers, for CLS pooling's position 0.

    The packed form of `first_position_prefixes`: each document keeps its first min(length, prefix)
    tokens. Built on the host (`packed_first_position_cuts`) so the forward pass never reads sizes
    back from the device.
    """

    keep: Tensor  # (T',) int64 rows of the previous layer's row that this layer computes
    cu_seq_lens: Tensor  # (N+1,) int32 document offsets in the shorter row
    max_length: int  # its longest document


def packed_first_position_cuts(
    lengths: Sequence[int], layer_types: Sequence[str], window: int
) -> list[PackedCut]:
    """One `PackedCut` per local layer after the last global one (oldest first), for documents of these
    lengths packed in this order; none when the model ends on a global layer (the `base` preset does).

    Every trailing layer gets its cut even where nothing is dropped (all documents shorter than its
    prefix), so a compiled forward sees the same structure for every batch.
    """
    trailing = len(layer_types)
    while trailing and layer_types[trailing - 1] == "sliding_attention":
        trailing -= 1
    if trailing == 0 or not lengths:  # local layers only: no global layer bounds what position 0 needs
        return []
    prefixes = first_position_prefixes(layer_types, window, max(lengths))[trailing:]
    current = np.asarray(lengths, dtype=np.int64)  # (N,)
    cuts = []
    for prefix in prefixes:
        kept = np.minimum(current, prefix)  # (N,)
        starts = np.cumsum(current) - current  # (N,): each document's first row in the previous row
        offsets = np.concatenate(([0], np.cumsum(kept)))  # (N+1,)
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], kept)  # (T',): position in its document
        keep = np.repeat(starts, kept) + within  # (T',)
        cuts.append(
            PackedCut(
                torch.from_numpy(keep),
                torch.from_numpy(offsets.astype(np.int32)),
                int(kept.max()),
            )
        )
        current = kept
    return cuts


def packed_hidden_states(
    encoder: ModernBertModel,
    input_ids: Tensor,
    positions: Tensor,
    cu_seq_lens: Tensor,
    max_length: int,
    attention: VarlenAttention,
    cuts: Sequence[PackedCut] = (),
) -> Tensor:
    """(T,) concatenated ids, (T,) positions and (N+1,) int32 offsets to (T, D) final hidden states.

    Each document sees what it would see alone: its positions restart at 0 (RoPE; `packed_positions`),
    and `attention` keeps its queries to its own keys. No row of padding is computed anywhere, so a
    batch costs its real tokens (the runner's token budget counts them). Nothing here reads a device
    value back to the host: the runner builds positions and offsets on the CPU with the ids.

    With `cuts` (`packed_first_position_cuts`, on this device; CLS pooling) the last len(cuts) layers
    run on each document's leading tokens only, as `encoder_hidden_states(first_only=True)` does, and
    the result is (T', D) rows at the last cut's offsets of which only each document's first is exact.
    """
    config = encoder.config
    total = input_ids.shape[0]
    heads = int(config.num_attention_heads)
    window = int(config.sliding_window)
    first_cut = len(encoder.layers) - len(cuts)

    hidden = encoder.embeddings(input_ids=input_ids.unsqueeze(0))  # (1, T, D)
    tables = {
        t: rotary_tables(encoder, t, hidden, positions.unsqueeze(0)) for t in set(config.layer_types or ())
    }
    hidden = hidden[0]  # (T, D)
    for index, module in enumerate(encoder.layers):
        layer = cast(ModernBertEncoderLayer, module)
        if index >= first_cut:  # a trailing local layer: each document's leading tokens only
            cut = cuts[index - first_cut]
            hidden, total = hidden[cut.keep], cut.keep.shape[0]
            tables = {t: (cos[cut.keep], sin[cut.keep]) for t, (cos, sin) in tables.items()}
            cu_seq_lens, max_length = cut.cu_seq_lens, cut.max_length
        block = layer.attn
        qkv = block.Wqkv(layer.attn_norm(hidden)).view(total, 3, heads, block.head_dim)
        qk = apply_rotary(qkv[:, :2], *tables[layer.attention_type])  # (T, 2, H, Dh)
        span = window if layer.attention_type == "sliding_attention" else -1
        context = attention(qk[:, 0], qk[:, 1], qkv[:, 2], cu_seq_lens, max_length, span)  # (T, H, Dh)
        hidden = hidden + block.Wo(context.reshape(total, -1))
        hidden = hidden + layer.mlp(layer.mlp_norm(hidden))
    normed: Tensor = encoder.final_norm(hidden)
    return normed
