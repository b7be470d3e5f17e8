"""A checkpoint's head files' own rules: what a head added now may be called, what its file's safetensors
metadata records (the head it holds, a probe of the encoder it was fit on), the checks a loaded head
file must pass against htmllm.json and the encoder beside it, and which probe a head saved again records.

A loaded head keeps the probe its file records (`loaded_probe`): saved again, it records that probe, not
the one of the encoder it is saved with, and is refused where the two differ. Stamped with the encoder it
was saved with, a head loaded from one checkpoint and saved with another training run's encoder (same
width) had passed the load check although it was fit on other embeddings.

Kept apart from the directory's I/O, as `checkpoint_format` is, so that `service.core.checkpoint` (which
reads and writes the files, the encoder's probe included: `read_encoder_probe`) depends on it one way;
`checkpoint` re-exports the public names, which callers import from there. The exception: the two edits
of a checkpoint's heads that need no model, `remove_head` and `rename_head` (`htmllm heads remove`,
`htmllm heads rename`), which rewrite htmllm.json and a head file's metadata through the heads stage,
under its lock, as `save_heads` adds heads (hand edits had been the only way, and a kill between
htmllm.json and heads/ left a checkpoint load refuses).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from service.core.checkpoint_format import (
    WEIGHTS_FILE,
    CheckpointMeta,
    cause,
    meta_file_text,
    quoted,
    read_meta_file,
)
from service.core.errors import CheckpointError, ErrorCode
from service.core.heads_stage import HEADS_DIR, META_FILE, commit_locked, finish_locked, heads_lock
from service.core.modeling import MAX_HEAD_NAME_BYTES, HeadSpec

# A head file's safetensors metadata: the head it holds, and a probe of the encoder it was fit on: its
# 2-D tensors (every file that records a probe), and its 1-D ones (LayerNorm weights; in files written
# since a fine-tune of the norms alone went unseen). Two keys, not one longer list: a reader of before
# compares `encoder_probe` alone, with its own rule, and still loads the heads written now.
HEAD_NAME_KEY = "head"
ENCODER_PROBE_KEY = "encoder_probe"
ENCODER_VECTORS_KEY = "encoder_probe_vectors"
# Cells read per encoder tensor for the probe (a few hundred values for the `base` preset).
_PROBE_ROWS = 4
# A probe value matches within this relative error: a cast of the weights to float16 or bfloat16 moves
# each by at most 2**-9 of itself (round to nearest), twice that through float16 on the way; another
# encoder (another run, or the same one trained on) moves most weights by far more.
_PROBE_RTOL = 2**-7
_PROBE_ATOL = 1e-7  # float16's subnormals (below 6.1e-5) are spaced 6e-8 apart

# The columns every `htmllm embed` row has (`service.commands.embed.FIXED_COLUMNS`, which a test holds
# equal): a head writes the column of its own name, so a head added under one of these names (`save_heads`,
# `htmllm heads train`) would make embed refuse the checkpoint's heads while the service served them.
RESERVED_HEAD_NAMES = frozenset(
    {"index", "id", "url", "http_status", "content_type", "warc_truncated", "embedding", "tokens",
     "truncated", "error", "error_message"}
)  # fmt: skip
# What a head added now may be called: a task's name (`model_training.evaluation.tasks`), which is also a
# parquet column, a JSON key and a file name everywhere. `HeadSpec` is wider, so that older checkpoints
# holding other names still load.
_NEW_HEAD_NAME = re.compile(r"[A-Za-z0-9_-]+")


def new_head_name_problem(name: str) -> str | None:
    """Why `name` cannot name a head being added to a checkpoint, or None: the one rule `save_heads` and
    `htmllm heads train` share (the Python API had saved `spam v2` and `embedding`, which `heads train`
    refuses, and `htmllm embed` then refused the checkpoint while the service served it)."""
    if not _NEW_HEAD_NAME.fullmatch(name):
        return "a head name must be ASCII letters, digits, '_' and '-'"
    if len(name) > MAX_HEAD_NAME_BYTES:  # ASCII by now: a byte a letter
        # `HeadSpec`'s own rule, which had refused it only once every page was embedded (`heads train`),
        # or as a traceback (`heads rename`).
        return f"a head name is at most {MAX_HEAD_NAME_BYTES} characters (its file's name), not {len(name)}"
    if name in RESERVED_HEAD_NAMES:
        return (
            f"a head writes the `htmllm embed` column of its name, and the column {name!r} is one every "
            "row already has (`htmllm embed` would refuse the checkpoint's heads)"
        )
    return None


def case_clash(names: Sequence[str]) -> tuple[str, str] | None:
    """Two of `names` that differ only in case, or None: one file on a case-insensitive file system
    (`heads/Language.safetensors` is `heads/language.safetensors` there), so a checkpoint holding both
    loses one of them when it is copied to macOS or a Windows share."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.casefold(), name)
        if other != name:
            return other, name
    return None


@dataclass(frozen=True)
class EncoderProbe:
    """An encoder's weights at the cells `probe_cells` and `vector_cells` name: what a head file
    records of the encoder it was fit on. `vectors` is None for a probe read from a file written before
    1-D tensors were probed: such a probe is compared by its matrices alone, the rule it was written by."""

    matrices: tuple[float, ...]
    vectors: tuple[float, ...] | None

    def values(self) -> list[float]:
        """Matrices, then vectors: the one list `save_heads(fit_on=...)` takes."""
        return [*self.matrices, *(self.vectors or ())]


def probe_cells(shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, int, int]]:
    """(tensor, row, column) of each probed matrix weight: `_PROBE_ROWS` spread rows of every 2-D
    tensor, at a column that varies with the row. The rule of `ENCODER_PROBE_KEY` since it was
    written: changed, every head file recorded before would be refused."""
    cells = []
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) != 2 or 0 in shape:
            continue
        rows, columns = shape
        for i in range(_PROBE_ROWS):
            row = i * (rows - 1) // max(_PROBE_ROWS - 1, 1)
            cells.append((name, row, (row * 7919 + i * 104729) % columns))
    return cells


def vector_cells(shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[str, int]]:
    """(tensor, index) of each probed 1-D weight (`ENCODER_VECTORS_KEY`): `_PROBE_ROWS` spread indices
    of every 1-D tensor, the LayerNorm weights (and biases, where a config has them), which a fine-tune
    may change while leaving every matrix as it was."""
    cells = []
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) != 1 or shape[0] == 0:
            continue
        for i in range(_PROBE_ROWS):
            cells.append((name, i * (shape[0] - 1) // max(_PROBE_ROWS - 1, 1)))
    return cells


def state_probe(state: Mapping[str, torch.Tensor]) -> EncoderProbe:
    """The probe of an encoder's weights in memory (its `state_dict()`): cell for cell the values
    `checkpoint.read_encoder_probe` reads from the file `save_pretrained` writes of that state (the same
    tensors, in their dtype), so that `save_checkpoint` can refuse a loaded head before it writes any
    file, rather than after the whole encoder was written."""
    shapes = {name: tuple(tensor.shape) for name, tensor in state.items()}
    matrices = tuple(float(state[name][row, column].float()) for name, row, column in probe_cells(shapes))
    vectors = tuple(float(state[name][index].float()) for name, index in vector_cells(shapes))
    return EncoderProbe(matrices, vectors or None)  # none recorded where there are none, as read


def probes_match(recorded: Sequence[float], actual: Sequence[float]) -> bool:
    return len(recorded) == len(actual) and all(
        math.isclose(a, b, rel_tol=_PROBE_RTOL, abs_tol=_PROBE_ATOL)
        for a, b in zip(recorded, actual, strict=True)
    )


def same_encoder(recorded: EncoderProbe, actual: EncoderProbe) -> bool:
    """Whether `actual` is the encoder `recorded` was read from (or a float16/bfloat16 cast of it), by
    the rule `recorded` was written with: its vectors are compared only where it has them."""
    if not probes_match(recorded.matrices, actual.matrices):
        return False
    return recorded.vectors is None or probes_match(recorded.vectors, actual.vectors or ())


def head_metadata(name: str, probe: EncoderProbe) -> dict[str, str]:
    """What a head file written now records: its head's name, and the encoder it was fit on (its vectors
    left out where `probe` has none: a head loaded from a file of before, saved again as recorded)."""
    metadata = {HEAD_NAME_KEY: name, ENCODER_PROBE_KEY: json.dumps(list(probe.matrices))}
    if probe.vectors is not None:
        metadata[ENCODER_VECTORS_KEY] = json.dumps(list(probe.vectors))
    return metadata


# The attribute of a loaded `TaskHead` holding the probe its file recorded (not a buffer: that would be
# a tensor of the head's state, and of its file). Kept through `copy.deepcopy` and `.to()`; a new
# `TaskHead` given the weights by `load_state_dict` has none.
_LOADED_PROBE_ATTRIBUTE = "htmllm_loaded_probe"


def loaded_probe(head: nn.Module) -> EncoderProbe | None:
    """The probe of the encoder `head` was fit on, as its file recorded it when it was loaded; None for
    a head made in this process, or loaded from a file that records none (written before probes)."""
    probe = getattr(head, _LOADED_PROBE_ATTRIBUTE, None)
    return probe if isinstance(probe, EncoderProbe) else None


def set_loaded_probe(head: nn.Module, probe: EncoderProbe | None) -> None:
    """Record on `head` the probe its file holds (load does), or forget it (None): a head trained
    further on another encoder in this process is then saved as that encoder's."""
    setattr(head, _LOADED_PROBE_ATTRIBUTE, probe)


def probes_to_record(
    heads: Mapping[str, nn.Module], actual: EncoderProbe, where: str
) -> dict[str, EncoderProbe]:
    """The probe each head's file records when saved with the encoder probed as `actual` into `where`:
    the one its file recorded where it was loaded from one, so that a head fit on another encoder is
    not recorded as this one's; else `actual` (a head fit in this process, or from a file of before).

    Raises CheckpointError where a recorded encoder is not this one (the heads and the encoder they are
    saved with are of different trainings, and a load would refuse the checkpoint), naming every such
    head at once: after a fine-tune each of them is one, and naming the first alone had taken the user
    one refused save per head."""
    records: dict[str, EncoderProbe] = {}
    refused: list[str] = []
    for name, head in heads.items():
        recorded = loaded_probe(head)
        if recorded is None:
            records[name] = actual
        elif same_encoder(recorded, actual):
            records[name] = recorded
        else:
            refused.append(name)
    if not refused:
        return records
    refused.sort()
    one = len(refused) == 1
    heads_were = f"head {refused[0]!r} was" if one else f"heads {', '.join(map(repr, refused))} were"
    its, it = ("its", "it") if one else ("their", "them")
    raise CheckpointError(
        f"{heads_were} loaded from {'a head file' if one else 'head files'} fit on the embeddings of another "
        f"encoder than the one saved into {where} (the weights {its} {'file' if one else 'files'} recorded "
        f"of that encoder differ): saved with it, {its} scores and metrics would not hold, and a load "
        f"refuses {it}; nothing was saved. Train {'the head' if one else 'these heads'} on this encoder "
        f"(`htmllm heads train`), or, if this process trained {it} on this encoder, call "
        f"`service.core.checkpoint.set_loaded_probe(head, None)` {'' if one else 'for each '}before saving"
    )


def check_head_file(
    spec: HeadSpec,
    embedding_dim: int,
    header: Mapping[str, tuple[tuple[int, ...], str]],
    metadata: Mapping[str, str],
    file: Path,
) -> None:
    """What a head file says of itself against the spec htmllm.json gives it: the head it holds (a
    page_kind file copied over tld's, with as many outputs, had served page_kind's scores under tld's
    labels and metrics), its outputs and its input width, said as such rather than as tensor shapes."""
    found = metadata.get(HEAD_NAME_KEY)
    if found is not None and found != spec.name:
        raise CheckpointError(
            f"{file} holds head {quoted(found)} (its metadata says so), where {META_FILE} expects head "
            f"{spec.name!r}: a head file copied or renamed? Retrain the head, restore its own file, or "
            "remove the head (`htmllm heads remove`)"
        )
    outputs = header.get("out.bias", ((), ""))[0]
    if len(outputs) == 1 and outputs[0] != spec.outputs:
        listed = (
            f"lists {spec.outputs} labels for it ({', '.join(spec.labels[:10])})"
            if spec.kind == "classification"
            else "makes it a regression head (1 output)"
        )
        plural = "" if outputs[0] == 1 else "s"
        raise CheckpointError(
            f"{file}: head {spec.name!r} has {outputs[0]} output{plural}, but {META_FILE} {listed}: the "
            "head's labels and its weights are of different trainings"
        )
    width = header.get("norm.weight", ((), ""))[0]
    if len(width) == 1 and width[0] != embedding_dim:
        raise CheckpointError(
            f"{file}: head {spec.name!r} takes {width[0]}-d embeddings, this encoder gives {embedding_dim}: "
            "it was fit on another model"
        )


def recorded_probe(metadata: Mapping[str, str], file: Path) -> EncoderProbe | None:
    """The probe a head file's metadata records, or None where it records none (written before heads
    recorded their encoder, as the bundled model's). Vectors without matrices are a hand edit."""
    if ENCODER_PROBE_KEY not in metadata:
        if ENCODER_VECTORS_KEY in metadata:
            raise CheckpointError(
                f"{file}: its metadata has {ENCODER_VECTORS_KEY} but no {ENCODER_PROBE_KEY} (a hand edit, or "
                "a corrupt file): retrain the head (`htmllm heads train`) or restore its file"
            )
        return None
    vectors = metadata.get(ENCODER_VECTORS_KEY)
    return EncoderProbe(
        tuple(_recorded_values(metadata[ENCODER_PROBE_KEY], ENCODER_PROBE_KEY, file)),
        None if vectors is None else tuple(_recorded_values(vectors, ENCODER_VECTORS_KEY, file)),
    )


def _recorded_values(text: str, key: str, file: Path) -> list[float]:
    try:
        probe = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{file}: its {key} metadata is no JSON: {cause(exc)}") from exc
    if not isinstance(probe, list) or not all(
        isinstance(v, float | int) and not isinstance(v, bool) for v in probe
    ):
        raise CheckpointError(f"{file}: its {key} metadata is not a list of numbers")
    try:
        values = [float(v) for v in probe]
    except OverflowError:  # an integer of hundreds of digits (json reads up to 4,300)
        values = [math.inf]
    if not values or not all(math.isfinite(v) for v in values):
        # A corrupt record, not another encoder: said as one, rather than sending the user to retrain.
        raise CheckpointError(
            f"{file}: its {key} metadata is {'empty' if not values else 'not all finite'} "
            "(a hand edit, or a corrupt file): retrain the head (`htmllm heads train`) or restore its file"
        )
    return values


def check_heads_encoder(probes: Mapping[Path, EncoderProbe], actual: EncoderProbe) -> None:
    """Refuse a head fit on another encoder's embeddings (of the same width): it loads and runs, and
    its scores, and the metrics htmllm.json records for it, are of a model that is not this one.
    `probes` holds the files that record a probe; `actual` is the checkpoint's encoder's. Files without
    a probe (written before heads recorded one, as the bundled model's) load as before, and files
    without vectors are compared by their matrices alone.

    One error names every such file: after a fine-tune each head is one, and `htmllm heads train`,
    which refuses a checkpoint holding one it does not replace, had been refused once per head. A
    corrupt record is said first, as such (retraining is not what it needs)."""
    for file, recorded in sorted(probes.items()):
        parts = [(ENCODER_PROBE_KEY, recorded.matrices, actual.matrices)]
        if recorded.vectors is not None:
            parts.append((ENCODER_VECTORS_KEY, recorded.vectors, actual.vectors or ()))
        for key, values, expected in parts:
            if len(values) != len(expected):
                raise CheckpointError(
                    f"{file}: its {key} metadata holds {len(values)} values where this checkpoint's "
                    f"{WEIGHTS_FILE} gives {len(expected)} (a hand edit, a corrupt file, or an encoder of "
                    "another architecture): retrain the head (`htmllm heads train`) or restore its file"
                )
    vectors_only: dict[Path, bool] = {}  # file -> whether its matrices match (its vectors do not)
    for file, recorded in sorted(probes.items()):
        if not same_encoder(recorded, actual):
            vectors_only[file] = probes_match(recorded.matrices, actual.matrices)
    if not vectors_only:
        return
    files = list(vectors_only)
    if len(files) == 1:
        raise CheckpointError(
            f"{files[0]} was fit on the embeddings of another encoder than this checkpoint's "
            f"{WEIGHTS_FILE} ({_differ(vectors_only[files[0]], 'its')}): its scores and the metrics "
            f"{META_FILE} records for it would not hold here. Train it on this checkpoint (`htmllm heads "
            f"train`), or remove it (`htmllm heads remove`)"
        )
    groups = {kind: [file.name for file in files if vectors_only[file] == kind] for kind in (False, True)}
    groups = {kind: names for kind, names in groups.items() if names}
    reasons = (
        _differ(next(iter(groups)), "their")
        if len(groups) == 1
        else "; ".join(
            f"{', '.join(names)}: {_differ(kind, 'its' if len(names) == 1 else 'their')}"
            for kind, names in groups.items()
        )
    )
    raise CheckpointError(
        f"{len(files)} head files, {', '.join(map(str, files))}, were fit on the embeddings of another "
        f"encoder than this checkpoint's {WEIGHTS_FILE} ({reasons}): their scores and the metrics "
        f"{META_FILE} records for them would not hold here. Train them on this checkpoint, all in one "
        f"`htmllm heads train` (a task for each of {', '.join(sorted(file.stem for file in files))}), or "
        "remove them (`htmllm heads remove`)"
    )


def _differ(vectors_only: bool, its: str) -> str:
    """Which record of a head file (`its`: of one, `their`: of several) differs from the encoder's."""
    if vectors_only:
        return f"the LayerNorm weights {its} {ENCODER_VECTORS_KEY} metadata records differ: a fine-tune?"
    return f"the weights {its} {ENCODER_PROBE_KEY} metadata records differ"


def refuse_unlisted_heads(root: Path, meta: CheckpointMeta, head_files: Mapping[str, Path]) -> None:
    """A head file htmllm.json does not list is a hand edit gone wrong (a misspelt "heads" key, a head
    copied in): loading without it would silently serve fewer heads than the folder shows."""
    listed = {spec.name for spec in meta.heads}
    unlisted = sorted(f"{name}.safetensors" for name in head_files if name not in listed)
    if unlisted:
        raise CheckpointError(
            f"checkpoint {root}: {HEADS_DIR}/ holds {', '.join(unlisted[:5])} that {META_FILE} "
            f"does not list (it lists {sorted(listed)[:10]}); list them there or remove the files (`htmllm "
            "heads remove`)"
        )


def remove_head(path: str | Path, name: str) -> None:
    """Remove head `name` from the checkpoint at `path`: its htmllm.json entry and its file, together
    (a kill leaves both or neither, as `save_heads` does: `heads_stage.commit_locked`), under the heads
    lock. A head file htmllm.json does not list (which load refuses) can be removed too: load's error
    sends the user here. Neither the head's file nor any other head is read, so a head that no longer
    loads (fit on another encoder, a corrupt file) is removed as any other.

    Raises CheckpointError, code `unknown_head` where the checkpoint holds no such head, and
    `checkpoint_invalid` where it is no checkpoint or cannot be written.
    """
    root = Path(path)
    read_meta_file(root, root / META_FILE)  # a checkpoint (refused before heads/ or its lock is made)
    with heads_lock(root):
        finish_locked(root)  # a stage a killed save committed: the heads are those it gives
        meta = read_meta_file(root, root / META_FILE)
        listed = [spec.name for spec in meta.heads]
        if name not in listed and name not in _files_in_heads(root):
            raise _unknown(root, name, listed)
        specs = [spec for spec in meta.heads if spec.name != name]
        commit_locked(root, meta_file_text(dataclasses.replace(meta, heads=specs)), {}, [name])


def rename_head(path: str | Path, old: str, new: str) -> None:
    """Rename head `old` of the checkpoint at `path` to `new`: its htmllm.json entry (labels, metrics
    and place in the list kept), and its file, whose metadata names the head (load refuses a file
    naming another head: `check_head_file`), rewritten with `new` and its weights and encoder probe
    byte for byte as they were. Committed as one change, under the heads lock (`remove_head`).

    `new` must be a name a head added now may take (`new_head_name_problem`) and no head's of the
    checkpoint. Raises CheckpointError: code `unknown_head` where `old` is not listed in htmllm.json,
    `validation_error` where `new` is refused, `checkpoint_invalid` where the checkpoint or the head's
    file cannot be read or written.
    """
    root = Path(path)
    read_meta_file(root, root / META_FILE)
    problem = new_head_name_problem(new)
    if problem is not None:
        raise CheckpointError(f"head {quoted(new)}: {problem}", code=ErrorCode.VALIDATION)
    with heads_lock(root):
        finish_locked(root)
        meta = read_meta_file(root, root / META_FILE)
        listed = [spec.name for spec in meta.heads]
        if old not in listed:
            raise _unknown(root, old, listed)
        if new == old:
            raise CheckpointError(f"head {old!r} is called so already", code=ErrorCode.VALIDATION)
        # Another head's name, or one that differs from it only in case: on a case-insensitive file
        # system (macOS, a Windows share) both would be one file, and completing a stage again after a
        # kill would unlink the file just moved in.
        names = {*listed, *_files_in_heads(root)}
        if new in names:
            raise CheckpointError(
                f"checkpoint {root} has a head {new!r} already: remove it first (`htmllm heads remove`), or "
                "choose another name",
                code=ErrorCode.VALIDATION,
            )
        alike = case_clash([*sorted(names), new])
        if alike is not None:
            raise CheckpointError(
                f"head {new!r} differs from head {alike[0]!r} only in case, which a case-insensitive file "
                "system (macOS, a Windows share) holds as one file: choose another name",
                code=ErrorCode.VALIDATION,
            )
        file = root / HEADS_DIR / f"{old}.safetensors"
        try:
            data = file.read_bytes()
        except FileNotFoundError as exc:
            raise CheckpointError(
                f"{file} is missing, though {META_FILE} lists head {old!r}: restore the file, or remove the "
                "head (`htmllm heads remove`)"
            ) from exc
        except OSError as exc:
            raise CheckpointError(f"{file} cannot be read: {exc.strerror or exc}") from exc
        specs = [dataclasses.replace(spec, name=new) if spec.name == old else spec for spec in meta.heads]
        meta_text = meta_file_text(dataclasses.replace(meta, heads=specs))
        commit_locked(root, meta_text, {new: renamed_head_file(data, old, new, file)}, [old])


def renamed_head_file(data: bytes, old: str, new: str, file: Path) -> bytes:
    """The bytes of head file `data` (of `file`, head `old`) with its metadata naming head `new`: the
    header rewritten as `checkpoint._save_tensors` writes one (metadata first and sorted, compact JSON,
    spaces to a multiple of 8 bytes), the tensors' bytes as they were. So the file is the one a save of
    the same head under `new` writes, and renaming a head back gives the checkpoint's fingerprint back.

    Raises CheckpointError where `data` is no safetensors file, or its metadata names another head
    than `old` (a file copied over another's: renamed, it would be laundered into one load accepts)."""
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
    if not 0 < size <= len(data) - 8:
        raise CheckpointError(f"{file} is no safetensors file (its header is cut short): restore it")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError as exc:  # not JSON, or not UTF-8
        raise CheckpointError(f"{file}: its safetensors header cannot be read: {cause(exc)}") from exc
    metadata = header.get("__metadata__", {}) if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{file}: its safetensors header is not a JSON object with a metadata object")
    found = metadata.get(HEAD_NAME_KEY)
    if found is not None and found != old:
        raise CheckpointError(
            f"{file} holds head {quoted(found)} (its metadata says so), not {old!r}: a head file copied or "
            f"renamed by hand? Restore the head's own file, or remove the head (`htmllm heads remove`)"
        )
    tensors = {key: value for key, value in header.items() if key != "__metadata__"}
    rewritten = {"__metadata__": dict(sorted({**metadata, HEAD_NAME_KEY: new}.items())), **tensors}
    text = json.dumps(rewritten, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + size :]


def _files_in_heads(root: Path) -> set[str]:
    """The names of the head files in `root`'s heads/, listed in htmllm.json or not."""
    return {file.stem for file in (root / HEADS_DIR).glob("*.safetensors")}


def _unknown(root: Path, name: str, listed: Sequence[str]) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {root} has no head {quoted(name)} (its heads: {', '.join(listed) or 'none'})",
        code=ErrorCode.UNKNOWN_HEAD,
    )
