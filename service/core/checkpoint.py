"""The checkpoint directory: the one contract between training and inference.

Layout (a directory `transformers.AutoModel.from_pretrained` also loads, as a `ModernBertModel`):

    config.json            ModernBertConfig, with all five special ids from the tokenizer
    model.safetensors      the encoder's weights, under ModernBertModel's own names
    tokenizer.json         the HtmlTokenizer
    htmllm.json            CheckpointMeta: format version, pooling, prune version, tokenizer sha256,
                           max length, embedding dim, heads (kind, labels, hidden, metrics), training
    heads/<name>.safetensors  one file per task head; its safetensors metadata names the head ("head")
                           and, where written by this version, holds a probe of the encoder it was fit
                           on ("encoder_probe", and "encoder_probe_vectors" in files written since 1-D
                           tensors were probed; see `encoder_probe`); their rules are
                           `service.core.head_files`'
    heads/.pending/        only while `save_heads` commits (see `service.core.heads_stage`); no part of
                           the format
    heads/.pending.lock    the lock `save_heads` and a reader completing its stage hold, there only while
                           held (its holder removes it); no part of it
    .htmllm-save.*/        only while `save_checkpoint` writes (see there); no part of the format

Loading is strict: a missing file, an unknown format version, a tokenizer whose hash or vocabulary does
not match the model, a missing or unexpected tensor, a tensor that is not floating point or holds NaN or
infinity, a head file htmllm.json does not list, a head file whose metadata names another head or
another encoder each raise `CheckpointError` naming the problem, because a model quietly run with the
wrong vocabulary (or NaN weights, or a head fit on other embeddings) returns plausible-looking garbage. The
sizes config.json and htmllm.json declare are compared with the safetensors headers before any module is
allocated: a hand-edited 2**36 must be a clear error, not gigabytes allocated or an allocator's crash.
Writing validates the same way before the first file is written, so a writer never leaves a checkpoint
its reader refuses, and writes htmllm.json as strict JSON (no bare NaN). A copy (`copy_checkpoint`, how
a training run's model is bundled) is made as a load reads the checkpoint, so a `save_heads` running
meanwhile cannot mix old labels with new head weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save
from transformers import ModernBertConfig, ModernBertModel

from service.core import heads_stage
from service.core.atomic_files import replaced_atomically

# The format's metadata and file names and the checks the reader and the writers share; its public names
# (imported `as` themselves) are re-exported: callers import them here.
from service.core.checkpoint_format import (
    CONFIG_FILE,
    FLOAT_DTYPES,
    cause,
    check_config_matches,
    check_head_module,
    check_model_matches,
    check_state,
    meta_file_text,
    on_meta_device,
    quoted,
    read_meta_file,
)
from service.core.checkpoint_format import FORMAT_VERSION as FORMAT_VERSION
from service.core.checkpoint_format import TOKENIZER_FILE as TOKENIZER_FILE
from service.core.checkpoint_format import WEIGHTS_FILE as WEIGHTS_FILE
from service.core.checkpoint_format import CheckpointMeta as CheckpointMeta
from service.core.errors import CheckpointError as CheckpointError  # re-exported: callers import it here

# A head file's rules (the names a head added now may take, its metadata, the checks against htmllm.json
# and the encoder): its public names (imported `as` themselves) are re-exported, as checkpoint_format's.
from service.core.head_files import ENCODER_PROBE_KEY as ENCODER_PROBE_KEY
from service.core.head_files import ENCODER_VECTORS_KEY as ENCODER_VECTORS_KEY
from service.core.head_files import HEAD_NAME_KEY as HEAD_NAME_KEY
from service.core.head_files import RESERVED_HEAD_NAMES as RESERVED_HEAD_NAMES
from service.core.head_files import EncoderProbe as EncoderProbe
from service.core.head_files import (
    case_clash,
    check_head_file,
    check_heads_encoder,
    head_metadata,
    probe_cells,
    probes_match,
    probes_to_record,
    recorded_probe,
    refuse_unlisted_heads,
    same_encoder,
    state_probe,
    vector_cells,
)
from service.core.head_files import loaded_probe as loaded_probe
from service.core.head_files import new_head_name_problem as new_head_name_problem
from service.core.head_files import set_loaded_probe as set_loaded_probe
from service.core.heads_stage import FILE_MODE, PENDING_DIR
from service.core.heads_stage import HEADS_DIR as HEADS_DIR
from service.core.heads_stage import META_FILE as META_FILE

# htmllm.json and heads/ are the format's, re-exported: defined with the heads stage, which governs how
# those files change and may import nothing from here.
from service.core.made_directories import directories_to_make, missing_before_parent_step, remove_empty
from service.core.modeling import HeadSpec, HtmlEncoderModel, TaskHead, typed_field
from service.core.tokenizer import HtmlTokenizer, TokenizerError

# `save_checkpoint` writes the whole checkpoint into a directory of this prefix inside the checkpoint's
# own (the same file system, so each file is renamed into place; no write access above it is needed)
# before any file of the old one is touched. Left behind only by a killed save; the next one removes it.
SAVE_STAGE_PREFIX = ".htmllm-save."


def encoder_probe(weights: Path) -> list[float]:
    """`read_encoder_probe(weights)` as one list (matrices, then vectors): what `save_heads(fit_on=...)`
    takes of the encoder a caller fits heads on."""
    return read_encoder_probe(weights).values()


def read_encoder_probe(weights: Path) -> EncoderProbe:
    """A few hundred of the encoder's weights, read from `weights` (model.safetensors) without loading it:
    what a head file records of the encoder it was fit on, and what load compares with.

    Not a hash of the file: the same encoder cast to float16 (the bundled model ships float16 weights)
    is the one its heads were fit on, and must still load with them. Reads a row per probed value.
    Here, not with the head files' rules: it reads the weights as load does (`require_file`)."""
    require_file(weights)
    try:
        with safe_open(str(weights), framework="pt") as handle:
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
            matrices = tuple(
                float(handle.get_slice(name)[row : row + 1][0, column].float())
                for name, row, column in probe_cells(shapes)
            )
            vectors = tuple(
                float(handle.get_slice(name)[index : index + 1][0].float())
                for name, index in vector_cells(shapes)
            )
            return EncoderProbe(matrices, vectors or None)  # none recorded where there are none
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights} is not a valid safetensors file: {cause(exc)}") from exc


@dataclass
class Checkpoint:
    model: HtmlEncoderModel
    tokenizer: HtmlTokenizer
    meta: CheckpointMeta
    path: Path


def _atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a killed writer never leaves a half file."""
    with replaced_atomically(path, mode=FILE_MODE) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file whose bytes depend on its tensors and metadata alone: safetensors writes the
    metadata's keys in a random order (a Rust HashMap), so two saves of one head differed, and so did
    the checkpoint's fingerprint. The header (8-byte little-endian length, JSON, space padding to 8
    bytes, as safetensors writes it) is written again with the metadata sorted."""
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size :])


def _atomic_save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> None:
    with replaced_atomically(path, mode=FILE_MODE) as tmp:
        _save_tensors(tmp, tensors, metadata)


def save_checkpoint(
    path: str | Path, model: HtmlEncoderModel, tokenizer: HtmlTokenizer, meta: CheckpointMeta
) -> None:
    """Write a complete checkpoint directory (created if missing; existing files are replaced, and head
    files of heads the model no longer has are removed; other files, a model.onnx say, are left).

    `meta.heads` is rewritten from the model's heads, so the two cannot disagree. Everything load
    checks is checked before the first file of the checkpoint is replaced, so a refused save leaves it
    as it was; a save into a directory that did not exist removes what it created when it fails (a
    directory holding heads/.pending.lock alone had been left, which serve and load call no checkpoint).
    A head loaded from a file records that file's probe of the encoder it was fit on (`loaded_probe`),
    not this encoder's, and the save is refused where the two differ, every such head named, before
    anything is written (the probe is taken of the encoder in memory); heads without one (fit in this
    process, or from a file of before) record this encoder's.

    Saved over an existing checkpoint, the new one is written whole into a stage directory inside it
    (`SAVE_STAGE_PREFIX`) and only then renamed into place, file by file, with htmllm.json removed first
    and written last: a save that fails while writing (a full disk) leaves the old checkpoint as it was,
    and one killed among the renames leaves a directory load refuses (no htmllm.json), never a new
    encoder under the old heads. Written in place, that had loaded silently. Renaming also replaces a
    symlinked file (a Hugging Face cache snapshot) by a regular one rather than writing through it into
    the blob it points at. Not a swap of the whole directory: the checkpoint's directory may be a mount
    point or sit in one that cannot be written, the heads lock lives inside it, and files beside the
    checkpoint's own (model.onnx) would be lost.
    """
    root = Path(path)
    specs = list(model.head_specs.values())
    candidate = dataclasses.replace(meta, heads=specs)
    meta_text = meta_file_text(candidate)
    check_model_matches(model, tokenizer, candidate)
    encoder_state = model.encoder.state_dict()
    check_state(encoder_state, WEIGHTS_FILE)
    for name, head in model.heads.items():
        check_head_module(name, cast(TaskHead, head).spec, cast(TaskHead, head), model.embedding_dim)
        check_state(head.state_dict(), f"{HEADS_DIR}/{name}.safetensors")
    # What each head file records of its encoder (a loaded head: its file's, refused where that is not
    # this encoder), decided of the encoder in memory before anything is created or written.
    records = None
    if model.heads:
        actual = state_probe(encoder_state)
        records = _Records(actual, probes_to_record(dict(model.heads.items()), actual, str(root)))
    meta.heads = specs
    made = _directories_to_make(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        with heads_stage.heads_lock(root):  # no reader completes a save_heads stage over the files written
            try:
                _save_checkpoint_locked(root, model, tokenizer, meta_text, records)
            except BaseException:
                _remove_written(root, made, model.heads)  # holding the lock: no save of ours writes meanwhile
                raise
    except BaseException:
        _remove_written(root, made, model.heads)  # the lock could not be taken (a full disk)
        raise


@dataclass(frozen=True)
class _Records:
    """What `save_checkpoint` writes into the head files of the encoder: `actual`, the probe of the
    encoder in memory, and `probes`, head name -> the probe its file records."""

    actual: EncoderProbe
    probes: dict[str, EncoderProbe]


def _directories_to_make(root: Path) -> list[Path]:
    """`root` and the parents of it that do not exist, deepest first: what `root.mkdir(parents=True)`
    makes, and a failed save takes away again where nothing else is in them (`_remove_written`).
    CheckpointError for a `root` in which `..` follows a directory that does not exist (`new/../kept`:
    `service.core.made_directories`)."""
    missing = missing_before_parent_step(root)
    if missing is not None:
        raise CheckpointError(f"{root}: '..' after {missing}, which does not exist; give the path without it")
    return directories_to_make(root)


def _remove_written(root: Path, made: Sequence[Path], heads: Iterable[str]) -> None:
    """After a failed save into a directory it made (`made`, deepest first; none: `root` existed, and
    the save's stage is all it wrote there, removed already), take away what the save wrote in it (its
    files by name, the heads lock) and then each directory of `made` that is left empty: left, the
    directory holding heads/.pending.lock alone is one that serve and load call no checkpoint. Never a
    file it did not write, nor a directory holding one: another process may have saved beside it (a
    sibling checkpoint under the same new parent)."""
    if not made:
        return
    heads_dir = root / HEADS_DIR
    names = [root / name for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, META_FILE)]
    names += [heads_dir / f"{name}.safetensors" for name in heads]
    for file in [*names, heads_dir / heads_stage.LOCK_FILE]:
        with contextlib.suppress(OSError):
            file.unlink()
    remove_empty([heads_dir, *made])


def _save_checkpoint_locked(
    root: Path,
    model: HtmlEncoderModel,
    tokenizer: HtmlTokenizer,
    meta_text: str,
    records: _Records | None,
) -> None:
    # A save_heads stage left over (committed or not) would otherwise be applied over this checkpoint.
    shutil.rmtree(root / HEADS_DIR / PENDING_DIR, ignore_errors=True)
    # The stages of saves that were killed: every save holds the heads lock, so none is a live one's.
    for stale in root.glob(f"{SAVE_STAGE_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=root, prefix=SAVE_STAGE_PREFIX))
    try:
        _write_stage(stage, model, tokenizer, meta_text, records)
        _move_stage_in(stage, root, set(model.heads))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _write_stage(
    stage: Path, model: HtmlEncoderModel, tokenizer: HtmlTokenizer, meta_text: str, records: _Records | None
) -> None:
    """Every file of the checkpoint, written into `stage` (an empty directory); `records` are what the
    head files record of the encoder (None where the model has no heads)."""
    model.config.classifier_pooling = model.pooling  # type: ignore[assignment]  # validated by the model
    # ModernBertModel.save_pretrained writes config.json and model.safetensors under the names
    # AutoModel expects; only those two files are taken from it.
    model.encoder.save_pretrained(stage, safe_serialization=True)
    tokenizer.save(stage / TOKENIZER_FILE)
    (stage / HEADS_DIR).mkdir()
    if records is not None and (stage / WEIGHTS_FILE).is_file():  # else refused below, naming the file
        # The probe was taken of the encoder in memory; the file is save_pretrained's. Were they apart
        # (a transformers release converting weights as it saves), load would refuse every head written.
        if not same_encoder(records.actual, read_encoder_probe(stage / WEIGHTS_FILE)):
            raise CheckpointError(
                f"the {WEIGHTS_FILE} save_pretrained wrote holds other weights than the encoder saved (its "
                "probe differs from the one taken in memory); nothing was saved"
            )
        for name, head in model.heads.items():
            metadata = head_metadata(name, records.probes[name])
            _save_tensors(stage / HEADS_DIR / f"{name}.safetensors", head.state_dict(), metadata)
    (stage / META_FILE).write_text(meta_text, encoding="utf-8")
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, META_FILE):
        if not (stage / name).is_file():  # before the old checkpoint is touched
            raise CheckpointError(f"saving the checkpoint wrote no {name} (a sharded save_pretrained?)")
        (stage / name).chmod(FILE_MODE)  # save_pretrained may write through a 0600 temporary file
    for file in (stage / HEADS_DIR).iterdir():
        file.chmod(FILE_MODE)


def _move_stage_in(stage: Path, root: Path, heads: set[str]) -> None:
    """Rename the staged checkpoint's files over `root`'s; htmllm.json goes first and comes back last,
    so that in between `root` is refused by every reader (no mix of the old files and the new)."""
    (root / META_FILE).unlink(missing_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
        os.replace(stage / name, root / name)
    heads_dir = root / HEADS_DIR
    heads_dir.mkdir(exist_ok=True)
    for file in sorted((stage / HEADS_DIR).iterdir()):
        os.replace(file, heads_dir / file.name)
    # Saved over a checkpoint with other heads: their files go (left, they changed the checkpoint's
    # fingerprint and load would refuse them as unlisted heads).
    for orphan in heads_dir.glob("*.safetensors"):
        if orphan.stem not in heads:
            orphan.unlink(missing_ok=True)
    os.replace(stage / META_FILE, root / META_FILE)


def read_meta(path: str | Path) -> CheckpointMeta:
    """htmllm.json alone (cheap: for listing models without loading weights)."""
    root = Path(path)
    return heads_stage.consistently(root, lambda view: read_meta_file(root, view.meta_file))


def checkpoint_fingerprint(path: str | Path) -> str:
    """sha256 over what determines a checkpoint's outputs: config.json, htmllm.json (which pins the
    tokenizer by its hash), the weights and every head file. What an ONNX graph records of the
    checkpoint it was built from, and what `htmllm embed` pins so that a resume cannot mix two models.

    Size and mtime would not do: a copied checkpoint differs in both, a retrained one of the same size
    need not. Cost: 25 ms for the bundled model's 30 MB (about 1.3 GB/s warm). A committed stage that
    cannot be completed is read through, as a load reads it: the fingerprint is the completed one's.
    """
    root = Path(path)
    if not root.is_dir():  # said as load says it, not as "cannot read config.json"
        raise CheckpointError(_not_a_checkpoint_directory(root))
    return heads_stage.consistently(root, partial(_fingerprint, root))


def _fingerprint(root: Path, view: heads_stage.View) -> str:
    named = [
        (CONFIG_FILE, root / CONFIG_FILE),
        (META_FILE, view.meta_file),
        (WEIGHTS_FILE, root / WEIGHTS_FILE),
    ]
    for file in sorted(view.head_files.values(), key=lambda file: file.name):  # as the file names sort
        named.append((f"{HEADS_DIR}/{file.name}", file))
    digest = hashlib.sha256()
    for name, file in named:
        digest.update(name.encode() + b"\0")
        try:
            with file.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as exc:
            raise heads_stage.unreadable(file, exc) from exc
    return digest.hexdigest()


def copy_checkpoint(path: str | Path, out: str | Path) -> None:
    """Copy a checkpoint's files (config.json, weights, tokenizer, htmllm.json, heads/) into `out`
    (created if missing; those files, and heads/ as a whole, replaced), as the checkpoint a load reads:
    a committed `save_heads` stage completed first, or read through where the checkpoint is read-only;
    no stage or lock file is copied.

    Copied file by file without the heads lock, a `save_heads` finishing between htmllm.json and heads/
    had given the copy the old labels over the new weights (or a head htmllm.json does not list): the
    copy is made as a lock-free load reads (`heads_stage.consistently`), and made again when a save
    overtakes it. Raises CheckpointError where a file cannot be copied, or the checkpoint kept changing
    (`out` is then left incomplete).
    """
    root, target = Path(path), Path(out)
    if not root.is_dir():
        raise CheckpointError(_not_a_checkpoint_directory(root))
    if target.exists() and target.resolve() == root.resolve():
        raise CheckpointError(f"cannot copy checkpoint {root} onto itself")
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(DIRECTORY_MODE)
    heads_stage.consistently(root, partial(_copy_view, root, target))


def _copy_view(root: Path, target: Path, view: heads_stage.View) -> None:
    """One attempt of `copy_checkpoint`: every file a reader of `view` reads, htmllm.json before the
    heads (a save overtaking the copy between them is what `consistently` looks for)."""
    named = [
        (CONFIG_FILE, root / CONFIG_FILE),
        (WEIGHTS_FILE, root / WEIGHTS_FILE),
        (TOKENIZER_FILE, root / TOKENIZER_FILE),
        (META_FILE, view.meta_file),
    ]
    named += [(f"{HEADS_DIR}/{file.name}", file) for file in sorted(view.head_files.values())]
    heads_dir = target / HEADS_DIR
    name = f"{HEADS_DIR}/"
    try:
        shutil.rmtree(heads_dir, ignore_errors=True)  # the head files of an attempt a save overtook
        if view.head_files:
            heads_dir.mkdir()
            heads_dir.chmod(DIRECTORY_MODE)
        for name, file in named:
            _copy_file(file, target / name)
    except OSError as exc:
        raise CheckpointError(f"checkpoint {root}: cannot copy {name} to {target}: {exc}") from exc


# A copy's directories, as its files (`FILE_MODE`), readable by the service's user whatever the umask.
DIRECTORY_MODE = 0o755


def _copy_file(source: Path, destination: Path) -> None:
    """Copy one file, readable by other users (an atomic write may have left the source 0600)."""
    shutil.copyfile(source, destination)
    destination.chmod(FILE_MODE)


def require_file(file: Path, missing: str | None = None) -> None:
    """CheckpointError unless `file` is a regular file (or a link to one) this process may open (else
    `missing`, or "is missing"). A path the file system cannot even look up (a name too long, a NUL) is
    the checkpoint's error too, not a raw OSError.

    Opened here, not left to the reader: safetensors reports a file it may not open (0600, another
    owner) as "No such file or directory", which sent an operator looking for a file that was there."""
    try:
        present = file.is_file()
    except PermissionError as exc:  # a directory above it that this user may not search
        raise heads_stage.unreadable(file, exc) from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{quoted(str(file), 200)} cannot be read: {cause(exc)}") from exc
    if not present:
        raise CheckpointError(missing or f"{file} is missing")
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise heads_stage.unreadable(file, exc) from exc


def _read_header(file: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, str]]:
    """name -> (shape, safetensors dtype) from the file's header, reading no tensor data; and the
    header's metadata (empty where it has none)."""
    require_file(file)
    try:
        with safe_open(str(file), framework="pt") as handle:
            header: dict[str, tuple[tuple[int, ...], str]] = {}
            for key in handle.keys():  # noqa: SIM118  # safe_open handles are not iterable
                tensor = handle.get_slice(key)
                header[key] = (tuple(tensor.get_shape()), str(tensor.get_dtype()))
            return header, dict(handle.metadata() or {})
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file} is not a valid safetensors file: {cause(exc)}") from exc


def _check_header(
    expected: Mapping[str, torch.Tensor], header: Mapping[str, tuple[tuple[int, ...], str]], origin: Path
) -> None:
    """The tensors a file's header declares against those of the module the config describes (built on
    the meta device): names, shapes and a floating-point dtype, before either is allocated."""
    for key, (_, dtype) in header.items():
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{origin}: tensor {key} has dtype {quoted(dtype)}; weights must be floating point "
                f"({', '.join(FLOAT_DTYPES)})"
            )
    _check_shapes(expected, {key: shape for key, (shape, _) in header.items()}, origin)


def _check_shapes(
    expected: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]], origin: Path
) -> None:
    """The tensor names and shapes a file has (`shapes`) against the module's (`expected`)."""
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{origin}: tensors do not match the architecture (missing {[quoted(k) for k in missing[:5]]}, "
            f"unexpected {[quoted(k) for k in unexpected[:5]]})"
        )
    for key, shape in shapes.items():
        if tuple(shape) != tuple(expected[key].shape):
            raise CheckpointError(
                f"{origin}: tensor {key} has shape {tuple(shape)}, config needs {tuple(expected[key].shape)}"
            )


def _load_tensors(file: Path) -> dict[str, torch.Tensor]:
    require_file(file)
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file} is not a valid safetensors file: {cause(exc)}") from exc


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], origin: Path) -> None:
    # The header was checked already; this is for the file replaced in between, and for NaN weights.
    _check_shapes(module.state_dict(), {key: tuple(value.shape) for key, value in state.items()}, origin)
    check_state(state, origin)
    module.load_state_dict(state, strict=True)


@dataclass
class _Heads:
    modules: dict[str, TaskHead]
    probes: dict[Path, EncoderProbe]  # head file -> the probe it records of its encoder (where it has one)


def _load_heads(
    root: Path, head_files: Mapping[str, Path], specs: list[HeadSpec], embedding_dim: int
) -> _Heads:
    """The heads named in `specs`, each strictly loaded from its file (`head_files`: the reader's view,
    heads/<name>.safetensors by default), and the encoder probes their files record.

    Every head file's header is checked against its spec before any head is allocated (a hidden of
    2**36 in htmllm.json is a mismatch to report, not an allocation to attempt).
    """
    files = {s.name: head_files.get(s.name, root / HEADS_DIR / f"{s.name}.safetensors") for s in specs}
    probes: dict[Path, EncoderProbe] = {}
    for spec in specs:
        file = files[spec.name]
        shapes = on_meta_device(partial(TaskHead, spec, embedding_dim), f"{META_FILE} head {spec.name!r}")
        header, metadata = _read_header(file)
        check_head_file(spec, embedding_dim, header, metadata, file)
        _check_header(shapes.state_dict(), header, file)
        probe = recorded_probe(metadata, file)
        if probe is not None:
            probes[file] = probe
    heads: dict[str, TaskHead] = {}
    for spec in specs:
        head = TaskHead(spec, embedding_dim)
        _load_strict(head, _load_tensors(files[spec.name]), files[spec.name])
        # Kept with the head: saved again (with another encoder, say), it records what its file did.
        set_loaded_probe(head, probes.get(files[spec.name]))
        heads[spec.name] = head.eval()
    return _Heads(heads, probes)


def head_refusals(
    root: Path, embedding_dim: int, encoder: EncoderProbe, view: heads_stage.View
) -> dict[str, str]:
    """Head name -> why `load_checkpoint` refuses it, for each head of htmllm.json as a reader sees it
    (`view`), beside an encoder of `embedding_dim` whose weights `encoder` probes.

    The loader's own checks of one head, so a pre-deploy evaluation (`unservable_heads`) names every
    broken head by the service's decision, reading the encoder's weights once, not once per head."""
    refused: dict[str, str] = {}
    for spec in read_meta_file(root, view.meta_file).heads:
        try:
            loaded = _load_heads(root, view.head_files, [spec], embedding_dim)
            if loaded.probes:
                check_heads_encoder(loaded.probes, encoder)
        except CheckpointError as exc:
            refused[spec.name] = str(exc)
    return refused


def _read_config(root: Path) -> tuple[ModernBertConfig, dict[str, Any]]:
    """config.json as transformers reads it, and its raw JSON (to tell a key given from a default)."""
    file = root / CONFIG_FILE
    try:
        config = ModernBertConfig.from_json_file(str(file))
        raw = json.loads(file.read_text(encoding="utf-8"))
    except Exception as exc:  # transformers' validation raises errors of its own (a strict-field error)
        raise CheckpointError(f"{file} is not a valid ModernBERT config: {cause(exc)}") from exc
    if getattr(config, "model_type", None) != "modernbert" or not isinstance(raw, dict):
        raise CheckpointError(f"{file} is not a ModernBERT config")
    return config, raw


def _check_layer_count(config: ModernBertConfig, header: Mapping[str, object], origin: Path) -> None:
    """num_hidden_layers against the layers the weights hold, before a module is built: even on the
    meta device a hand-edited million layers would take minutes to construct."""
    found = len({key.split(".")[1] for key in header if key.startswith("layers.")})
    if config.num_hidden_layers != found:
        raise CheckpointError(
            f"{CONFIG_FILE} says num_hidden_layers {quoted(config.num_hidden_layers)}, {origin} holds "
            f"{found} layers"
        )


def load_checkpoint(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    attn_implementation: str | None = None,
    without_heads: Collection[str] = (),
) -> Checkpoint:
    """Strictly load a checkpoint in eval mode. `dtype` applies to the encoder; heads stay float32.

    `attn_implementation` ("sdpa", "eager", "flash_attention_2") defaults to SDPA. Every size the
    config and htmllm.json declare is checked against the files before anything is allocated.
    `without_heads` leaves those heads (their htmllm.json entries and files) out, unread: the checkpoint
    as a save replacing them will leave it (`htmllm heads train` checks it loads before it trains).
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(_not_a_checkpoint_directory(root))
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, META_FILE):
        # Readable, too: transformers and the tokenizer would report an unreadable file as invalid.
        require_file(root / name, f"checkpoint {root} is missing {name}")
    load = partial(
        _load_checkpoint,
        root,
        device=device,
        dtype=dtype,
        attn_implementation=attn_implementation,
        without_heads=frozenset(without_heads),
    )
    return heads_stage.consistently(root, load)


def _load_checkpoint(
    root: Path,
    view: heads_stage.View,
    *,
    device: str | torch.device,
    dtype: torch.dtype | None,
    attn_implementation: str | None,
    without_heads: frozenset[str],
) -> Checkpoint:
    meta = read_meta_file(root, view.meta_file)
    head_files = dict(view.head_files)
    if without_heads:
        meta = dataclasses.replace(meta, heads=[h for h in meta.heads if h.name not in without_heads])
        head_files = {name: file for name, file in head_files.items() if name not in without_heads}
    refuse_unlisted_heads(root, meta, head_files)
    try:
        tokenizer = HtmlTokenizer.from_file(root / TOKENIZER_FILE)
    except TokenizerError as exc:
        raise CheckpointError(f"checkpoint {root}: {exc}") from exc
    config, raw_config = _read_config(root)
    # Check the vocabulary and special ids before building the model: a mismatch is the likeliest
    # failure and the clearest to report, and it must not surface as a tensor-shape error or an assertion.
    check_config_matches(config, tokenizer, meta, CONFIG_FILE)
    if "classifier_pooling" in raw_config and raw_config["classifier_pooling"] != meta.pooling:
        # save_checkpoint writes the two alike; apart, AutoModel users and the service would pool apart.
        raise CheckpointError(
            f"{CONFIG_FILE} says classifier_pooling {quoted(raw_config['classifier_pooling'])}, "
            f"{META_FILE} says pooling {meta.pooling!r}"
        )
    weights = root / WEIGHTS_FILE
    header, _ = _read_header(weights)
    _check_layer_count(config, header, weights)
    _check_header(
        on_meta_device(partial(ModernBertModel, config), root / CONFIG_FILE).state_dict(), header, weights
    )
    heads = _load_heads(root, head_files, meta.heads, int(config.hidden_size))
    try:
        encoder = ModernBertModel(config)
    except Exception as exc:  # built once on the meta device already; this is for what that cannot see
        raise CheckpointError(f"{root / CONFIG_FILE} describes no buildable model: {cause(exc)}") from exc
    encoder.set_attn_implementation(attn_implementation or "sdpa")
    _load_strict(encoder, _load_tensors(weights), weights)
    if heads.probes:  # after the encoder's own checks (NaN weights) are said; no probe, no encoder read
        check_heads_encoder(heads.probes, read_encoder_probe(weights))
    model = HtmlEncoderModel(encoder, pooling=meta.pooling, heads=heads.modules)
    check_model_matches(model, tokenizer, meta)
    model.eval()
    model.place(device, dtype)
    return Checkpoint(model=model, tokenizer=tokenizer, meta=meta, path=root)


def save_heads(
    path: str | Path,
    heads: Mapping[str, tuple[HeadSpec, TaskHead]],
    *,
    fit_on: Sequence[float] | None = None,
) -> None:
    """Add or replace task heads in an existing checkpoint, leaving the encoder untouched.

    Every head is checked against its spec and the encoder's width before any file is written: a
    module that does not match its spec (labels, hidden) had been written, and the checkpoint then
    refused to load. A head's name must pass `new_head_name_problem`, as a task's must.

    Each head file records a probe of the checkpoint's encoder (`encoder_probe`), which load compares
    with the encoder it finds. `fit_on` is the probe of the encoder whose embeddings the heads were fit
    on, where the caller took one (`htmllm heads train` does): the save is refused when the checkpoint's
    encoder is another by now (replaced while the heads trained), rather than the heads being recorded
    as this encoder's. A head loaded from a checkpoint records what its file recorded, and is refused
    where that is another encoder than this checkpoint's (`probes_to_record`), as `save_checkpoint` does.

    A kill at any point leaves the old checkpoint or the new one, never a mix: the new head files and
    htmllm.json are staged in heads/.pending/, htmllm.json last (the commit point), and moved into place
    holding the heads lock, here or by the next reader (see `service.core.heads_stage`). The format is
    unchanged: a finished checkpoint holds no stage.
    """
    root = Path(path)
    for name in heads:
        problem = new_head_name_problem(name)
        if problem is not None:
            raise CheckpointError(f"head {quoted(name)}: {problem}")
    read_meta(root)  # an htmllm checkpoint (refused before anything is created), its stage completed
    with heads_stage.heads_lock(root):
        heads_stage.finish_locked(root)  # a stage committed since, by a save that was then killed
        _save_heads_locked(root, read_meta_file(root, root / META_FILE), heads, fit_on)


def _save_heads_locked(
    root: Path,
    meta: CheckpointMeta,
    heads: Mapping[str, tuple[HeadSpec, TaskHead]],
    fit_on: Sequence[float] | None,
) -> None:
    config_file = root / CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"checkpoint {root} is missing {CONFIG_FILE}")
    try:
        hidden = typed_field(json.loads(config_file.read_text(encoding="utf-8")), "hidden_size", int)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{config_file} gives no hidden_size: {cause(exc)}") from exc
    specs = {spec.name: spec for spec in meta.heads}
    alike = case_clash([*(n for n in specs if n not in heads), *heads])
    if alike is not None:
        raise CheckpointError(
            f"heads {alike[0]!r} and {alike[1]!r} differ only in case, which a case-insensitive file system "
            "(macOS, a Windows share) holds as one file: rename one (`htmllm heads rename`)"
        )
    for name, (spec, head) in heads.items():
        if name != spec.name or head.spec.name != spec.name:
            raise CheckpointError(f"head {name!r}: name, spec and module disagree")
        if head.norm.normalized_shape != (hidden,):
            raise CheckpointError(
                f"head {name!r} takes {head.norm.normalized_shape[0]}-d input, not {hidden}"
            )
        check_head_module(name, spec, head, hidden)
        check_state(head.state_dict(), f"head {name!r}")
        specs[name] = spec
    meta_text = meta_file_text(dataclasses.replace(meta, heads=list(specs.values())))
    actual = read_encoder_probe(root / WEIGHTS_FILE)
    if fit_on is not None and not probes_match(list(fit_on), actual.values()):
        raise CheckpointError(
            f"the heads {sorted(heads)} were fit on the embeddings of another encoder than {root}'s "
            f"{WEIGHTS_FILE} (replaced while they trained?); none was saved: train them again"
        )
    probes = probes_to_record({name: head for name, (_spec, head) in heads.items()}, actual, str(root))
    pending = root / HEADS_DIR / PENDING_DIR
    shutil.rmtree(pending, ignore_errors=True)  # a stage never committed: its save was killed
    pending.mkdir(parents=True)
    for name, (_spec, head) in heads.items():
        _atomic_save_tensors(
            pending / f"{name}.safetensors", head.state_dict(), head_metadata(name, probes[name])
        )
    _atomic_write_text(pending / META_FILE, meta_text)  # the commit point
    heads_stage.finish_locked(root)


def _not_a_checkpoint_directory(root: Path) -> str:
    """Why `root` is no checkpoint directory: missing, or a file (`--checkpoint model.safetensors`)."""
    if root.exists():
        return f"checkpoint {root} is not a directory (a checkpoint is the directory holding {META_FILE})"
    return f"checkpoint directory {root} does not exist"
