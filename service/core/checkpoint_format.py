"""The checkpoint format's own rules, shared by `service.core.checkpoint`'s reader and its two writers.

What a checkpoint must satisfy whichever way it is read or written: the file names and format version,
htmllm.json (`CheckpointMeta`, read with strict JSON types and written as strict JSON, validated as it
will be read back), and the checks every part must pass against the others (config.json against the
tokenizer and htmllm.json, weights floating point and finite, a head module against its spec). Kept apart
from the directory's I/O so that `checkpoint` (load, save, copy, fingerprint) depends on it one way;
`checkpoint` re-exports the public names, which callers import from there.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import ModernBertConfig

from service.core.errors import CheckpointError
from service.core.heads_stage import META_FILE, unreadable
from service.core.modeling import (
    MIN_LOCAL_ATTENTION,
    POOLINGS,
    HeadSpec,
    HtmlEncoderModel,
    TaskHead,
    typed_field,
)
from service.core.tokenizer import HtmlTokenizer

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"

# The safetensors dtypes a weight may have; anything else (an int or bool tensor from a broken conversion)
# would be cast silently into the float parameters by load_state_dict.
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# An error message quotes at most this much of an exception's text (transformers may echo a whole config).
_MAX_CAUSE_CHARS = 300


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

    @property
    def training_run_id(self) -> str | None:
        """`training.run_id`: the training run that made the weights (None for checkpoints from before
        run ids, such as the bundled model), as /info, the checkpoint header and the model process name it."""
        run_id = self.training.get("run_id")
        return None if run_id is None else str(run_id)

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
            if "heads" not in data:
                # Required: a missing (or misspelt) key had loaded as "no heads" beside heads/*.safetensors.
                others = sorted(str(key)[:40] for key in data if key not in _META_KEYS)[:5]
                raise ValueError(f"heads (a list, [] for none) is missing; unknown keys: {others}")
            heads = data["heads"]
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
            problem = model_name_problem(meta.name)
            if problem is not None:
                raise ValueError(f"name {meta.name[:60]!r}: {problem}")
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


# A model's name is its id in the service's API (`GET /v1/models/{id}`, /info, every response's `model`):
# the bound keeps it a readable id. Training refuses such a name at its config's load, the loader here.
MAX_MODEL_NAME_CHARS = 200


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot name a model the service serves, or None.

    An empty name, or one holding a newline or NUL, trained and was served: the empty one made
    `GET /v1/models/{id}` unreachable, and the others went into the served model's id unchecked.
    """
    if not name.strip():
        return "a model name must not be empty (it is the model's id in the service's API)"
    if not name.isprintable():
        return "a model name must be printable: no newline, tab, NUL or other control character"
    if name != name.strip():
        return "a model name must not begin or end with a space"
    if len(name) > MAX_MODEL_NAME_CHARS:
        return f"a model name is at most {MAX_MODEL_NAME_CHARS} characters, not {len(name)}"
    return None


_META_KEYS = frozenset(f.name for f in dataclasses.fields(CheckpointMeta))


def cause(exc: BaseException) -> str:
    """An exception as `Type: message`, cut short: transformers may quote a whole config back."""
    text = str(exc)
    if len(text) > _MAX_CAUSE_CHARS:
        text = text[:_MAX_CAUSE_CHARS] + "…"
    return f"{type(exc).__name__}: {text}"


def quoted(value: object, limit: int = 60) -> str:
    """repr(value), cut short, for quoting a value read from a file into an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def check_config_matches(
    config: ModernBertConfig, tokenizer: HtmlTokenizer, meta: CheckpointMeta, source: str
) -> None:
    """What the encoder's config must agree on with the tokenizer and htmllm.json.

    Run on config.json before any module is built: a special id outside the vocabulary had surfaced as
    an AssertionError from nn.Embedding, not as the mismatch it is.
    """
    if config.vocab_size != tokenizer.vocab_size:
        raise CheckpointError(
            f"vocab mismatch: {source} has vocab_size {quoted(config.vocab_size)} but the tokenizer has "
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
        detail = ", ".join(f"{k}={quoted(got)} (tokenizer: {want})" for k, (got, want) in wrong.items())
        raise CheckpointError(
            f"vocab mismatch: {source}'s special token ids differ from the tokenizer's: {detail}"
        )
    if meta.tokenizer_sha256 != tokenizer.sha256:
        raise CheckpointError(
            f"vocab mismatch: {META_FILE} records tokenizer sha256 {meta.tokenizer_sha256[:12]}… but "
            f"tokenizer.json hashes to {tokenizer.sha256[:12]}…"
        )
    if meta.embedding_dim != config.hidden_size:
        raise CheckpointError(
            f"{META_FILE} says embedding_dim {meta.embedding_dim}, {source} has hidden_size "
            f"{quoted(config.hidden_size)}"
        )
    positions = config.max_position_embeddings
    if not isinstance(positions, int) or meta.max_length > positions:
        raise CheckpointError(
            f"max_length {meta.max_length} exceeds the encoder's {quoted(positions)} positions"
        )
    local = getattr(config, "local_attention", None)
    if not isinstance(local, int) or isinstance(local, bool) or local < MIN_LOCAL_ATTENTION:
        # An empty sliding window (local_attention // 2 == 0) loaded, then every forward pass of the
        # service divided by zero; refused here, where the file is named.
        raise CheckpointError(
            f"{source} has local_attention {quoted(local)}; it must be an integer of at least "
            f"{MIN_LOCAL_ATTENTION} (the sliding window, local_attention // 2, must hold a position)"
        )


def check_model_matches(model: HtmlEncoderModel, tokenizer: HtmlTokenizer, meta: CheckpointMeta) -> None:
    check_config_matches(model.config, tokenizer, meta, "the model")
    if meta.pooling != model.pooling:
        raise CheckpointError(f"{META_FILE} says pooling {meta.pooling!r}, the model uses {model.pooling!r}")
    names = [spec.name for spec in meta.heads]
    if sorted(names) != sorted(model.heads.keys()):
        raise CheckpointError(f"{META_FILE} lists heads {names}, the model has {sorted(model.heads.keys())}")


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether no element is NaN or infinite, at the cost of one sum in the common case (5-10x faster
    than an elementwise test: 0.2 s of the bundled model's load): a NaN or infinity makes the sum
    non-finite, so only a non-finite sum (that or an overflow) needs the elementwise test."""
    if bool(torch.isfinite(tensor.sum(dtype=torch.float32))):
        return True
    return bool(torch.isfinite(tensor).all())


def check_state(state: Mapping[str, torch.Tensor], origin: str | Path) -> None:
    """Every tensor floating point and finite: an int tensor is cast silently by load_state_dict, and one
    NaN weight turns every embedding into NaN (served as null) without any error."""
    for name, tensor in state.items():
        if tensor.dtype not in FLOAT_DTYPES.values():
            raise CheckpointError(
                f"{origin}: tensor {name} has dtype {tensor.dtype}; weights must be float32, "
                "float16 or bfloat16"
            )
        if not _all_finite(tensor):
            raise CheckpointError(f"{origin}: tensor {name} holds NaN or infinite values")


def on_meta_device(factory: Callable[[], torch.nn.Module], origin: str | Path) -> torch.nn.Module:
    """The module `factory` builds, on the meta device: its tensors' shapes without allocating them, so
    sizes read from a file (a hidden of 2**36) are compared with the weights before anything is
    allocated. Any error building it (transformers raises ZeroDivisionError, KeyError, …) is the file's."""
    try:
        with torch.device("meta"):
            return factory()
    except Exception as exc:
        raise CheckpointError(f"{origin} describes no buildable model: {cause(exc)}") from exc


def check_head_module(name: str, spec: HeadSpec, head: TaskHead, hidden: int) -> None:
    """A head module shaped as `spec` says (labels, hidden) on `hidden`-d input, so that what is saved
    loads back: htmllm.json gets the spec, the head file gets the module's tensors."""
    if head.spec.kind != spec.kind:
        raise CheckpointError(f"head {name!r}: the spec is {spec.kind}, the module {head.spec.kind}")
    wanted = on_meta_device(partial(TaskHead, spec, hidden), f"head {name!r}").state_dict()
    got = head.state_dict()
    for key in sorted(set(wanted) | set(got)):
        if key not in wanted or key not in got or tuple(wanted[key].shape) != tuple(got[key].shape):
            shape = tuple(got[key].shape) if key in got else None
            raise CheckpointError(
                f"head {name!r}: tensor {key} of the module has shape {shape}, but its spec ({spec.kind}, "
                f"{len(spec.labels)} labels, hidden {spec.hidden}) on {hidden}-d input needs "
                f"{tuple(wanted[key].shape) if key in wanted else None}"
            )


def meta_file_text(meta: CheckpointMeta) -> str:
    """htmllm.json's text for `meta`, validated as read_meta will read it back: a writer must not leave
    a checkpoint its reader refuses (a max_length of 1 had been written, then refused at load)."""
    data = meta.to_dict()
    where = _non_finite(data)
    if where is not None:
        # Written as a bare NaN (Python's json default), which no strict JSON reader (jq, a browser) parses.
        raise CheckpointError(f"refusing to write {META_FILE}: {where} is not a finite number")
    try:
        text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
        CheckpointMeta.from_dict(json.loads(text))
    except CheckpointError as exc:
        raise CheckpointError(f"refusing to write it: {exc}") from exc
    except (TypeError, ValueError) as exc:  # a training record JSON cannot hold
        raise CheckpointError(f"refusing to write {META_FILE}: {cause(exc)}") from exc
    return text


def _non_finite(value: object, where: str = "") -> str | None:
    """The key path (`training.eval.loss`) of the first NaN or infinity in JSON-like `value`, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the value"
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def read_meta_file(root: Path, file: Path) -> CheckpointMeta:
    try:
        present = file.is_file()
        text = file.read_text(encoding="utf-8") if present else ""
    except OSError as exc:  # 0600 or in a 0700 directory of another user: "Permission denied", and why
        raise unreadable(file, exc) from exc
    except ValueError as exc:  # not UTF-8 (UnicodeDecodeError)
        raise CheckpointError(f"{file} cannot be read: {exc}") from exc
    if not present:
        raise CheckpointError(f"{file} is missing: {root} is not an htmllm checkpoint")
    try:
        data = json.loads(text)
    except ValueError as exc:  # not JSON
        raise CheckpointError(f"{file} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} is not a JSON object")
    return CheckpointMeta.from_dict(data)
