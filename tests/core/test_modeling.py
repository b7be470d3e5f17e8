"""The encoder wrapper: presets, special ids, pooling and heads."""

from __future__ import annotations

import json

import pytest
import torch

from service.core.encoder_forward import packed_first_position_cuts, reference_varlen_attention
from service.core.modeling import PRESETS, HeadSpec, HtmlEncoderModel, TaskHead, build_config
from tests.factories.checkpoint import build_tiny_model
from tests.factories.tokenizer import build_tiny_tokenizer


def test_base_preset_is_the_papers_encoder() -> None:
    base = PRESETS["base"]
    assert (base["num_hidden_layers"], base["num_attention_heads"], base["hidden_size"]) == (22, 12, 768)
    assert base["max_position_embeddings"] == 8192
    assert set(PRESETS) == {"base", "small", "mini", "tiny"}


def test_config_takes_all_five_special_ids_from_the_tokenizer() -> None:
    tok = build_tiny_tokenizer()
    config = build_config("mini", tok, max_length=256)
    special = tok.special_ids
    assert config.vocab_size == tok.vocab_size
    assert (config.pad_token_id, config.unk_token_id, config.cls_token_id) == (
        special.pad,
        special.unk,
        special.cls,
    )
    assert (config.sep_token_id, config.mask_token_id) == (special.sep, special.mask)
    assert (config.bos_token_id, config.eos_token_id) == (special.cls, special.sep)
    assert config.max_position_embeddings == 256


@pytest.mark.parametrize(
    ("preset", "kwargs"),
    [("huge", {}), ("tiny", {"num_attention_heads": 5}), ("tiny", {"max_length": 1})],
)
def test_impossible_configs_are_refused(preset: str, kwargs: dict[str, int]) -> None:
    max_length = kwargs.pop("max_length", 64)
    with pytest.raises(ValueError):
        build_config(preset, build_tiny_tokenizer(), max_length=max_length, **kwargs)


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "x", "kind": "ranking"},
        {"name": "x", "kind": "classification", "labels": ["only"]},
        {"name": "x", "kind": "regression", "labels": ["a", "b"]},
        {"name": "a/b", "kind": "regression"},
        {"name": "x", "kind": "classification", "labels": ["a", "a"]},
    ],
)
def test_head_spec_validation(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        HeadSpec(**bad)  # type: ignore[arg-type]


def test_forward_shapes_and_head_outputs() -> None:
    model = build_tiny_model()
    ids = torch.randint(5, model.config.vocab_size, (3, 20))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    with torch.inference_mode():
        emb, scores = model(ids, mask)
    assert emb.shape == (3, model.embedding_dim)
    probs = scores["page_type"]
    assert probs.shape == (3, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    assert scores["quality"].shape == (3,)


def test_cls_pooling_is_the_first_position_and_mean_ignores_padding() -> None:
    cls_model = build_tiny_model(heads=False)
    mean_model = build_tiny_model(heads=False, pooling="mean")
    mean_model.load_state_dict(cls_model.state_dict())
    ids = torch.randint(5, cls_model.config.vocab_size, (1, 10))
    with torch.inference_mode():
        hidden = cls_model.encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        torch.testing.assert_close(cls_model.embed(ids, torch.ones_like(ids)), hidden[:, 0])
        torch.testing.assert_close(mean_model.embed(ids, torch.ones_like(ids)), hidden.mean(dim=1))
        padded = torch.cat([ids, torch.zeros(1, 6, dtype=ids.dtype)], dim=1)
        mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 6, dtype=ids.dtype)], dim=1)
        torch.testing.assert_close(mean_model.embed(padded, mask), hidden.mean(dim=1), atol=1e-5, rtol=1e-5)


def test_head_input_width_must_match_the_encoder() -> None:
    model = build_tiny_model(heads=False)
    with pytest.raises(ValueError):
        model.add_head(TaskHead(HeadSpec(name="q", kind="regression"), model.embedding_dim + 1))
    with pytest.raises(ValueError):
        HtmlEncoderModel(model.encoder, pooling="max")


def test_packed_forward_refuses_attention_that_would_mix_documents() -> None:
    model = build_tiny_model(heads=False)
    ids = torch.randint(5, model.config.vocab_size, (12,))
    with pytest.raises(ValueError, match="flash_attention_2"):
        model.embed_packed(ids, torch.tensor([0, 5, 12], dtype=torch.int32), 7)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_embeddings_with_a_varlen_kernel_equal_padded_ones(pooling: str) -> None:
    model = build_tiny_model(heads=False, pooling=pooling)
    lengths = [12, 3, 30]
    generator = torch.Generator().manual_seed(1)
    docs = [torch.randint(5, model.config.vocab_size, (n,), generator=generator) for n in lengths]
    ids = torch.zeros(3, 30, dtype=torch.long)
    mask = torch.zeros(3, 30, dtype=torch.long)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
    offsets = torch.tensor([0, 12, 15, 45], dtype=torch.int32)
    with torch.inference_mode():
        packed = model.embed_packed(torch.cat(docs), offsets, 30, attention=reference_varlen_attention)
        padded = model.embed(ids, mask)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    cuts = packed_first_position_cuts(lengths, model.config.layer_types, int(model.config.sliding_window))
    with torch.inference_mode():
        if pooling == "mean":  # every position counts: a cut row would change the mean
            with pytest.raises(ValueError, match="CLS"):
                model.embed_packed(
                    torch.cat(docs), offsets, 30, attention=reference_varlen_attention, cuts=cuts
                )
            return
        shortcut = model.embed_packed(
            torch.cat(docs), offsets, 30, attention=reference_varlen_attention, cuts=cuts
        )
    torch.testing.assert_close(shortcut, padded, atol=1e-5, rtol=1e-5)


def test_packed_forward_with_a_kernel_refuses_training_mode() -> None:
    model = build_tiny_model(heads=False).train()
    ids = torch.randint(5, model.config.vocab_size, (12,))
    with pytest.raises(ValueError, match="eval mode"):
        model.embed_packed(
            ids, torch.tensor([0, 5, 12], dtype=torch.int32), 7, attention=reference_varlen_attention
        )


def test_head_spec_metrics_keep_counts_as_ints_through_json() -> None:
    """`cv_folds` and `pages` are counts: a round trip through htmllm.json (every later `heads train`
    rewrites the earlier heads) had turned them into 3.0 and 120.0."""
    spec = HeadSpec(
        name="t", kind="classification", labels=["a", "b"], hidden=8, metrics={"f1": 0.5, "pages": 120}
    )
    back = HeadSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back.metrics == {"f1": 0.5, "pages": 120}
    assert isinstance(back.metrics["pages"], int) and isinstance(back.metrics["f1"], float)


@pytest.mark.parametrize("local_attention", [1, 0, -2])
def test_a_sliding_window_that_holds_no_position_is_refused(local_attention: int) -> None:
    """local_attention // 2 is the window: below 2 it is empty, and the fast forward divided by it."""
    with pytest.raises(ValueError, match="local_attention"):
        build_config("tiny", build_tiny_tokenizer(), max_length=64, local_attention=local_attention)
    assert build_config("tiny", build_tiny_tokenizer(), max_length=64, local_attention=2).sliding_window == 1


@pytest.mark.parametrize(
    "name",
    [
        "a\x00b",
        "a\\b",
        "tab\there",
        "line\nbreak",
        "del\x7f",
        "nbsp\u00a0",
        "x" * 201,
        "é" * 101,
        "..",
        "topic.v2",
    ],
)
def test_head_names_no_file_system_can_hold_are_refused(name: str) -> None:
    """A head's name is its file's name: a NUL, a control character or a backslash, or more than 200
    bytes of UTF-8, had been accepted, and failed later as a raw OSError or ValueError (at save, after
    the encoder was written)."""
    with pytest.raises(ValueError, match="head name"):
        HeadSpec(name=name, kind="regression")
    with pytest.raises(ValueError, match="head name"):
        HeadSpec.from_dict({"name": name, "kind": "regression", "hidden": 8})


def test_head_names_up_to_200_bytes_of_printable_text_are_kept() -> None:
    for name in ("x" * 200, "é" * 100, "page type (v2)", "jazyk-čeština", "ランク"):
        assert HeadSpec(name=name, kind="regression").name == name


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_metrics_are_refused(value: float) -> None:
    """A NaN metric (spearman of a constant fold) had been written into htmllm.json as a bare NaN."""
    with pytest.raises(ValueError, match="metrics must be finite numbers"):
        HeadSpec(name="t", kind="regression", metrics={"spearman": value, "cv_folds": 5})
    assert HeadSpec(name="t", kind="regression", metrics={"pages": 10**400}).metrics["pages"] == 10**400
