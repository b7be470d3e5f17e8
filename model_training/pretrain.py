"""`htmllm train`: pretraining with MLM + bag-of-words + teacher-weighted contrastive distillation.

`train(config)` reads top to bottom as the algorithm (after nanoGPT): set up the process (DDP under
torchrun), load shards and teacher vectors, build the encoder and the pretraining-only heads, resume if a
checkpoint exists, then loop: draw the step's loss coefficients, accumulate gradients over micro-batches,
clip, step AdamW at the trapezoidal learning rate, log, evaluate on held-out pages, checkpoint.

Exact resume: a periodic checkpoint is a served-format checkpoint written by `service.core.checkpoint`
plus `trainer_state.pt` (optimizer, pretraining heads, loss scales, the coefficient and masking
generators, RNG states, step). The data order is a pure function of (seed, epoch, rank), so the step
number alone says where in the data a resumed run continues, and an interrupted + resumed run produces
the same losses as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from model_training.data import (
    HELDOUT,
    TOKENIZER_FILE,
    TRAIN,
    DataError,
    ids_digest,
    read_manifest,
    read_shard,
    writable_dir,
)
from model_training.objectives import (
    DistillationHead,
    LossAggregator,
    MaskingConfig,
    MlmHead,
    bow_counts,
    bow_loss,
    distillation_cosine,
    mask_tokens,
    mlm_loss,
    weighted_contrastive_distillation,
)
from model_training.teacher import load_teacher_embeddings
from model_training.train_config import TrainConfig
from model_training.train_logs import (
    METRICS_FILE,
    last_train_record,
    log_record,
    open_tensorboard,
    plot_curves,
    truncate_metrics,
)
from service.core.checkpoint import CheckpointMeta, load_checkpoint, read_meta, save_checkpoint
from service.core.errors import HtmllmError
from service.core.modeling import HtmlEncoderModel, build_config
from service.core.tokenizer import HtmlTokenizer, SpecialIds

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
LATEST_FILE = "latest"
SUMMARY_FILE = "summary.json"
CURVE_FILE = "training_curve.png"
EVAL_MASK_SEED = 12345  # held-out MLM masks are the same at every evaluation


# --- data -------------------------------------------------------------------------------------------


@dataclass
class SplitData:
    """One split in memory: token id arrays, their teacher vectors (aligned rows), document ids."""

    ids: list[np.ndarray]
    teacher: np.ndarray  # (N, T) float32
    doc_ids: list[str]


def load_splits(shards: str | Path, teacher: str | Path) -> tuple[SplitData, SplitData, dict[str, Any]]:
    """(train, heldout, teacher metadata) from a shards directory and its teacher directory."""
    manifest = read_manifest(shards)
    teacher_meta, arrays = load_teacher_embeddings(teacher, shards)
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[str]]] = {
        TRAIN: ([], [], []),
        HELDOUT: ([], [], []),
    }
    for entry, vectors in zip(manifest["shards"], arrays, strict=True):
        table = read_shard(shards, entry, columns=["id", "split", "input_ids"])
        splits = table.column("split").to_pylist()
        doc_ids = table.column("id").to_pylist()
        # The teacher's rows were checked against the manifest's ids hash; the shard's own rows must
        # match it too, or a shard rewritten under an old manifest would pair pages with other pages'
        # teacher vectors (same row count, so nothing else notices).
        if ids_digest([str(i) for i in doc_ids]) != entry["ids_sha256"]:
            raise DataError(
                f"shard {entry['file']} in {shards} does not hold the rows its manifest lists "
                f"(overwritten by an interrupted `htmllm data prepare`?); prepare the shards again"
            )
        for row, ids in enumerate(table.column("input_ids").to_pylist()):
            ids_list, vec_list, names = parts[str(splits[row])]
            ids_list.append(np.asarray(ids, dtype=np.int64))
            vec_list.append(vectors[row])
            names.append(str(doc_ids[row]))

    def build(name: str) -> SplitData:
        ids_list, vec_list, names = parts[name]
        dim = teacher_meta.dim
        matrix = np.stack(vec_list).astype(np.float32) if vec_list else np.zeros((0, dim), np.float32)
        return SplitData(ids=ids_list, teacher=matrix, doc_ids=names)

    return build(TRAIN), build(HELDOUT), {"teacher": teacher_meta.__dict__, "shards": manifest}


def collate(seqs: list[np.ndarray], *, max_length: int, pad_id: int, sep_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded (B, L) ids and mask; longer documents are cut to `max_length`, keeping [SEP] last."""
    cut = [s if len(s) <= max_length else np.concatenate([s[: max_length - 1], [sep_id]]) for s in seqs]
    width = max(len(s) for s in cut)
    ids = torch.full((len(cut), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(cut), width), dtype=torch.long)
    for row, seq in enumerate(cut):
        ids[row, : len(seq)] = torch.from_numpy(seq)
        mask[row, : len(seq)] = 1
    return ids, mask


class BatchOrder:
    """Which documents form micro-batch k: a pure function of (seed, epoch, rank), so resumable.

    Every epoch is a fresh permutation; each rank takes every world-th document of it; a rank's last
    incomplete batch is dropped so all ranks take the same number of equally sized steps.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, rank: int = 0, world: int = 1) -> None:
        self.n, self.batch_size, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.per_epoch = (n // world) // batch_size
        if self.per_epoch < 1:
            raise DataError(
                f"{n} training documents cannot fill one batch of {batch_size} on each of {world} processes"
            )

    def indices(self, micro_batch: int) -> np.ndarray:
        epoch, index = divmod(micro_batch, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)[self.rank :: self.world]
        return order[index * self.batch_size : (index + 1) * self.batch_size]


def trapezoid_lr(step: int, total: int, *, peak: float, warmup_frac: float, cooldown_frac: float) -> float:
    """Warm up linearly, hold, cool down linearly towards zero (the trapezoidal / WSD schedule).

    A pure function of (step, total): a resume with another `max_steps` re-derives warm-up and cool-down
    from the new total, so a run resumed on its plateau with a larger total extends the plateau, while
    one resumed in or after its cool-down jumps back up. Cool-down step k of c (k = 1..c) runs at
    peak * (c + 1 - k) / (c + 1): the last step at peak / (c + 1), zero being the step after the last.
    """
    # Rounded before the ceiling: 100 * 0.07 is 7.000000000000001 in floating point, and a bare ceil
    # made that 8 warm-up steps.
    warmup = math.ceil(round(total * warmup_frac, 6))
    cooldown = math.ceil(round(total * cooldown_frac, 6))
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    if cooldown and step >= total - cooldown:
        return peak * max(total - step, 0) / (cooldown + 1)
    return peak


# --- model ------------------------------------------------------------------------------------------


class PretrainingModel(nn.Module):
    """The encoder plus the heads that exist only while pretraining (MLM transform, distillation).

    The losses themselves are computed in float32 with autocast off (`objectives.full_precision`), so a
    caller may run the whole forward under bf16 autocast.
    """

    def __init__(
        self,
        model: HtmlEncoderModel,
        special: SpecialIds,
        *,
        teacher_dim: int,
        rank: int,
        temperature: float,
        special_ids: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.special = special
        # Every special token id: never masked, never a random replacement. The five named ones by
        # default; `all_special_ids(tokenizer)` adds the [unusedN] padding of the vocabulary.
        self.special_ids = sorted(set(_ids(special)) | set(special_ids or ()))
        hidden, vocab = model.embedding_dim, int(model.config.vocab_size)
        self.mlm_head = MlmHead(hidden, vocab, eps=float(model.config.norm_eps))
        self.distil_head = DistillationHead(hidden, teacher_dim, rank=rank)
        self.temperature = temperature

    def mask(
        self, input_ids: Tensor, attention_mask: Tensor, *, generator: torch.Generator, config: MaskingConfig
    ) -> tuple[Tensor, Tensor]:
        """`mask_tokens` with this model's special ids and vocabulary: `(masked_ids, labels)`."""
        return mask_tokens(
            input_ids,
            attention_mask,
            mask_id=self.special.mask,
            special_ids=self.special_ids,
            vocab_size=int(self.model.config.vocab_size),
            generator=generator,
            config=config,
        )

    def mlm(self, hidden: Tensor, labels: Tensor) -> Tensor:
        """MLM loss from the hidden states (B, L, D) of the masked input."""
        embedding_matrix = self.model.encoder.embeddings.tok_embeddings.weight  # (V, D), the tied decoder
        return mlm_loss(
            hidden, labels, embedding_matrix, decoder_bias=self.mlm_head.bias, transform=self.mlm_head
        )

    def bow(self, hidden: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Bag-of-words loss of the clean `input_ids` from the [CLS] row of `hidden` (B, L, D)."""
        embedding_matrix = self.model.encoder.embeddings.tok_embeddings.weight  # (V, D)
        counts = bow_counts(
            input_ids, attention_mask, vocab_size=embedding_matrix.shape[0], special_ids=self.special_ids
        )
        return bow_loss(hidden[:, 0], embedding_matrix, counts)  # (B, D) [CLS]

    def student(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """The pooled embedding projected into the teacher's space, (B, T)."""
        projected: Tensor = self.distil_head(self.model.pool(hidden, attention_mask))
        return projected

    def distil(self, student: Tensor, teacher: Tensor, *, gather: bool = True) -> Tensor:
        return weighted_contrastive_distillation(
            student, teacher, temperature=self.temperature, gather=gather
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        masked_ids: Tensor,
        labels: Tensor,
        teacher: Tensor,
        *,
        gather: bool = True,
    ) -> dict[str, Tensor]:
        # One forward pass over the corrupted input serves all three objectives: a second, clean pass
        # for BOW/distillation would double the cost for little gain (masking acts as augmentation).
        # Held-out figures do take the clean pass (`evaluate`).
        hidden = self.model.encoder(input_ids=masked_ids, attention_mask=attention_mask).last_hidden_state
        return {
            "mlm": self.mlm(hidden, labels),
            "bow": self.bow(hidden, input_ids, attention_mask),
            "distil": self.distil(self.student(hidden, attention_mask), teacher, gather=gather),
        }


def _ids(special: SpecialIds) -> list[int]:
    return [special.pad, special.unk, special.cls, special.sep, special.mask]


def all_special_ids(tokenizer: HtmlTokenizer) -> list[int]:
    """Every special token id of `tokenizer`: the five named ones and every added special token.

    The tokenizer trainer pads a small vocabulary with `[unusedN]` special tokens; drawn as MLM random
    replacements they would teach the model tokens that never occur in a page.
    """
    added = tokenizer.backend.get_added_tokens_decoder()
    return sorted(set(_ids(tokenizer.special_ids)) | {int(i) for i, token in added.items() if token.special})


def _resolve_device(config: TrainConfig, local_rank: int) -> torch.device:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise DataError("config: device is cuda, but torch sees no CUDA device here (use auto or cpu)")
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _autocast(config: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    bf16 = config.precision == "bf16" or (config.precision == "auto" and device.type == "cuda")
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only: biases, norms and the embedding table (the tied decoder) are not decayed."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        is_embedding = "tok_embeddings" in name
        (decay if param.ndim >= 2 and not is_embedding else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# --- checkpoints ------------------------------------------------------------------------------------


def _meta(
    config: TrainConfig,
    model: HtmlEncoderModel,
    tokenizer: HtmlTokenizer,
    prune_version: str,
    training: dict[str, Any],
) -> CheckpointMeta:
    """htmllm.json; the prune version is the one the training shards were pruned with."""
    return CheckpointMeta(
        name=config.name,
        pooling=model.pooling,
        prune_version=prune_version,
        tokenizer_sha256=tokenizer.sha256,
        max_length=config.max_length,
        embedding_dim=model.embedding_dim,
        training=training,
    )


def save_training_checkpoint(
    directory: Path,
    *,
    pretraining: PretrainingModel,
    tokenizer: HtmlTokenizer,
    meta: CheckpointMeta,
    optimizer: torch.optim.Optimizer,
    aggregator: LossAggregator,
    mask_generator: torch.Generator,
    step: int,
    rank_states: list[dict[str, Any]] | None = None,
) -> None:
    """A served-format checkpoint plus everything an exact resume needs, written atomically.

    `rank_states` holds every DDP rank's own generators (`rank_rng_states`), gathered on rank 0:
    each rank masks its own documents with its own generator, so a resumed rank must get its own back.
    """
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(tmp, pretraining.model, tokenizer, meta)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "mlm_head": pretraining.mlm_head.state_dict(),
        "distil_head": pretraining.distil_head.state_dict(),
        "aggregator": aggregator.state_dict(),
        "mask_generator": mask_generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "ranks": rank_states if rank_states is not None else [rank_rng_states(mask_generator)],
    }
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
    latest = directory.parent / LATEST_FILE
    latest.with_suffix(".tmp").write_text(directory.name + "\n", encoding="utf-8")
    os.replace(latest.with_suffix(".tmp"), latest)


def rank_rng_states(mask_generator: torch.Generator) -> dict[str, Any]:
    """This process's random state: its masking generator, torch's CPU and CUDA generators."""
    return {
        "mask_generator": mask_generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _gather_rank_states(mask_generator: torch.Generator, distributed: bool) -> list[dict[str, Any]]:
    """Every rank's `rank_rng_states`, in rank order (a collective: every rank calls it)."""
    mine = rank_rng_states(mask_generator)
    if not distributed:
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [dict(state) for state in gathered]


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete periodic checkpoint of a run directory, or None.

    `checkpoints/latest` names it; when that pointer is missing or names a directory that is gone (a
    pointer written by a session killed mid-way, a directory deleted by hand), the highest-numbered
    complete `step-N` directory is taken, never a silent start from scratch next to usable checkpoints.
    A directory is complete once its `.tmp` was renamed, which happens after its last file is written.
    """
    checkpoints = Path(out) / "checkpoints"
    pointer = checkpoints / LATEST_FILE
    if pointer.is_file():
        path = checkpoints / pointer.read_text(encoding="utf-8").strip()
        if path.name.startswith("step-") and (path / STATE_FILE).is_file():
            return path
    complete = [
        p
        for p in checkpoints.glob("step-*")
        if not p.name.endswith(".tmp") and p.name[5:].isdigit() and (p / STATE_FILE).is_file()
    ]
    if not complete:
        return None
    newest = max(complete, key=lambda p: int(p.name[5:]))
    logger.warning("%s does not name a complete checkpoint; resuming from %s", pointer, newest)
    return newest


def _prune_checkpoints(checkpoints: Path, keep: int) -> None:
    """Delete all but the newest `keep` (at least one: the one `latest` names) step directories."""
    steps = sorted(p for p in checkpoints.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in steps[: max(len(steps) - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


def _discard_checkpoints(checkpoints: Path) -> None:
    """Start over (`--no-resume`): the earlier run's checkpoints go, as its metrics and events do.

    Left in place, a later step of the discarded run would count as newer than the new run's own
    checkpoints: `keep_checkpoints` would delete the new run's, and a resume would continue the old run.
    """
    old = sorted(p for p in checkpoints.glob("step-*") if p.is_dir())
    if old:
        logger.info("--no-resume: removing %d checkpoint(s) of the earlier run in %s", len(old), checkpoints)
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    (checkpoints / LATEST_FILE).unlink(missing_ok=True)


# Keys of the stored config that a resumed run must share: they shape the weights and heads (a
# different preset does not load; a different pooling or distillation rank would train another model).
RESUME_FIXED_KEYS = ("preset", "pooling", "distil_rank")
# Keys that decide which documents, cut where, and which masks each step sees: a change is allowed but
# the resumed run is no longer the continuation of the interrupted one, so it is logged. `max_length`
# leaves the weights' shapes and meaning alone (positions are rotary) but cuts the documents elsewhere.
# The data itself is compared by content (`data_identity`), not by the `shards`/`teacher` paths.
RESUME_ORDER_KEYS = ("seed", "batch_size", "grad_accum", "mask_prob", "max_length")
# Keys of the loss combination: the resumed run trains with the new values (the checkpoint records
# them), keeping only the learned first-batch scales and the coefficient generator; logged.
RESUME_LOSS_KEYS = ("loss_weights", "random_coefficients")
# Fields of teacher.json that say nothing about the vectors: how long embedding took, where the model
# was installed on the machine that ran it.
_TEACHER_VOLATILE = ("seconds", "model_path")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def data_identity(provenance: dict[str, Any]) -> dict[str, str]:
    """Content identity of the shards and teacher vectors a run trains on, recorded in its checkpoints.

    The shards' manifest lists every shard's row-id hash, the split counts, sampling, prune version and
    cut length, and `data prepare` rewrites it whenever the shards change; teacher.json records the
    model, view and limit and the row-id hashes it embedded. Hashing both (not the vectors: gigabytes on
    a crawl) tells a resume that the data behind the same paths changed.
    """
    manifest = {k: v for k, v in provenance["shards"].items() if k != "source"}
    teacher = {k: v for k, v in provenance["teacher"].items() if k not in _TEACHER_VOLATILE}
    return {"shards": _digest(manifest), "teacher": _digest(teacher)}


def _data_changes(training: dict[str, Any], provenance: dict[str, Any], config: TrainConfig) -> list[str]:
    """What differs between the data a checkpoint was trained on and the data configured now.

    Checkpoints written before `data_identity` existed are compared on what they did record: the
    shards' counts and the teacher's metadata.
    """
    recorded = training.get("data_identity")
    now = data_identity(provenance)
    stats_then = training.get("data") or {}
    stats_now = provenance["shards"].get("stats") or {}
    teacher_then = {k: v for k, v in (training.get("teacher") or {}).items() if k not in _TEACHER_VOLATILE}
    teacher_now = {k: v for k, v in provenance["teacher"].items() if k not in _TEACHER_VOLATILE}
    if isinstance(recorded, dict):
        shards_changed = recorded.get("shards") != now["shards"]
        teacher_changed = recorded.get("teacher") != now["teacher"]
    else:
        shards_changed = bool(stats_then) and stats_then != stats_now
        teacher_changed = bool(teacher_then) and teacher_then != teacher_now
    changes = []
    if shards_changed:
        counts = [
            f"{k} {stats_then.get(k)} -> {stats_now.get(k)}"
            for k in sorted(set(stats_then) | set(stats_now))
            if stats_then.get(k) != stats_now.get(k)
        ]
        what = ", ".join(counts) if counts else "same counts, other documents, tokens or settings"
        changes.append(f"the shards in {config.shards} ({what})")
    if teacher_changed:
        fields = [
            f"{k} {teacher_then.get(k)!r} -> {teacher_now.get(k)!r}"
            for k in sorted(set(teacher_then) | set(teacher_now))
            if k != "shards" and teacher_then.get(k) != teacher_now.get(k)
        ]
        what = ", ".join(fields) if fields else "embedded again from other shard rows"
        changes.append(f"the teacher vectors in {config.teacher} ({what})")
    return changes


def check_resumable(
    path: Path,
    config: TrainConfig,
    tokenizer: HtmlTokenizer,
    teacher_dim: int,
    world: int,
    provenance: dict[str, Any] | None = None,
) -> None:
    """Refuse to resume from a checkpoint of another model; warn when the data or its order will differ."""
    meta = read_meta(path)
    training = meta.training if isinstance(meta.training, dict) else {}
    saved = training.get("config", {})
    hint = f"start over with --no-resume or another --out than {config.out}"
    if meta.tokenizer_sha256 != tokenizer.sha256:
        raise DataError(f"cannot resume from {path}: it was trained with another tokenizer; {hint}")
    current = config.to_dict()
    changed = [k for k in RESUME_FIXED_KEYS if k in saved and saved[k] != current[k]]
    if changed:
        what = ", ".join(f"{k} {saved[k]!r} -> {current[k]!r}" for k in changed)
        raise DataError(f"cannot resume from {path}: the config changed ({what}); {hint}")
    saved_dim = training.get("teacher", {}).get("dim")
    if saved_dim is not None and int(saved_dim) != teacher_dim:
        raise DataError(
            f"cannot resume from {path}: its teacher vectors had {saved_dim} dimensions, "
            f"{config.teacher} has {teacher_dim}; {hint}"
        )
    data = _data_changes(training, provenance, config) if provenance is not None else []
    if data:
        # Allowed, as the docs promise a warning rather than a refusal; but a changed split moves pages
        # between the sides, so held-out figures stop meaning "sites never trained on".
        logger.warning(
            "resuming from %s with changed data: %s. The steps from here on train on other documents "
            "than the interrupted run's, and pages it trained on may now be held out; to compare "
            "figures, prepare into a new directory and %s",
            path,
            "; ".join(data),
            hint,
        )
    order = [
        f"{k} {saved[k]!r} -> {current[k]!r}"
        for k in RESUME_ORDER_KEYS
        if k in saved and saved[k] != current[k]
    ]
    saved_world = training.get("world_size")
    if saved_world is not None and int(saved_world) != world:
        order.append(f"world_size {saved_world} -> {world}")
    if order:
        logger.warning(
            "resuming from %s with a changed %s: the documents, their cut, order and masks from here on "
            "differ from the interrupted run's",
            path,
            ", ".join(order),
        )
    losses = [
        f"{k} {saved[k]!r} -> {current[k]!r}"
        for k in RESUME_LOSS_KEYS
        if k in saved and saved[k] != current[k]
    ]
    if losses:
        logger.warning(
            "resuming from %s with a changed %s: the steps from here on are trained with the new setting "
            "(the checkpoints record it); the steps before were not",
            path,
            "; ".join(losses),
        )


def _restore(
    path: Path,
    pretraining: PretrainingModel,
    optimizer: torch.optim.Optimizer,
    aggregator: LossAggregator,
    mask_generator: torch.Generator,
    device: torch.device,
    attn_implementation: str,
    *,
    rank: int = 0,
    world: int = 1,
) -> int:
    """Load a periodic checkpoint into the live objects; returns the step to continue from.

    Each rank gets its own generators back. A checkpoint written by another number of processes has no
    state for some ranks: those keep their freshly seeded generators (the run continues, not exactly).
    """
    checkpoint = load_checkpoint(path, device=device, attn_implementation=attn_implementation)
    pretraining.model.encoder.load_state_dict(checkpoint.model.encoder.state_dict())
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    pretraining.mlm_head.load_state_dict(state["mlm_head"])
    pretraining.distil_head.load_state_dict(state["distil_head"])
    optimizer.load_state_dict(state["optimizer"])
    aggregator.load_state_dict(state["aggregator"])
    # Checkpoints from before per-rank states hold rank 0's generators at the top level only.
    ranks = state.get("ranks") or [{k: state[k] for k in ("mask_generator", "torch_rng", "cuda_rng")}]
    if rank < len(ranks) and (len(ranks) == world or rank == 0):
        mine = ranks[rank]
        mask_generator.set_state(mine["mask_generator"])
        torch.set_rng_state(mine["torch_rng"])
        if torch.cuda.is_available() and mine["cuda_rng"]:
            torch.cuda.set_rng_state_all(mine["cuda_rng"])
    return int(state["step"])


# --- evaluation -------------------------------------------------------------------------------------


def _batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


@torch.no_grad()
def evaluate(
    pretraining: PretrainingModel,
    data: SplitData,
    *,
    config: TrainConfig,
    device: torch.device,
    train_centroid: np.ndarray,
) -> dict[str, float]:
    """Held-out figures: cosine to the teacher, retrieval top-1, losses.

    Everything but the MLM loss comes from the clean input (MLM needs the masked one, with masks fixed
    by `EVAL_MASK_SEED` so evaluations compare): the cosine, top-1, BOW and distillation figures describe
    the model as served, not as corrupted for training.

    `centroid_cosine` is the cosine a constant prediction (the mean training teacher vector) gets: the
    floor the student's cosine must be read against, since sentence embeddings share a large common
    direction. `top1` asks whether each page's projected student vector is closest to its own teacher
    among all held-out teachers.
    """
    if not data.ids:
        return {}
    was_training = pretraining.training
    pretraining.eval()
    special = pretraining.special
    encoder = pretraining.model.encoder
    generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
    masking = MaskingConfig(mask_prob=config.mask_prob)
    students, sums, weights = [], {"mlm": 0.0, "bow": 0.0, "distil": 0.0}, 0
    for rows in _batches(len(data.ids), config.eval_batch_size):
        ids, mask = collate(
            data.ids[rows], max_length=config.max_length, pad_id=special.pad, sep_id=special.sep
        )
        masked, labels = pretraining.mask(ids, mask, generator=generator, config=masking)
        teacher = torch.from_numpy(data.teacher[rows]).to(device)
        ids, mask, masked, labels = ids.to(device), mask.to(device), masked.to(device), labels.to(device)
        # Two passes: the masked input for MLM, the clean one for everything else. The losses switch
        # autocast off inside (float32).
        with _autocast(config, device):
            masked_hidden = encoder(input_ids=masked, attention_mask=mask).last_hidden_state
            clean_hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            student = pretraining.student(clean_hidden, mask)  # (B, T)
            losses = {
                "mlm": pretraining.mlm(masked_hidden, labels),
                "bow": pretraining.bow(clean_hidden, ids, mask),
                "distil": pretraining.distil(student, teacher, gather=False),
            }
        students.append(student.float().cpu())
        n = rows.stop - rows.start
        for name in sums:
            sums[name] += float(losses[name]) * n
        weights += n
    student = torch.cat(students)  # (N, T)
    teacher_all = torch.from_numpy(data.teacher)
    cosine = distillation_cosine(student, teacher_all)
    sims = nn.functional.normalize(student, dim=-1) @ nn.functional.normalize(teacher_all, dim=-1).t()
    top1 = (sims.argmax(dim=1) == torch.arange(len(student))).float().mean()
    centroid = torch.from_numpy(train_centroid).expand_as(teacher_all)
    pretraining.train(was_training)
    return {
        "cosine": float(cosine.mean()),
        "centroid_cosine": float(distillation_cosine(centroid, teacher_all).mean()),
        "top1": float(top1),
        "documents": float(len(student)),
        **{f"{name}_loss": value / weights for name, value in sums.items()},
    }


# --- the loop ---------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    steps: int
    model_dir: Path | None
    summary: dict[str, Any]


def train(config: TrainConfig, *, stop_at_step: int | None = None, resume: bool = True) -> TrainResult:
    """Run (or continue) pretraining as configured; `stop_at_step` ends early with a checkpoint."""
    if stop_at_step is not None and stop_at_step < 1:
        raise DataError(f"stop_at_step must be at least 1, got {stop_at_step}")
    # Process setup: one process per GPU under torchrun, else a single process.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _resolve_device(config, local_rank)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    master = rank == 0
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed + rank)
    out = Path(config.out)
    checkpoints = out / "checkpoints"
    if master:
        writable_dir(checkpoints)
    started = time.perf_counter()

    # Data: token ids per document and the teacher's vector for each, held-out pages set aside. The
    # manifest first: a wrong --shards is "not a shards directory", not a missing tokenizer file.
    read_manifest(config.shards)
    tokenizer = HtmlTokenizer.from_file(Path(config.shards) / TOKENIZER_FILE)
    train_data, heldout, provenance = load_splits(config.shards, config.teacher)
    shards_length = int(provenance["shards"].get("max_length") or config.max_length)
    if master and config.max_length > shards_length:
        # The checkpoint will say max_length and the service will run pages that long, but the encoder
        # never saw a position past the shards' cut: a flag worth seeing before hours of training.
        logger.warning(
            "max_length %d is longer than the %d tokens the shards were cut to: the model is served at "
            "%d but trained on at most %d positions (set max_length = %d, or re-run `htmllm data "
            "prepare --max-length %d`)",
            config.max_length,
            shards_length,
            config.max_length,
            shards_length,
            shards_length,
            config.max_length,
        )
    teacher_dim = int(train_data.teacher.shape[1])
    order = BatchOrder(len(train_data.ids), config.batch_size, seed=config.seed, rank=rank, world=world)
    per_step = config.grad_accum
    total_steps = config.max_steps or max(1, int(config.epochs * order.per_epoch / per_step))
    centroid = (
        train_data.teacher.mean(axis=0) if len(train_data.teacher) else np.zeros(teacher_dim, np.float32)
    )

    # Model: a randomly initialised encoder for the preset, plus the pretraining-only heads.
    model_config = build_config(config.preset, tokenizer, max_length=config.max_length)
    model = HtmlEncoderModel.from_config(
        model_config, pooling=config.pooling, attn_implementation=config.attn_implementation
    )
    special = tokenizer.special_ids
    pretraining = PretrainingModel(
        model,
        special,
        teacher_dim=teacher_dim,
        rank=config.distil_rank,
        temperature=config.temperature,
        special_ids=all_special_ids(tokenizer),
    ).to(device)
    optimizer = torch.optim.AdamW(
        _param_groups(pretraining, config.weight_decay),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        fused=device.type == "cuda",
    )
    aggregator = LossAggregator(
        config.loss_weights, seed=config.seed, random_coefficients=config.random_coefficients
    )
    mask_generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
    masking = MaskingConfig(mask_prob=config.mask_prob)

    # Resume from the newest periodic checkpoint, if any: same weights, optimizer, RNGs and step.
    step = 0
    found = latest_checkpoint(out) if resume else None
    if found is None and master:
        # A run that does not continue the previous one: the previous run's model/, summary and curve
        # go before anything else is written (a kill after this leaves none of them to be mistaken for
        # this run's), then, with --no-resume, its checkpoints.
        _discard_outputs(out)
        if not resume:
            _discard_checkpoints(checkpoints)
    # The run's identity, written into every checkpoint and the export: model/ counts as this run's
    # final model only if it was exported from a checkpoint of the same run (`_exported`). A resume
    # keeps the checkpoint's; a checkpoint from before run ids gets a new one.
    found_training = read_meta(found).training if found is not None else {}
    found_run_id = found_training.get("run_id") if isinstance(found_training, dict) else None
    run_id = str(found_run_id or uuid.uuid4().hex)
    if found is not None:
        check_resumable(found, config, tokenizer, teacher_dim, world, provenance)
        step = _restore(
            found,
            pretraining,
            optimizer,
            aggregator,
            mask_generator,
            device,
            config.attn_implementation,
            rank=rank,
            world=world,
        )
        logger.info("resumed from %s at step %d", found, step)
    resumed_step = step
    engine: nn.Module = pretraining
    if distributed:
        engine = nn.parallel.DistributedDataParallel(
            pretraining, device_ids=[local_rank] if device.type == "cuda" else None
        )
    prune_version = str(provenance["shards"]["prune_version"])
    metrics_file = out / METRICS_FILE
    if master:
        truncate_metrics(metrics_file, step)
    writer = open_tensorboard(out, config, resumed_at=step) if master else None
    training_meta = {
        "config": config.to_dict(),
        "teacher": provenance["teacher"],
        "data": provenance["shards"].get("stats", {}),
        "data_identity": data_identity(provenance),
        "run_id": run_id,
        "world_size": world,
    }
    from tqdm import tqdm

    bar = tqdm(
        total=total_steps, initial=step, desc="train", unit="step", disable=not (master and config.progress)
    )
    last_step = total_steps if stop_at_step is None else min(stop_at_step, total_steps)
    tokens_seen = 0
    evaluation: dict[str, float] = {}
    pretraining.train()
    while step < last_step:
        # The learning rate of this step, and fresh U(0, 1) coefficients for the three losses.
        lr = trapezoid_lr(
            step,
            total_steps,
            peak=config.lr,
            warmup_frac=config.warmup_frac,
            cooldown_frac=config.cooldown_frac,
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        coefficients = aggregator.draw()
        raw = {"mlm": 0.0, "bow": 0.0, "distil": 0.0}
        total_value = 0.0

        # Gradient accumulation: DDP all-reduces only on the last micro-batch of the step.
        for micro in range(per_step):
            rows = order.indices(step * per_step + micro)
            ids, mask = collate(
                [train_data.ids[i] for i in rows],
                max_length=config.max_length,
                pad_id=special.pad,
                sep_id=special.sep,
            )
            masked, labels = pretraining.mask(ids, mask, generator=mask_generator, config=masking)
            teacher = torch.from_numpy(train_data.teacher[rows]).to(device)
            ids, mask, masked, labels = ids.to(device), mask.to(device), masked.to(device), labels.to(device)
            last_micro = not distributed or micro == per_step - 1
            sync = contextlib.nullcontext() if last_micro else _no_sync(engine)
            with sync:
                # The encoder runs under autocast; the losses inside switch it off (float32).
                with _autocast(config, device):
                    losses = engine(ids, mask, masked, labels, teacher)
                total = aggregator.combine(losses, coefficients) / per_step
                total.backward()  # type: ignore[no-untyped-call]
            for name in raw:
                raw[name] += float(losses[name].detach()) / per_step
            total_value += float(total.detach())
            tokens_seen += int(mask.sum())

        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(pretraining.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        # Logging, evaluation and checkpoints (rank 0 writes; the others wait at barriers).
        if master and (step % config.log_every == 0 or step == last_step or step == 1):
            record = {"step": step, "split": "train", "lr": lr, "total": total_value, **raw}
            record.update({f"u_{k}": v for k, v in coefficients.items()})
            log_record(metrics_file, writer, record)
            bar.set_postfix(mlm=f"{raw['mlm']:.3f}", bow=f"{raw['bow']:.3f}", distil=f"{raw['distil']:.3f}")
        bar.update(1)
        if (config.eval_every and step % config.eval_every == 0) or step == total_steps:
            if master:
                evaluation = evaluate(
                    pretraining, heldout, config=config, device=device, train_centroid=centroid
                )
                if evaluation:
                    log_record(metrics_file, writer, {"step": step, "split": "heldout", **evaluation})
            if distributed:
                dist.barrier()
        periodic = config.checkpoint_every and step % config.checkpoint_every == 0
        if periodic or step == last_step:
            rank_states = _gather_rank_states(mask_generator, distributed)
            if master:
                meta = _meta(
                    config, pretraining.model, tokenizer, prune_version, {**training_meta, "step": step}
                )
                with _transformers_progress(config.progress):
                    save_training_checkpoint(
                        checkpoints / f"step-{step:08d}",
                        pretraining=pretraining,
                        tokenizer=tokenizer,
                        meta=meta,
                        optimizer=optimizer,
                        aggregator=aggregator,
                        mask_generator=mask_generator,
                        step=step,
                        rank_states=rank_states,
                    )
                _prune_checkpoints(checkpoints, config.keep_checkpoints)
            if distributed:
                dist.barrier()
    bar.close()

    # The served model: written once the schedule is complete, in the export dtype.
    model_dir: Path | None = None
    summary: dict[str, Any] = {}
    model_dir_done = out / "model"
    finished_before = master and step >= total_steps and step == resumed_step
    if finished_before and _exported(model_dir_done, step, config, found_run_id):
        # The command run again after the run finished: model/ is this run's export of this step
        # already, and may have task heads trained into it since (`htmllm heads train`); exporting
        # again would drop them.
        logger.info("%s is already the model of step %d; nothing to train or export", model_dir_done, step)
        model_dir = model_dir_done
        summary_file = out / SUMMARY_FILE
        summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
    elif master and step >= total_steps:
        if not evaluation:
            evaluation = evaluate(pretraining, heldout, config=config, device=device, train_centroid=centroid)
        summary = {
            "steps": step,
            "total_steps": total_steps,
            "train_documents": len(train_data.ids),
            "heldout_documents": len(heldout.ids),
            "tokens_seen_this_session": tokens_seen,
            "seconds_this_session": round(time.perf_counter() - started, 1),
            "heldout": evaluation,
            "final_train": last_train_record(metrics_file),
            "run_id": run_id,
        }
        model_dir = model_dir_done
        export = _export_copy(pretraining.model, config.export_dtype)
        # Written beside and swapped in, as the periodic checkpoints: a kill mid-write leaves the
        # previous model/ (or none), never a mix of two models' files.
        # The summary and curve go first: model/ is the last thing written, so a model/ of this run
        # means its summary is this run's too.
        tmp = model_dir.with_name(model_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with _transformers_progress(config.progress):
            save_checkpoint(
                tmp,
                export,
                tokenizer,
                _meta(config, export, tokenizer, prune_version, {**training_meta, **summary}),
            )
        (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        plot_curves(metrics_file, out / CURVE_FILE)
        _swap_in(tmp, model_dir)
    if writer is not None:
        writer.close()
    if distributed:
        # Free the DDP wrapper while the process group is still registered: freed after it, its Reducer
        # held the group's last reference, and the group's destructor, run under the GIL, joined gloo's
        # loop thread, which was waiting for the GIL (a CI run hung there after its third `train`).
        del engine
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return TrainResult(steps=step, model_dir=model_dir, summary=summary)


def _exported(model_dir: Path, step: int, config: TrainConfig, run_id: str | None) -> bool:
    """Whether `model_dir` is the final export of `step` of the run `run_id` (the run of the checkpoint
    resumed from) with the export options of `config` (the other keys cannot change a model whose
    training is over).

    The run id, not the step or config: a run started over with --no-resume and killed between its
    final checkpoint and the export has the same step and possibly the same name, and its predecessor's
    model/ must not pass for its own. `run_id` None is a checkpoint from before run ids: compared as then.
    """
    try:
        training = read_meta(model_dir).training
    except HtmllmError:
        return False
    if run_id is not None and training.get("run_id") != run_id:
        return False
    saved = training.get("config") or {}
    same = all(saved.get(key) == getattr(config, key) for key in ("name", "export_dtype", "max_length"))
    return same and training.get("steps") == step


def _discard_outputs(out: Path) -> None:
    """Remove the final outputs of an earlier run in `out` (model/, summary, curve) before a new run.

    model/ is renamed out of the way first (one atomic step) and deleted after: a kill leaves either the
    whole old model/ or none, never part of one.
    """
    model_dir = out / "model"
    gone = out / "model.discarded"
    shutil.rmtree(gone, ignore_errors=True)
    if model_dir.exists():
        logger.info("a new run in %s: removing the earlier run's model/, summary and curve", out)
        os.replace(model_dir, gone)
    for leftover in (gone, out / "model.tmp", out / "model.old"):
        shutil.rmtree(leftover, ignore_errors=True)
    for file in (out / SUMMARY_FILE, out / CURVE_FILE):
        file.unlink(missing_ok=True)


@contextlib.contextmanager
def _transformers_progress(show: bool) -> Iterator[None]:
    """transformers' own bars ("Writing model shards" in `save_pretrained`) off while `show` is false.

    A process-wide switch in transformers, so it is restored on the way out.
    """
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if was_on and not show:
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was_on and not show:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _swap_in(new: Path, target: Path) -> None:
    """Replace directory `target` by the complete directory `new`."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _no_sync(engine: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """DDP's `no_sync`: skip the gradient all-reduce on micro-batches before the step's last."""
    context: contextlib.AbstractContextManager[Any] = engine.no_sync()  # type: ignore[operator]
    return context


def _export_copy(model: HtmlEncoderModel, dtype_name: str) -> HtmlEncoderModel:
    """The model on CPU in the export dtype (a copy: the live one keeps training precision)."""
    import copy

    dtype = getattr(torch, dtype_name)
    export = copy.deepcopy(model).cpu()
    export.encoder.to(dtype)
    return export
