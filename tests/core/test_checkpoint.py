"""The checkpoint directory: round trip, strict loading, AutoModel compatibility, adding heads."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from service.core.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointMeta,
    checkpoint_fingerprint,
    load_checkpoint,
    read_meta,
    save_checkpoint,
    save_heads,
)
from service.core.errors import ErrorCode
from service.core.modeling import HeadSpec, TaskHead
from service.core.prune import PRUNE_VERSION
from tests.factories.checkpoint import TINY_MAX_LENGTH, build_tiny_checkpoint, build_tiny_model
from tests.factories.tokenizer import build_tiny_tokenizer


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def test_round_trip_gives_identical_outputs(ckpt: Path) -> None:
    original = build_tiny_model()
    loaded = load_checkpoint(ckpt)
    assert loaded.meta.format_version == FORMAT_VERSION
    assert [h.name for h in loaded.meta.heads] == ["page_type", "quality"]
    assert loaded.meta.heads[0].labels == ["article", "listing", "other"]
    assert loaded.meta.tokenizer_sha256 == build_tiny_tokenizer().sha256
    assert loaded.meta.embedding_dim == original.embedding_dim
    ids, mask = _batch(original.config.vocab_size)
    with torch.inference_mode():
        emb_a, scores_a = original(ids, mask)
        emb_b, scores_b = loaded.model(ids, mask)
    torch.testing.assert_close(emb_a, emb_b, rtol=0, atol=0)
    for name in scores_a:
        torch.testing.assert_close(scores_a[name], scores_b[name], rtol=0, atol=0)


def test_every_file_is_readable_by_other_users(ckpt: Path) -> None:
    """A checkpoint mounted into a container is read by another uid."""
    files = [p for p in ckpt.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o044 == 0o044 for p in files), [
        (str(p.relative_to(ckpt)), oct(p.stat().st_mode)) for p in files
    ]


def test_automodel_loads_the_encoder(ckpt: Path) -> None:
    encoder = AutoModel.from_pretrained(ckpt)
    assert type(encoder).__name__ == "ModernBertModel"
    ours = load_checkpoint(ckpt).model
    ids, mask = _batch(ours.config.vocab_size)
    with torch.inference_mode():
        theirs = encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        torch.testing.assert_close(theirs, ours.embed(ids, mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json", "htmllm.json"])
def test_missing_file_is_a_clear_error(ckpt: Path, name: str) -> None:
    (ckpt / name).unlink()
    with pytest.raises(CheckpointError, match=name) as info:
        load_checkpoint(ckpt)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID


def test_a_path_that_is_no_directory_is_said_so(ckpt: Path, tmp_path: Path) -> None:
    """`--checkpoint model/model.safetensors` names a file that exists: not "does not exist"."""
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_checkpoint(ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_missing_head_file_is_a_clear_error(ckpt: Path) -> None:
    (ckpt / "heads" / "quality.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"quality\.safetensors"):
        load_checkpoint(ckpt)


def test_vocab_mismatch_is_a_clear_error(ckpt: Path) -> None:
    build_tiny_tokenizer(vocab_size=400).save(ckpt / "tokenizer.json")
    with pytest.raises(CheckpointError, match="vocab mismatch"):
        load_checkpoint(ckpt)


def test_swapped_tokenizer_of_the_same_size_is_caught_by_its_hash(ckpt: Path) -> None:
    data = json.loads((ckpt / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    # Swap two ordinary tokens: same size, same special ids, different vocabulary.
    keys = [k for k in vocab if not k.startswith("[")][:2]
    vocab[keys[0]], vocab[keys[1]] = vocab[keys[1]], vocab[keys[0]]
    (ckpt / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(ckpt)


def test_unknown_format_version_is_refused(ckpt: Path) -> None:
    meta = json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))
    meta["format_version"] = FORMAT_VERSION + 1
    (ckpt / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CheckpointError, match="format version"):
        load_checkpoint(ckpt)


def test_wrong_tensor_shapes_are_refused(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config["intermediate_size"] += 8
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(ckpt)


def test_save_heads_adds_and_replaces_without_touching_the_encoder(ckpt: Path) -> None:
    weights_before = (ckpt / "model.safetensors").read_bytes()
    dim = read_meta(ckpt).embedding_dim
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8, metrics={"f1": 0.5})
    quality = HeadSpec(name="quality", kind="regression", hidden=4, metrics={"mae": 0.1})
    save_heads(ckpt, {"topic": (topic, TaskHead(topic, dim)), "quality": (quality, TaskHead(quality, dim))})
    loaded = load_checkpoint(ckpt)
    specs = {h.name: h for h in loaded.meta.heads}
    assert set(specs) == {"page_type", "quality", "topic"}
    assert specs["quality"].hidden == 4 and specs["quality"].metrics == {"mae": 0.1}
    assert specs["topic"].metrics == {"f1": 0.5}
    assert (ckpt / "model.safetensors").read_bytes() == weights_before


def test_saving_over_a_checkpoint_removes_the_heads_the_model_no_longer_has(ckpt: Path) -> None:
    """Re-exported without its heads, a checkpoint kept their files: htmllm.json no longer listed them,
    but they changed its fingerprint (an ONNX graph re-exported, an embed run refused to resume)."""
    build_tiny_checkpoint(ckpt, heads=False)  # the same model saved again, without heads
    assert read_meta(ckpt).heads == []
    assert list((ckpt / "heads").glob("*.safetensors")) == []
    assert checkpoint_fingerprint(ckpt) == checkpoint_fingerprint(
        build_tiny_checkpoint(ckpt.parent / "fresh", heads=False)
    )


def test_mean_pooling_survives_the_round_trip(tmp_path: Path) -> None:
    path = build_tiny_checkpoint(tmp_path / "mean", pooling="mean", heads=False)
    loaded = load_checkpoint(path)
    assert loaded.model.pooling == "mean" and loaded.meta.heads == []


def _edit_meta(ckpt: Path, edit: Any) -> None:
    meta = json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))
    edit(meta)
    (ckpt / "htmllm.json").write_text(json.dumps(meta), encoding="utf-8")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_length", "64"),  # had been read as 64
        ("max_length", 64.7),  # had been read as 64
        ("max_length", 1),  # no room for [CLS] and [SEP]
        ("name", None),  # had been read as "None"
        ("format_version", True),  # True == 1
        ("embedding_dim", 0),
        ("pooling", "max"),  # had surfaced as an untyped ValueError from the model
        ("heads", {"page_type": {}}),
    ],
)
def test_htmllm_json_fields_of_the_wrong_type_or_value_are_refused(
    ckpt: Path, field: str, value: Any
) -> None:
    _edit_meta(ckpt, lambda meta: meta.__setitem__(field, value))
    with pytest.raises(CheckpointError, match=f"malformed.*{field}") as info:
        read_meta(ckpt)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("labels", "abc"),  # three characters: had been read as the classes a, b and c, and loaded
        ("labels", ["article", 1, "other"]),
        ("hidden", 16.5),  # had been read as 16
        ("metrics", {"f1": "high"}),
    ],
)
def test_head_fields_of_the_wrong_type_are_refused(ckpt: Path, field: str, value: Any) -> None:
    _edit_meta(ckpt, lambda meta: meta["heads"][0].__setitem__(field, value))
    with pytest.raises(CheckpointError, match=f"malformed.*{field}"):
        load_checkpoint(ckpt)


def test_a_head_listed_twice_is_refused_by_the_metadata_alone(ckpt: Path) -> None:
    # read_meta is all the onnx backend reads when its graph is current
    _edit_meta(ckpt, lambda meta: meta["heads"].append(dict(meta["heads"][0])))
    with pytest.raises(CheckpointError, match="twice"):
        read_meta(ckpt)


def test_htmllm_json_that_is_not_utf8_is_a_checkpoint_error(ckpt: Path) -> None:
    (ckpt / "htmllm.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_meta(ckpt)


@pytest.mark.parametrize(
    ("key", "value"), [("num_attention_heads", 3), ("vocab_size", "many"), ("hidden_size", None)]
)
def test_an_impossible_config_is_a_checkpoint_error(ckpt: Path, key: str, value: Any) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    config[key] = value
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_checkpoint(ckpt)


def _edit_config(ckpt: Path, edit: Any) -> None:
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    edit(config)
    (ckpt / "config.json").write_text(json.dumps(config), encoding="utf-8")


def _edit_tensors(file: Path, edit: Any) -> None:
    tensors = load_file(str(file))
    save_file(edit(tensors), str(file))


@pytest.mark.parametrize("file", ["model.safetensors", "heads/page_type.safetensors"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(ckpt: Path, file: str, value: float) -> None:
    """One NaN weight had loaded silently, and the service answered 200 with null embeddings."""

    def poison(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        name = sorted(tensors)[0]
        tensors[name].view(-1)[0] = value
        return tensors

    _edit_tensors(ckpt / file, poison)
    name = sorted(load_file(str(ckpt / file)))[0]
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} holds NaN or infinite") as info:
        load_checkpoint(ckpt)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID


@pytest.mark.parametrize("file", ["model.safetensors", "heads/page_type.safetensors"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool])
def test_weights_that_are_not_floating_point_are_refused(ckpt: Path, file: str, dtype: torch.dtype) -> None:
    """load_state_dict had cast int or bool tensors into the float parameters without a word."""
    _edit_tensors(ckpt / file, lambda tensors: {k: (v * 10).to(dtype) for k, v in tensors.items()})
    with pytest.raises(CheckpointError, match=r"has dtype .*must be floating point"):
        load_checkpoint(ckpt)


def test_half_precision_weights_still_load(ckpt: Path) -> None:
    # the bundled default model ships float16 weights
    _edit_tensors(ckpt / "model.safetensors", lambda tensors: {k: v.half() for k, v in tensors.items()})
    _edit_tensors(
        ckpt / "heads/quality.safetensors", lambda tensors: {k: v.bfloat16() for k, v in tensors.items()}
    )
    loaded = load_checkpoint(ckpt)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}


@pytest.mark.parametrize(
    ("file", "edit", "match"),
    [
        ("htmllm.json", lambda d: d["heads"][0].update(hidden=2**36), r"dense\.\w+ has shape"),
        ("config.json", lambda d: d.update(intermediate_size=2**36), r"mlp\.Wi\.weight has shape"),
        ("config.json", lambda d: d.update(hidden_size=2**36, num_attention_heads=1), "hidden_size"),
        ("config.json", lambda d: d.update(num_hidden_layers=10**6), "num_hidden_layers"),
    ],
)
def test_declared_sizes_are_checked_against_the_files_before_anything_is_allocated(
    ckpt: Path, file: str, edit: Any, match: str
) -> None:
    """A hand-edited 2**36 had been allocated before being compared with the weights: an untyped
    allocator error, or gigabytes spent first for a size that fits."""
    data = json.loads((ckpt / file).read_text(encoding="utf-8"))
    edit(data)
    (ckpt / file).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(ckpt)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("pad_token_id", 99999, r"config\.json's special token ids.*pad_token_id=99999"),  # AssertionError
        ("num_attention_heads", 0, r"config\.json describes no buildable model: ZeroDivisionError"),
        ("hidden_activation", "nope", r"config\.json describes no buildable model: KeyError"),
    ],
)
def test_config_values_transformers_rejects_are_checkpoint_errors(
    ckpt: Path, key: str, value: Any, match: str
) -> None:
    _edit_config(ckpt, lambda config: config.__setitem__(key, value))
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("edit", [lambda m: m.pop("heads"), lambda m: m.__setitem__("head", m.pop("heads"))])
def test_htmllm_json_without_its_heads_key_is_refused(ckpt: Path, edit: Any) -> None:
    """A missing or misspelt "heads" had loaded as a checkpoint without heads beside its head files."""
    _edit_meta(ckpt, edit)
    with pytest.raises(CheckpointError, match=r"malformed.*heads.*missing"):
        read_meta(ckpt)


def test_an_empty_heads_list_still_loads(tmp_path: Path) -> None:
    loaded = load_checkpoint(build_tiny_checkpoint(tmp_path / "bare", heads=False))
    assert loaded.meta.heads == [] and len(loaded.model.heads) == 0


@pytest.mark.parametrize("how", ["copied in", "dropped from htmllm.json"])
def test_head_files_htmllm_json_does_not_list_are_refused(ckpt: Path, how: str) -> None:
    if how == "copied in":
        shutil.copy(ckpt / "heads/page_type.safetensors", ckpt / "heads/extra.safetensors")
        unlisted = "extra.safetensors"
    else:
        _edit_meta(ckpt, lambda meta: meta.__setitem__("heads", meta["heads"][1:]))
        unlisted = "page_type.safetensors"
    with pytest.raises(CheckpointError, match=rf"holds {re.escape(unlisted)} that htmllm\.json does not"):
        load_checkpoint(ckpt)


def test_classifier_pooling_must_agree_with_htmllm_json_when_given(ckpt: Path) -> None:
    """AutoModel users read config.json's pooling, the service htmllm.json's: apart, they pool apart."""
    _edit_config(ckpt, lambda config: config.__setitem__("classifier_pooling", "mean"))
    with pytest.raises(CheckpointError, match=r"classifier_pooling 'mean'.*pooling 'cls'"):
        load_checkpoint(ckpt)
    _edit_config(ckpt, lambda config: config.pop("classifier_pooling"))
    assert load_checkpoint(ckpt).model.pooling == "cls"


@pytest.mark.parametrize(
    ("spec", "module_spec"),
    [
        (  # three labels recorded, a two-class module written
            HeadSpec(name="topic", kind="classification", labels=["a", "b", "c"], hidden=8),
            HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8),
        ),
        (  # hidden 8 recorded, 4 written
            HeadSpec(name="topic", kind="regression", hidden=8),
            HeadSpec(name="topic", kind="regression", hidden=4),
        ),
    ],
)
def test_save_heads_refuses_a_module_its_spec_does_not_describe(
    ckpt: Path, spec: HeadSpec, module_spec: HeadSpec
) -> None:
    """Such a head had been written, and the checkpoint then refused to load."""
    dim = read_meta(ckpt).embedding_dim
    before = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    good = HeadSpec(name="good", kind="regression", hidden=4)
    with pytest.raises(CheckpointError, match=r"head 'topic'.*spec"):
        save_heads(ckpt, {"good": (good, TaskHead(good, dim)), "topic": (spec, TaskHead(module_spec, dim))})
    # nothing written, not even the head that was fine
    assert {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == before
    load_checkpoint(ckpt)


def test_save_heads_refuses_a_nan_head(ckpt: Path) -> None:
    dim = read_meta(ckpt).embedding_dim
    spec = HeadSpec(name="topic", kind="regression", hidden=4)
    head = TaskHead(spec, dim)
    with torch.no_grad():
        head.out.bias.fill_(float("nan"))
    with pytest.raises(CheckpointError, match=r"out\.bias holds NaN"):
        save_heads(ckpt, {"topic": (spec, head)})
    assert not (ckpt / "heads/topic.safetensors").exists()


def _tiny_meta(max_length: int = TINY_MAX_LENGTH) -> CheckpointMeta:
    return CheckpointMeta(
        name="tiny",
        pooling="cls",
        prune_version=PRUNE_VERSION,
        tokenizer_sha256=build_tiny_tokenizer().sha256,
        max_length=max_length,
        embedding_dim=build_tiny_model(heads=False).embedding_dim,
    )


def test_save_checkpoint_refuses_metadata_load_would_refuse_before_writing_anything(tmp_path: Path) -> None:
    """max_length 1 had been written, then refused at load."""
    target = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match=r"refusing to write.*max_length 1"):
        save_checkpoint(target, build_tiny_model(), build_tiny_tokenizer(), _tiny_meta(max_length=1))
    assert not target.exists()


def test_save_checkpoint_refuses_nan_weights_before_writing_anything(tmp_path: Path) -> None:
    model = build_tiny_model()
    with torch.no_grad():
        model.encoder.embeddings.tok_embeddings.weight[2, 0] = float("nan")
    target = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match=r"tok_embeddings\.weight holds NaN"):
        save_checkpoint(target, model, build_tiny_tokenizer(), _tiny_meta())
    assert not target.exists()


@pytest.mark.parametrize("value", [1, 0, -2, 8.0, None])
def test_a_sliding_window_that_holds_no_position_is_refused_at_load(ckpt: Path, value: Any) -> None:
    """local_attention 1 (window local_attention // 2 = 0) loaded, then every forward pass of the
    service failed with ZeroDivisionError."""
    _edit_config(ckpt, lambda config: config.__setitem__("local_attention", value))
    with pytest.raises(CheckpointError, match="local_attention") as info:
        load_checkpoint(ckpt)
    assert info.value.code is ErrorCode.CHECKPOINT_INVALID


def test_a_sliding_window_of_one_position_still_loads(ckpt: Path) -> None:
    _edit_config(ckpt, lambda config: config.__setitem__("local_attention", 3))
    assert load_checkpoint(ckpt).model.config.sliding_window == 1


def test_save_checkpoint_refuses_an_empty_sliding_window_before_writing_anything(tmp_path: Path) -> None:
    model = build_tiny_model()
    model.encoder.config.local_attention = 1
    target = tmp_path / "ckpt"
    with pytest.raises(CheckpointError, match="local_attention"):
        save_checkpoint(target, model, build_tiny_tokenizer(), _tiny_meta())
    assert not target.exists()


@pytest.mark.parametrize("name", ["x" * 300, "x" * 240, "a\x00b", "a\\b", "bell\x07", "topic.v2"])
def test_head_names_no_file_can_have_are_refused_by_the_metadata(ckpt: Path, name: str) -> None:
    """Such a name had passed: load then raised a raw OSError (name too long) looking for its file."""
    (ckpt / "heads" / "quality.safetensors").unlink()
    _edit_meta(ckpt, lambda meta: meta["heads"][1].__setitem__("name", name))
    for read in (read_meta, load_checkpoint):
        with pytest.raises(CheckpointError, match=r"malformed.*head name"):
            read(ckpt)


def test_a_head_file_the_file_system_cannot_look_up_is_a_checkpoint_error(tmp_path: Path) -> None:
    from service.core import checkpoint

    for file, said in (
        (tmp_path / ("x" * 300 + ".safetensors"), "cannot be read"),
        (tmp_path / "a\x00b", "is missing|cannot be read"),
    ):
        for read in (checkpoint._read_header, checkpoint._load_tensors):
            with pytest.raises(CheckpointError, match=said):  # not a raw OSError or ValueError
                read(file)


def test_non_finite_metrics_are_refused_in_htmllm_json(ckpt: Path) -> None:
    """A NaN metric had been saved as a bare NaN (no JSON: jq and browsers refuse the file) and loaded."""
    (ckpt / "htmllm.json").write_text(
        (ckpt / "htmllm.json")
        .read_text(encoding="utf-8")
        .replace('"metrics": {}', '"metrics": {"r": NaN}', 1),
        encoding="utf-8",
    )
    with pytest.raises(CheckpointError, match=r"malformed.*finite"):
        read_meta(ckpt)


def test_htmllm_json_is_written_as_strict_json(ckpt: Path, tmp_path: Path) -> None:
    """A NaN in the training record is refused, naming where it is, before anything is written."""

    def strict(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"), parse_constant=strict)
    meta = _tiny_meta()
    meta.training = {"eval": {"losses": [0.5, float("nan")]}}
    target = tmp_path / "nan"
    with pytest.raises(CheckpointError, match=r"refusing to write htmllm\.json: training\.eval\.losses\.1 "):
        save_checkpoint(target, build_tiny_model(), build_tiny_tokenizer(), meta)
    assert not target.exists()


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "a\x00b", " padded", "x" * 201])
def test_a_model_name_the_service_cannot_serve_is_refused_by_the_metadata(ckpt: Path, name: str) -> None:
    """The model's name is its id in the API: an empty one made `GET /v1/models/{id}` unreachable, and
    a newline or NUL went into every answer's `model`. Training refuses such a name (its config); a
    checkpoint written otherwise is refused when read, by the same rule."""
    _edit_meta(ckpt, lambda meta: meta.__setitem__("name", name))
    for read in (read_meta, load_checkpoint):
        with pytest.raises(CheckpointError, match=r"malformed.*a model name"):
            read(ckpt)
