"""The inference forward pass: the same hidden states as transformers' forward, banded or not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

from service.core.encoder_forward import (
    BANDED_FROM,
    VarlenAttention,
    apply_rotary,
    attend,
    band_mask,
    banded_attention,
    encoder_hidden_states,
    first_position_prefixes,
    packed_first_position_cuts,
    packed_hidden_states,
    packed_positions,
    reference_varlen_attention,
    rotary_tables,
    supports_fast_forward,
    torch_varlen_attention,
    window_mask,
)
from service.core.modeling import HtmlEncoderModel
from tests.factories.checkpoint import build_tiny_model

# The tiny preset's window is 4 (local_attention 8): the banded path starts at 24 tokens.
BANDED = BANDED_FROM * 4


def padded_batch(lengths: list[int], vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(5, vocab, (n,), generator=generator)
        mask[row, :n] = 1
    return ids, mask


def reference(model: HtmlEncoderModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize(
    "lengths",
    [
        [3],  # one short document, no padding
        [BANDED - 4, 13, 2],  # padded, below the band
        [BANDED, BANDED - 1, 5],  # at the band's threshold, one row just under
        [400, 397, 131, 5],  # banded, a tail chunk, rows whose last chunks are all padding
        [256, 256],  # banded, a whole number of chunks, no padding
    ],
)
def test_matches_transformers_forward_on_every_real_position(lengths: list[int]) -> None:
    model = build_tiny_model(heads=False, max_length=512)
    ids, mask = padded_batch(lengths, model.config.vocab_size)
    expected = reference(model, ids, mask)
    with torch.inference_mode():
        got = encoder_hidden_states(model.encoder, ids, mask)
    assert got.shape == expected.shape
    assert torch.isfinite(got).all()  # padded rows too: NaN there would leak into real rows
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lengths", [[3], [BANDED - 4, 13, 2], [400, 397, 131, 5], [256, 256], [9, 8]])
@pytest.mark.parametrize("window", [4, 40])
def test_first_only_gives_transformers_first_position(lengths: list[int], window: int) -> None:
    """CLS pooling's shortcut: the trailing local layers on prefixes, position 0 still exact (a window
    of 40 makes the prefixes long enough for the banded path)."""
    model = build_tiny_model(heads=False, max_length=512, local_attention=2 * window)
    assert model.config.layer_types[-2:] == ["sliding_attention", "sliding_attention"]
    ids, mask = padded_batch(lengths, model.config.vocab_size)
    expected = reference(model, ids, mask)[:, 0]
    with torch.inference_mode():
        got = encoder_hidden_states(model.encoder, ids, mask, first_only=True)
    assert got.shape[1] == min(max(lengths), 1 + 1 * window)  # the last layer's prefix
    torch.testing.assert_close(got[:, 0], expected, atol=1e-5, rtol=1e-5)


def test_first_position_prefixes() -> None:
    mini = ["full_attention", "sliding_attention", "sliding_attention"] * 2
    assert first_position_prefixes(mini, 64, 256) == [256, 256, 256, 256, 129, 65]
    assert first_position_prefixes(mini, 64, 100) == [100, 100, 100, 100, 100, 65]
    assert first_position_prefixes(mini, 64, 40) == [40] * 6
    assert first_position_prefixes(mini[:4], 64, 256) == [256] * 4  # ends with a global layer
    assert first_position_prefixes(["sliding_attention"] * 3, 4, 50) == [13, 9, 5]


def test_banded_attention_equals_a_masked_full_attention() -> None:
    generator = torch.Generator().manual_seed(1)
    batch, heads, length, dim, window = 3, 2, 147, 8, 5
    q, k, v = (torch.randn(batch, length, heads, dim, generator=generator) for _ in range(3))
    valid = torch.ones(batch, length, dtype=torch.bool)
    valid[1, 100:] = False
    valid[2, 3:] = False  # whole chunks of padded queries: their rows must not be fully masked
    positions = torch.arange(length)
    near = (positions[:, None] - positions[None]).abs() <= window
    heads_first = (x.transpose(1, 2) for x in (q, k, v))
    expected = F.scaled_dot_product_attention(*heads_first, attn_mask=near & valid[:, None, None, :])
    expected = expected.transpose(1, 2)  # (B, L, H, Dh)
    got = banded_attention(q, k, v, band_mask(valid, window), window)
    assert torch.isfinite(got).all()
    keep = valid[:, :, None, None].expand_as(got)
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-6, rtol=1e-5)


def test_the_short_input_window_mask_leaves_no_row_without_a_key() -> None:
    # Padding more than `window` past a document's end left its query rows fully masked: a NaN there
    # from a kernel that does not zero such rows would reach real rows in the next layer.
    window = 2
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 3:] = False
    mask = window_mask(valid, window)
    assert mask.any(-1).all()
    positions = torch.arange(12)
    near = (positions[:, None] - positions[None]).abs() <= window
    real = valid[:, None, :, None].expand_as(mask)
    assert torch.equal(mask[real], (near & valid[:, None, None, :])[real])  # real rows see what they saw


def test_embed_takes_the_fast_path_only_for_inference() -> None:
    model = build_tiny_model(heads=False, max_length=512)
    ids, mask = padded_batch([300, 180], model.config.vocab_size, seed=2)
    with torch.inference_mode():
        assert supports_fast_forward(model.encoder)
        fast = model.embed(ids, mask)
        slow = model.embed(ids, mask, fast=False)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert not supports_fast_forward(model.encoder)  # autograd on: transformers' forward
    model.train()
    with torch.inference_mode():
        assert not supports_fast_forward(model.encoder)
    model.eval()
    model.encoder.set_attn_implementation("eager")
    with torch.inference_mode():
        assert not supports_fast_forward(model.encoder)


def test_an_empty_sliding_window_takes_transformers_forward() -> None:
    """local_attention 1 (a window of local_attention // 2 = 0, which load refuses) made every fast
    forward divide by zero; `supports_fast_forward` no longer claims such an encoder."""
    model = build_tiny_model(heads=False, max_length=512)
    model.encoder.config.local_attention = 1
    ids, mask = padded_batch([BANDED + 7, 5], model.config.vocab_size, seed=3)
    with torch.inference_mode():
        assert not supports_fast_forward(model.encoder)
        assert model.embed(ids, mask).shape == (2, model.embedding_dim)


def test_bfloat16_stays_as_close_to_float32_as_transformers_bfloat16() -> None:
    model = build_tiny_model(heads=False, max_length=512)
    ids, mask = padded_batch([400, 250], model.config.vocab_size, seed=3)
    exact = reference(model, ids, mask)[:, 0]
    model.place("cpu", torch.bfloat16)
    theirs = reference(model, ids, mask)[:, 0].float()
    with torch.inference_mode():
        ours = encoder_hidden_states(model.encoder, ids, mask)[:, 0].float()
    their_cos = F.cosine_similarity(theirs, exact).min()
    our_cos = F.cosine_similarity(ours, exact).min()
    assert our_cos > 0.999
    assert our_cos >= their_cos - 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_gives_transformers_values(dtype: torch.dtype) -> None:
    """The same values as transformers' RoPE on strided queries and keys: bit for bit in bfloat16 (both
    compute in float32 and round once), to float32 rounding otherwise (a fused multiply-add)."""
    model = build_tiny_model(heads=False, max_length=512)
    model.place("cpu", dtype)
    encoder = model.encoder
    torch.manual_seed(5)
    qkv = torch.randn(3, 70, 3, 2, 16).to(dtype)  # (B, L, 3, H, Dh): queries and keys as strided views
    positions = torch.arange(70).unsqueeze(0)
    for layer_type in sorted(set(encoder.config.layer_types)):
        cos, sin = encoder.rotary_emb(qkv, positions, layer_type)  # (1, L, Dh), as transformers' forward
        q, k = apply_rotary_pos_emb(qkv[:, :, 0], qkv[:, :, 1], cos, sin, unsqueeze_dim=2)
        ours = apply_rotary(qkv[:, :, :2], *rotary_tables(encoder, layer_type, qkv[:, :, 0, 0]))
        assert ours.dtype == dtype and ours.shape == (3, 70, 2, 2, 16)
        if dtype == torch.bfloat16:
            assert torch.equal(ours[:, :, 0], q) and torch.equal(ours[:, :, 1], k)
        else:
            torch.testing.assert_close(ours[:, :, 0], q, rtol=0, atol=1e-6)
            torch.testing.assert_close(ours[:, :, 1], k, rtol=0, atol=1e-6)


def test_rotary_compiles_into_one_graph() -> None:
    """The runner's compiled varlen forward must capture the rotary whole (`out=` into views, the eager
    form, is a graph break for torch.compile, so traced code takes a fused form): same values."""
    model = build_tiny_model(heads=False)
    torch.manual_seed(6)
    qkv = torch.randn(2, 30, 3, 2, 16)
    tables = rotary_tables(model.encoder, "full_attention", qkv[:, :, 0, 0])
    compiled = torch.compile(apply_rotary, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(qkv[:, :, :2], *tables), apply_rotary(qkv[:, :, :2], *tables))


def offsets_of(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_packed_positions_restart_at_each_document() -> None:
    document, positions = packed_positions(offsets_of([3, 1, 2]))
    assert document.tolist() == [0, 0, 0, 1, 2, 2]
    assert positions.tolist() == [0, 1, 2, 0, 0, 1]


@pytest.mark.parametrize("window", [-1, 0, 4])
def test_reference_varlen_attention_is_one_block_diagonal_banded_attention(window: int) -> None:
    """The oracle against an independent one: the whole packed row in one SDPA call whose mask allows
    only same-document keys within the window."""
    lengths = [1, 9, 30, 4]
    offsets = offsets_of(lengths)
    generator = torch.Generator().manual_seed(window + 2)
    q, k, v = (torch.randn(sum(lengths), 3, 8, generator=generator) for _ in range(3))  # (T, H, Dh)
    document, positions = packed_positions(offsets)
    allowed = document[:, None] == document[None]  # (T, T)
    if window >= 0:
        allowed &= (positions[:, None] - positions[None]).abs() <= window
    expected = attend(q[None], k[None], v[None], allowed)[0]
    got = reference_varlen_attention(q, k, v, offsets, max(lengths), window)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_torch_varlen_attention_is_none_or_takes_a_window() -> None:
    """torch >= 2.10 has the kernel (CUDA only); an older torch gives None, and the runner pads."""
    kernel = torch_varlen_attention()
    assert kernel is None or callable(kernel)


@pytest.mark.parametrize("lengths", [[3], [BANDED + 9, 2, 17], [130, 1, 64, 64, 5]])
def test_packed_forward_gives_each_document_its_padded_hidden_states(lengths: list[int]) -> None:
    """Packing changes nothing a document sees: the packed row's hidden states equal the padded batch's
    at every real position (and so transformers' forward's), under the per-document kernel."""
    model = build_tiny_model(heads=False, max_length=512)
    ids, mask = padded_batch(lengths, model.config.vocab_size)
    flat = ids[mask.bool()]  # (T,): row-major, so documents in order
    kernel: VarlenAttention = reference_varlen_attention
    offsets = offsets_of(lengths)
    _, positions = packed_positions(offsets)
    with torch.inference_mode():
        packed = packed_hidden_states(model.encoder, flat, positions, offsets, max(lengths), kernel)
    expected = reference(model, ids, mask)[mask.bool()]  # (T, D)
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-5)


def test_packed_cuts_keep_each_documents_leading_tokens() -> None:
    mini = ["full_attention", "sliding_attention", "sliding_attention"] * 2
    cuts = packed_first_position_cuts([3, 200, 70], mini, 64)
    assert [c.cu_seq_lens.tolist() for c in cuts] == [[0, 3, 132, 202], [0, 3, 68, 133]]
    assert [c.max_length for c in cuts] == [129, 65]
    assert cuts[0].keep.tolist() == [0, 1, 2, *range(3, 132), *range(203, 273)]
    # The second cut indexes the first's row: document 1 now starts at row 3, document 2 at row 132.
    assert cuts[1].keep.tolist() == [0, 1, 2, *range(3, 68), *range(132, 197)]
    short = packed_first_position_cuts([5, 9], mini, 64)  # nothing to drop: identity cuts, same structure
    assert [c.keep.tolist() for c in short] == [list(range(14))] * 2
    assert packed_first_position_cuts([300], mini[:4], 64) == []  # ends on a global layer
    assert packed_first_position_cuts([300], ["sliding_attention"] * 2, 64) == []  # no global layer


@pytest.mark.parametrize("lengths", [[3], [BANDED + 9, 2, 17], [130, 1, 64, 64, 5], [9, 8]])
@pytest.mark.parametrize("window", [4, 40])
def test_packed_cuts_keep_each_documents_first_position_exact(lengths: list[int], window: int) -> None:
    """CLS pooling's shortcut on a packed row: position 0 of every document as transformers gives it,
    at the last cut's offsets (the same shortcut as `first_only` on padded batches)."""
    model = build_tiny_model(heads=False, max_length=512, local_attention=2 * window)
    layer_types = list(model.config.layer_types)
    assert layer_types[-2:] == ["sliding_attention", "sliding_attention"]
    ids, mask = padded_batch(lengths, model.config.vocab_size)
    offsets = offsets_of(lengths)
    _, positions = packed_positions(offsets)
    cuts = packed_first_position_cuts(lengths, layer_types, window)
    with torch.inference_mode():
        got = packed_hidden_states(
            model.encoder,
            ids[mask.bool()],
            positions,
            offsets,
            max(lengths),
            reference_varlen_attention,
            cuts,
        )
    assert got.shape[0] == sum(min(n, 1 + window) for n in lengths)  # the last layer's prefixes
    starts = cuts[-1].cu_seq_lens[:-1].long()
    torch.testing.assert_close(got[starts], reference(model, ids, mask)[:, 0], atol=1e-5, rtol=1e-5)


def test_a_kernel_that_lets_documents_mix_is_caught() -> None:
    """The check above has teeth: a kernel that ignores the document offsets changes the output."""
    model = build_tiny_model(heads=False, max_length=512)
    lengths = [20, 20]
    ids, mask = padded_batch(lengths, model.config.vocab_size)

    def mixing(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object) -> torch.Tensor:
        return attend(q[None], k[None], v[None], None)[0]

    offsets = offsets_of(lengths)
    _, positions = packed_positions(offsets)
    with torch.inference_mode():
        packed = packed_hidden_states(model.encoder, ids[mask.bool()], positions, offsets, 20, mixing)
    assert (packed - reference(model, ids, mask)[mask.bool()]).abs().max() > 1e-3


def test_the_packed_forward_compiles_to_one_graph_for_every_batch() -> None:
    """What the GPU's compiled mode (`TorchRunner(compile_backend=...)`) relies on: with the varlen
    kernel an opaque custom op (torch's is one on CUDA; here the reference kernel wrapped as one), the
    packed forward with its first-position cuts is captured once, without graph breaks, and batches of
    other sizes and lengths reuse that graph and give the eager forward's states."""
    from torch._dynamo.utils import counters

    @torch.library.custom_op("htmllm_test::varlen", mutates_args=())
    def kernel(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, longest: int, window: int
    ) -> torch.Tensor:
        return reference_varlen_attention(q, k, v, offsets, longest, window)

    @kernel.register_fake
    def _(q: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(q)

    model = build_tiny_model(heads=False, max_length=512)
    layer_types, window = list(model.config.layer_types), int(model.config.sliding_window)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(packed_hidden_states, backend="aot_eager", dynamic=True)
    for lengths in ([3, 70, 9], [33, 128, 5, 12], [200, 17], [6, 7, 8, 9, 10]):
        ids, mask = padded_batch(lengths, model.config.vocab_size)
        offsets = offsets_of(lengths)
        _, positions = packed_positions(offsets)
        cuts = packed_first_position_cuts(lengths, layer_types, window)
        args = (model.encoder, ids[mask.bool()], positions, offsets, max(lengths), kernel, cuts)
        with torch.inference_mode():
            torch.testing.assert_close(compiled(*args), packed_hidden_states(*args), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
