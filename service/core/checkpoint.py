"""The checkpoint directory: the one contract between training and inference.

Layout (a directory `transformers.AutoModel.from_pretrained` also loads, as a `ModernBertModel`):

    config.json            ModernBertConfig, with all five special ids from the tokenizer
    model.safetensors      the encoder's weights, under ModernBertModel's own names
    tokenizer.json         the HtmlTokenizer
    htmllm.json            CheckpointMeta: format version, pooling, prune version, tokenizer sha256,
                           max length, embedding dim, heads (kind, labels, hidden, metrics), training
    heads/<name>.safetensors  one file per task head

Loading is strict: a missing file, an unknown format version, a tokenizer whose hash or vocabulary does
not match the model, a missing or unexpected tensor each raise `CheckpointError` naming the problem,
because a model quietly run with the wrong vocabulary returns plausible-looking garbage.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import ModernBertConfig, ModernBertModel

from service.core.atomic_files import replaced_atomically
from service.core.errors import ErrorCode, HtmllmError
from service.core.modeling import POOLINGS, HeadSpec, HtmlEncoderModel, TaskHead, typed_field
from service.core.tokenizer import HtmlTokenizer, TokenizerError

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "htmllm.json"
HEADS_DIR = "heads"


class CheckpointError(HtmllmError):
    """A checkpoint that fails strict loading or cannot be written."""

    code = ErrorCode.CHECKPOINT_INVALID


@dataclass
class CheckpointMeta:
    """htmllm.json: what the service must know about a model beyond transformers' config."""

    name: str
    pooling: str
    prune_version: str
    tokenizer_sha256: str
    max_length: int
    embedding_dim: int
    heads: list[HeadSpec] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)  # resolved training config, data, figures
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
            "pooling": self.pooling,
            "prune_version": self.prune_version,
            "tokenizer_sha256": self.tokenizer_sha256,
            "max_length": self.max_length,
            "embedding_dim": self.embedding_dim,
            "heads": [spec.to_dict() for spec in self.heads],
            "training": self.training,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointMeta:
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            # Older formats would be migrated here, explicitly, one version at a time.
            raise CheckpointError(
                f"unknown checkpoint format version {version!r}; this build reads version {FORMAT_VERSION}"
            )
        # Strict JSON types: a value of the wrong type is refused, not coerced (a max_length of "64" or
        # 64.7, a name of null read as "None", labels "abc" read as three classes).
        try:
            heads = data.get("heads", [])
            if not isinstance(heads, list):
                raise TypeError(f"heads must be a list, not {heads!r}")
            training = data.get("training", {})
            if not isinstance(training, dict):
                raise TypeError(f"training must be an object, not {training!r}")
            meta = cls(
                format_version=typed_field(data, "format_version", int),
                name=typed_field(data, "name", str),
                pooling=typed_field(data, "pooling", str),
                prune_version=typed_field(data, "prune_version", str),
                tokenizer_sha256=typed_field(data, "tokenizer_sha256", str),
                max_length=typed_field(data, "max_length", int),
                embedding_dim=typed_field(data, "embedding_dim", int),
                heads=[HeadSpec.from_dict(h) for h in heads],
                training=dict(training),
            )
            if meta.pooling not in POOLINGS:
                raise ValueError(f"pooling {meta.pooling!r} is not one of {POOLINGS}")
            if meta.max_length < 2:
                raise ValueError(f"max_length {meta.max_length} leaves no room for [CLS] and [SEP]")
            if meta.embedding_dim < 1:
                raise ValueError(f"embedding_dim {meta.embedding_dim} is not positive")
            names = [spec.name for spec in meta.heads]
            if len(set(names)) != len(names):
                raise ValueError(f"heads {names} name a head twice")
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{META_FILE} is malformed: {type(exc).__name__}: {exc}") from exc
        return meta


@dataclass
class Checkpoint:
    model: HtmlEncoderModel
    tokenizer: HtmlTokenizer
    meta: CheckpointMeta
    path: Path


# mkstemp creates files 0600; a checkpoint is read by other users (a container's uid mounting it).
_FILE_MODE = 0o644


def _atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a killed writer never leaves a half file."""
    with replaced_atomically(path, mode=_FILE_MODE) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _atomic_save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    with replaced_atomically(path, mode=_FILE_MODE) as tmp:
        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        save_file(tensors, str(tmp), metadata=metadata)


def _check_model_matches(model: HtmlEncoderModel, tokenizer: HtmlTokenizer, meta: CheckpointMeta) -> None:
    config = model.config
    if config.vocab_size != tokenizer.vocab_size:
        raise CheckpointError(
            f"vocab mismatch: the model has {config.vocab_size} token embeddings but the tokenizer has "
            f"{tokenizer.vocab_size} tokens"
        )
    special = tokenizer.special_ids
    expected = {
        "pad_token_id": special.pad,
        "cls_token_id": special.cls,
        "sep_token_id": special.sep,
        "unk_token_id": special.unk,
        "mask_token_id": special.mask,
    }
    wrong = {k: (getattr(config, k, None), v) for k, v in expected.items() if getattr(config, k, None) != v}
    if wrong:
        detail = ", ".join(f"{k}={got} (tokenizer: {want})" for k, (got, want) in wrong.items())
        raise CheckpointError(f"vocab mismatch: special token ids differ from the tokenizer's: {detail}")
    if meta.tokenizer_sha256 != tokenizer.sha256:
        raise CheckpointError(
            f"vocab mismatch: {META_FILE} records tokenizer sha256 {meta.tokenizer_sha256[:12]}… but "
            f"tokenizer.json hashes to {tokenizer.sha256[:12]}…"
        )
    if meta.embedding_dim != model.embedding_dim:
        raise CheckpointError(
            f"{META_FILE} says embedding_dim {meta.embedding_dim}, the encoder has {model.embedding_dim}"
        )
    if meta.pooling != model.pooling:
        raise CheckpointError(f"{META_FILE} says pooling {meta.pooling!r}, the model uses {model.pooling!r}")
    if meta.max_length > config.max_position_embeddings:
        raise CheckpointError(
            f"max_length {meta.max_length} exceeds the encoder's {config.max_position_embeddings} positions"
        )
    names = [spec.name for spec in meta.heads]
    if sorted(names) != sorted(model.heads.keys()):
        raise CheckpointError(f"{META_FILE} lists heads {names}, the model has {sorted(model.heads.keys())}")


def save_checkpoint(
    path: str | Path, model: HtmlEncoderModel, tokenizer: HtmlTokenizer, meta: CheckpointMeta
) -> None:
    """Write a complete checkpoint directory (created if missing; existing files are replaced, and head
    files of heads the model no longer has are removed).

    `meta.heads` is rewritten from the model's heads, so the two cannot disagree.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    meta.heads = list(model.head_specs.values())
    _check_model_matches(model, tokenizer, meta)
    model.config.classifier_pooling = model.pooling  # type: ignore[assignment]  # validated by the model
    # ModernBertModel.save_pretrained writes config.json and model.safetensors under the names
    # AutoModel expects; we keep only those two files from it.
    model.encoder.save_pretrained(root, safe_serialization=True)
    for written in (root / "config.json", root / "model.safetensors"):
        written.chmod(_FILE_MODE)  # save_pretrained may write through a 0600 temporary file
    tokenizer.save(root / TOKENIZER_FILE)
    heads_dir = root / HEADS_DIR
    heads_dir.mkdir(exist_ok=True)
    for name, head in model.heads.items():
        _atomic_save_tensors(heads_dir / f"{name}.safetensors", head.state_dict(), {"head": name})
    _atomic_write_text(root / META_FILE, json.dumps(meta.to_dict(), indent=2, sort_keys=True) + "\n")
    # Saved over a checkpoint with other heads: their files go once htmllm.json no longer lists them
    # (left, they changed the checkpoint's fingerprint and looked like heads to anyone listing the folder).
    for orphan in heads_dir.glob("*.safetensors"):
        if orphan.stem not in model.heads:
            orphan.unlink(missing_ok=True)


def read_meta(path: str | Path) -> CheckpointMeta:
    """htmllm.json alone (cheap: for listing models without loading weights)."""
    file = Path(path) / META_FILE
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: {Path(path)} is not an htmllm checkpoint")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 (UnicodeDecodeError)
        raise CheckpointError(f"{file} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} is not a JSON object")
    return CheckpointMeta.from_dict(data)


def checkpoint_fingerprint(path: str | Path) -> str:
    """sha256 over what determines a checkpoint's outputs: config.json, htmllm.json (which pins the
    tokenizer by its hash), the weights and every head file. What an ONNX graph records of the
    checkpoint it was built from, and what `htmllm embed` pins so that a resume cannot mix two models.

    Size and mtime would not do: a copied checkpoint differs in both, a retrained one of the same size
    need not. Cost: 25 ms for the bundled model's 30 MB (about 1.3 GB/s warm).
    """
    root = Path(path)
    digest = hashlib.sha256()
    files = [root / CONFIG_FILE, root / META_FILE, root / WEIGHTS_FILE]
    files += sorted((root / HEADS_DIR).glob("*.safetensors"))
    for file in files:
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        try:
            with file.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as exc:
            raise CheckpointError(f"checkpoint {root}: cannot read {file.name}: {exc.strerror}") from exc
    return digest.hexdigest()


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise CheckpointError(f"{file} is missing")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{file} is not a valid safetensors file: {exc}") from exc


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], origin: Path) -> None:
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{origin}: tensors do not match the architecture (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    bad = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if bad:
        k = bad[0]
        raise CheckpointError(
            f"{origin}: tensor {k} has shape {tuple(state[k].shape)}, config needs {tuple(expected[k].shape)}"
        )
    module.load_state_dict(state, strict=True)


def load_heads(path: str | Path, specs: list[HeadSpec], embedding_dim: int) -> dict[str, TaskHead]:
    """The heads named in `specs`, each strictly loaded from heads/<name>.safetensors."""
    heads: dict[str, TaskHead] = {}
    for spec in specs:
        head = TaskHead(spec, embedding_dim)
        file = Path(path) / HEADS_DIR / f"{spec.name}.safetensors"
        _load_strict(head, _load_tensors(file), file)
        heads[spec.name] = head.eval()
    return heads


def load_checkpoint(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str | None = None,
) -> Checkpoint:
    """Strictly load a checkpoint in eval mode. `dtype` applies to the encoder; heads stay float32.

    `attn_implementation` ("sdpa", "eager", "flash_attention_2") defaults to SDPA.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, META_FILE):
        if not (root / name).is_file():
            raise CheckpointError(f"checkpoint {root} is missing {name}")
    meta = read_meta(root)
    try:
        tokenizer = HtmlTokenizer.from_file(root / TOKENIZER_FILE)
    except TokenizerError as exc:
        raise CheckpointError(f"checkpoint {root}: {exc}") from exc
    try:
        config = ModernBertConfig.from_json_file(str(root / CONFIG_FILE))
    except Exception as exc:  # transformers' validation raises errors of its own (a strict-field error)
        raise CheckpointError(f"{root / CONFIG_FILE} is not a valid ModernBERT config: {exc}") from exc
    if getattr(config, "model_type", None) != "modernbert":
        raise CheckpointError(f"{root / CONFIG_FILE} is not a ModernBERT config")
    # Check the vocabulary before building the model: a mismatch is the likeliest failure and the
    # clearest to report, and it must not surface as a tensor-shape error.
    if config.vocab_size != tokenizer.vocab_size:
        raise CheckpointError(
            f"vocab mismatch: config.json has vocab_size {config.vocab_size} but tokenizer.json has "
            f"{tokenizer.vocab_size} tokens"
        )
    try:
        encoder = ModernBertModel(config)
    except ValueError as exc:  # an impossible architecture (hidden size not a multiple of the heads)
        raise CheckpointError(f"{root / CONFIG_FILE} describes no buildable model: {exc}") from exc
    encoder.set_attn_implementation(attn_implementation or "sdpa")
    _load_strict(encoder, _load_tensors(root / WEIGHTS_FILE), root / WEIGHTS_FILE)
    heads = load_heads(root, meta.heads, int(config.hidden_size))
    model = HtmlEncoderModel(encoder, pooling=meta.pooling, heads=heads)
    _check_model_matches(model, tokenizer, meta)
    model.eval()
    model.place(device, dtype)
    return Checkpoint(model=model, tokenizer=tokenizer, meta=meta, path=root)


def save_heads(path: str | Path, heads: Mapping[str, tuple[HeadSpec, TaskHead]]) -> None:
    """Add or replace task heads in an existing checkpoint, leaving the encoder untouched."""
    root = Path(path)
    meta = read_meta(root)
    config_file = root / CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"checkpoint {root} is missing {CONFIG_FILE}")
    hidden = int(json.loads(config_file.read_text(encoding="utf-8"))["hidden_size"])
    heads_dir = root / HEADS_DIR
    heads_dir.mkdir(exist_ok=True)
    specs = {spec.name: spec for spec in meta.heads}
    for name, (spec, head) in heads.items():
        if name != spec.name or head.spec.name != spec.name:
            raise CheckpointError(f"head {name!r}: name, spec and module disagree")
        if head.norm.normalized_shape != (hidden,):
            raise CheckpointError(
                f"head {name!r} takes {head.norm.normalized_shape[0]}-d input, not {hidden}"
            )
        _atomic_save_tensors(heads_dir / f"{name}.safetensors", head.state_dict(), {"head": name})
        specs[name] = spec
    meta.heads = list(specs.values())
    _atomic_write_text(root / META_FILE, json.dumps(meta.to_dict(), indent=2, sort_keys=True) + "\n")
