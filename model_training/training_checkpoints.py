"""Training checkpoints and the rules for resuming from them: the contract between two sessions of a run.

A session killed at any moment must leave a checkpoint the next session can continue exactly, and a
resume must refuse a checkpoint of another model and say when the data or its order changed. What
`train` writes into `checkpoints/` (a served-format checkpoint plus `trainer_state.pt`, the `latest`
pointer, pruning, the --no-resume cleanup), how it finds and loads the newest one, and the content
identity of the data it records (`training.data_identity`) live here, apart from the loop in `pretrain`;
the run's final outputs (`model/`, summary, curve) are `final_export`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from model_training.data import DataError
from model_training.objectives import LossAggregator
from model_training.pretraining_model import PretrainingModel, split_decay
from model_training.train_config import TrainConfig
from service.core.checkpoint import CheckpointMeta, load_checkpoint, read_meta, save_checkpoint
from service.core.tokenizer import HtmlTokenizer

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
LATEST_FILE = "latest"


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
        # None: a run without distillation has no head (`PretrainingModel`, teacher_dim None).
        "distil_head": None if pretraining.distil_head is None else pretraining.distil_head.state_dict(),
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


def gather_rank_states(mask_generator: torch.Generator, distributed: bool) -> list[dict[str, Any]]:
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


def prune_checkpoints(checkpoints: Path, keep: int) -> None:
    """Delete all but the newest `keep` (at least one: the one `latest` names) step directories."""
    steps = sorted(p for p in checkpoints.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in steps[: max(len(steps) - max(keep, 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


def discard_checkpoints(checkpoints: Path) -> None:
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
# Keys of the losses: the resumed run trains with the new values (the checkpoint records them), keeping
# only the learned first-batch scales and the coefficient generator; logged. `temperature` is the
# contrastive loss's, read from the config at every start (and by a run without distillation not at all:
# no warning then).
RESUME_LOSS_KEYS = ("loss_weights", "random_coefficients", "temperature")
# Fields of teacher.json that say nothing about the vectors: how long embedding took, where the model
# was installed on the machine that ran it.
_TEACHER_VOLATILE = ("seconds", "model_path")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def data_identity(provenance: dict[str, Any]) -> dict[str, str | None]:
    """Content identity of the shards and teacher vectors a run trains on, recorded in its checkpoints.

    The shards' manifest lists every shard's row-id hash, the split counts, sampling, prune version and
    cut length, and `data prepare` rewrites it whenever the shards change; teacher.json records the
    model, view and limit and the row-id hashes it embedded. Hashing both (not the vectors: gigabytes on
    a crawl) tells a resume that the data behind the same paths changed.
    """
    manifest = {k: v for k, v in provenance["shards"].items() if k != "source"}
    teacher = provenance["teacher"]
    return {
        "shards": _digest(manifest),
        # None: a run without distillation reads no teacher vectors (`run_data`).
        "teacher": None if teacher is None else _digest(_teacher_fields(teacher)),
    }


def _teacher_fields(teacher: dict[str, Any] | None) -> dict[str, Any]:
    """teacher.json's fields that say which vectors they are (not where or how fast they were made)."""
    return {k: v for k, v in (teacher or {}).items() if k not in _TEACHER_VOLATILE}


def _data_changes(training: dict[str, Any], provenance: dict[str, Any], config: TrainConfig) -> list[str]:
    """What differs between the data a checkpoint was trained on and the data configured now.

    Checkpoints written before `data_identity` existed are compared on what they did record: the
    shards' counts and the teacher's metadata.
    """
    recorded = training.get("data_identity")
    now = data_identity(provenance)
    stats_then = training.get("data") or {}
    stats_now = provenance["shards"].get("stats") or {}
    teacher_then = _teacher_fields(training.get("teacher"))
    teacher_now = _teacher_fields(provenance["teacher"])
    if isinstance(recorded, dict):
        shards_changed = recorded.get("shards") != now["shards"]
        teacher_changed = recorded.get("teacher") != now["teacher"]
    else:
        shards_changed = bool(stats_then) and stats_then != stats_now
        teacher_changed = bool(teacher_then) and teacher_then != teacher_now
    # A run without distillation reads no teacher: the one a checkpoint of before `loss_weights.distil
    # = 0` meant no teacher recorded (`untrained_distil_head`) is no data the resume changed.
    teacher_changed = teacher_changed and provenance["teacher"] is not None
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
        changes.append(f"the teacher vectors in {config.teacher_dir} ({what})")
    return changes


def check_resumable(
    path: Path, config: TrainConfig, tokenizer: HtmlTokenizer, teacher_dim: int | None
) -> dict[str, Any]:
    """Refuse to resume from a checkpoint of another model; returns its `training` record (its run id
    among it), read once here. `teacher_dim` None is a run without distillation (no teacher, no head).

    Distillation on or off is part of the model: a run with a distillation head has the head's weights
    and AdamW moments in its state, and a run without has neither, so one cannot continue the other; a
    change of weight between two values above 0 is only a loss setting (`warn_resume_changes`). One
    exception: a checkpoint from before `loss_weights.distil = 0` meant "no teacher" that was trained at
    that weight has a head that was never trained (`untrained_distil_head`); a run without distillation
    continues it, the head dropped (`restore`), as the command it was started with (the docs then said
    to pass --teacher) resumes it. A run that distils does not: that would switch distillation on, the
    head's weights and moments being those of no training.

    What a resume would train differently (`warn_resume_changes`) is said apart, once the step is known:
    a finished run run again only exports, and a warning about documents it does not train on misled.
    """
    meta = read_meta(path)
    training = meta.training if isinstance(meta.training, dict) else {}
    saved = training.get("config", {})
    hint = _start_over_hint(config)
    if meta.tokenizer_sha256 != tokenizer.sha256:
        raise DataError(f"cannot resume from {path}: it was trained with another tokenizer; {hint}")
    # A record with "teacher" null was trained without distillation; one without the key is from before
    # the teacher was recorded, when every run had a distillation head.
    saved_teacher = training.get("teacher", {})
    distilled = saved_teacher is not None
    if distilled and teacher_dim is None and not untrained_distil_head(training):
        dim = saved_teacher.get("dim") if isinstance(saved_teacher, dict) else None
        raise DataError(
            f"cannot resume from {path}: it was trained with a distillation head (teacher vectors of "
            f"{dim if dim is not None else 'unknown'} dimensions), which a run with loss_weights.distil = 0 "
            f"does not build: resume it with loss_weights.distil above 0 and its teacher (--teacher), or "
            f"{hint}"
        )
    if not distilled and teacher_dim is not None:
        raise DataError(
            f"cannot resume from {path}: it was trained without distillation (loss_weights.distil = 0, no "
            f"teacher) and has no distillation head to continue: resume it with loss_weights.distil = 0, "
            f"or {hint}"
        )
    if teacher_dim is not None and untrained_distil_head(training):
        # Its head is in the checkpoint, but never trained: distilling from here on would switch the
        # objective mid-run as surely as a run without a head switched on, so it is refused the same way.
        raise DataError(
            f"cannot resume from {path}: it was trained without distillation (loss_weights.distil = 0, from "
            f"before that meant no teacher: its distillation head was built but never trained), so "
            f"distillation cannot be switched on by a resume: resume it with loss_weights.distil = 0 (the "
            f"untrained head is then dropped), or {hint}"
        )
    current = config.to_dict()
    # The distillation rank shapes a head a run without distillation does not have (or drops).
    fixed = [k for k in RESUME_FIXED_KEYS if teacher_dim is not None or k != "distil_rank"]
    changed = [k for k in fixed if k in saved and saved[k] != current[k]]
    if changed:
        what = ", ".join(f"{k} {saved[k]!r} -> {current[k]!r}" for k in changed)
        raise DataError(f"cannot resume from {path}: the config changed ({what}); {hint}")
    saved_dim = saved_teacher.get("dim") if isinstance(saved_teacher, dict) else None
    if saved_dim is not None and teacher_dim is not None and int(saved_dim) != teacher_dim:
        raise DataError(
            f"cannot resume from {path}: its teacher vectors had {saved_dim} dimensions, "
            f"{config.teacher_dir} has {teacher_dim}; {hint}"
        )
    return training


def untrained_distil_head(training: dict[str, Any]) -> bool:
    """Whether a checkpoint's distillation head was never trained, from its `training` record.

    Before `loss_weights.distil = 0` meant "no teacher" (a `training.teacher` of null), such a run read
    teacher vectors and built a distillation head anyway, trained at weight 0: its gradients were 0, and
    the encoder learned nothing from it. A record without `teacher` is older still, with a head too.
    """
    if training.get("teacher", {}) is None:
        return False  # a run without distillation: no head at all
    config = training.get("config")
    weights = config.get("loss_weights") if isinstance(config, dict) else None
    distil = weights.get("distil") if isinstance(weights, dict) else None
    return isinstance(distil, int | float) and not isinstance(distil, bool) and distil == 0


def _start_over_hint(config: TrainConfig) -> str:
    return f"start over with --no-resume or another --out than {config.out}"


def warn_resume_changes(
    path: Path,
    training: dict[str, Any],
    config: TrainConfig,
    *,
    world: int,
    provenance: dict[str, Any] | None = None,
    optimizer_changed: list[str] | None = None,
) -> None:
    """Warn that the steps a resume trains from `path` differ from the interrupted run's: other data,
    another order or cut, other loss or optimizer settings (`optimizer_changed`, from `restore`).

    Only for a session that trains: said when a finished run was exported again, the data it never
    reads for training was "changed" and its "documents from here on" differed, with no step to come.
    """
    saved = training.get("config", {})
    current = config.to_dict()
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
            _start_over_hint(config),
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
        # The temperature is the distillation loss's: a run without one does not use it.
        if k in saved and saved[k] != current[k] and (config.distils or k != "temperature")
    ]
    for changed, sep in ((losses, "; "), (optimizer_changed or [], ", ")):
        if changed:
            logger.warning(
                "resuming from %s with a changed %s: the steps from here on are trained with the new "
                "setting (the checkpoints record it); the steps before were not",
                path,
                sep.join(changed),
            )


# A training record's totals over the sessions of its run (each `train` call that trained steps or made
# the export), up to the step it records: a resumed run's summary had given the last session's time and
# tokens alone, as if the run had taken that long. A session killed after its last checkpoint counts up
# to that checkpoint only: the steps it trained after it are trained again, and counted, by the next.
SESSION_KEYS = ("sessions", "seconds_all_sessions", "tokens_seen_all_sessions")


def _recorded_count(value: Any) -> float | None:
    """A total as recorded, else None: a record from before the totals, or one edited into no count (a
    bool, a string, a negative or non-finite number, which htmllm.json could not be written with)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def session_totals(resumed: dict[str, Any] | None, *, seconds: float, tokens: int) -> dict[str, Any]:
    """The `SESSION_KEYS` to record with this session `seconds` and `tokens` into it: on top of those of
    the checkpoint it resumed from (`resumed`, its training record; None for a new run).

    A checkpoint from before the totals recorded none of its earlier sessions: the totals are then
    unknown (None), not this session's passed for the run's."""
    earlier = (
        {key: 0.0 for key in SESSION_KEYS}
        if resumed is None
        else {key: _recorded_count(resumed.get(key)) for key in SESSION_KEYS}
    )
    sessions, earlier_seconds, earlier_tokens = (earlier[key] for key in SESSION_KEYS)
    return {
        "sessions": None if sessions is None else int(sessions) + 1,
        "seconds_all_sessions": None if earlier_seconds is None else round(earlier_seconds + seconds, 1),
        "tokens_seen_all_sessions": None if earlier_tokens is None else int(earlier_tokens) + tokens,
    }


class Restored(NamedTuple):
    """What `restore` loaded: the step to continue from, the optimizer settings that changed, and
    whether it dropped an untrained distillation head (`untrained_distil_head`; `say_head_dropped`)."""

    step: int
    optimizer_changed: list[str]
    head_dropped: bool = False


def restore(
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
) -> Restored:
    """Load a periodic checkpoint into the live objects; returns the step to continue from, the
    optimizer settings that differ from the saved ones (for `warn_resume_changes`) and whether an
    untrained distillation head was dropped (for `say_head_dropped`, by a session that trains).

    Each rank gets its own generators back. A checkpoint written by another number of processes has no
    state for some ranks: those keep their freshly seeded generators (the run continues, not exactly).
    """
    checkpoint = load_checkpoint(path, device=device, attn_implementation=attn_implementation)
    pretraining.model.encoder.load_state_dict(checkpoint.model.encoder.state_dict())
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as exc:
        # Written beside and renamed in, so a kill never cuts it; a disk fault or a copy that ran out of
        # space does, and torch's EOFError had been a traceback naming no file.
        raise DataError(
            f"cannot resume from {path}: {path / STATE_FILE} cannot be read ({type(exc).__name__}: {exc}); "
            f"remove {path} to resume from the checkpoint before it, or start over with --no-resume"
        ) from exc
    pretraining.mlm_head.load_state_dict(state["mlm_head"])
    saved_head = state.get("distil_head")
    saved_optimizer = state["optimizer"]
    head_dropped = (
        saved_head is not None
        and pretraining.distil_head is None
        and untrained_distil_head(checkpoint.meta.training)
    )
    if head_dropped:
        saved_optimizer = _without_head(saved_optimizer, pretraining, saved_head, path)
        saved_head = None
    if (saved_head is None) != (pretraining.distil_head is None):
        # `check_resumable` refuses this from htmllm.json; a trainer_state.pt that disagrees with its
        # htmllm.json was put there by hand, and the optimizer's groups would not match either.
        raise DataError(
            f"cannot resume from {path}: its {STATE_FILE} "
            + ("has no distillation head" if saved_head is None else "has a distillation head")
            + f" and this run {'distils' if pretraining.distil_head is not None else 'does not'}; "
            "start over with --no-resume"
        )
    if pretraining.distil_head is not None:
        pretraining.distil_head.load_state_dict(saved_head)
    changed = optimizer_changes(saved_optimizer, optimizer)
    optimizer.load_state_dict(with_live_settings(saved_optimizer, optimizer))
    aggregator.load_state_dict(state["aggregator"])
    # Checkpoints from before per-rank states hold rank 0's generators at the top level only.
    ranks = state.get("ranks") or [{k: state[k] for k in ("mask_generator", "torch_rng", "cuda_rng")}]
    if rank < len(ranks) and (len(ranks) == world or rank == 0):
        mine = ranks[rank]
        mask_generator.set_state(mine["mask_generator"])
        torch.set_rng_state(mine["torch_rng"])
        if torch.cuda.is_available() and mine["cuda_rng"]:
            torch.cuda.set_rng_state_all(mine["cuda_rng"])
    return Restored(int(state["step"]), changed, head_dropped)


def say_head_dropped(path: Path) -> None:
    """Log that `restore` dropped the untrained distillation head of `path` (`Restored.head_dropped`).

    Only for a session that trains on from it: that session's checkpoints are written without the head,
    so a run says it once. A finished run run again, with nothing to train, keeps its checkpoint as it
    is, and had said it at every run of the command, as if the run went on without distillation.
    """
    logger.info(
        "%s is from before loss_weights.distil = 0 meant no teacher: its distillation head, built at "
        "weight 0 and not trained, is dropped with its optimizer state; the run goes on without "
        "distillation (MLM + bag-of-words), its encoder as it was",
        path,
    )


def _without_head(
    saved: dict[str, Any], pretraining: PretrainingModel, head: dict[str, torch.Tensor], path: Path
) -> dict[str, Any]:
    """A saved optimizer state of `pretraining` plus a distillation head (its weights `head`), as the
    optimizer of `pretraining` alone would have saved it: the head's entries gone, the others renumbered.

    A state numbers the parameters group by group (`param_groups`: decayed, then not), and the head's,
    registered last, were at the end of both groups: removing them shifts every index of the second
    group. The indices are mapped by parameter name, so the state is the one a run built without the
    head would have saved, entry for entry; each moment's shape is checked against its parameter.
    """
    live = [(name, param) for name, param in pretraining.named_parameters() if param.requires_grad]
    kept_groups = split_decay(live)
    kept = [name for group in kept_groups for name, _ in group]
    then_groups = split_decay([*live, *((f"distil_head.{key}", tensor) for key, tensor in head.items())])
    then = [pair for group in then_groups for pair in group]
    groups = saved.get("param_groups")
    sizes = [len(group) for group in then_groups]
    if not isinstance(groups, list) or [len(group.get("params", ())) for group in groups] != sizes:
        raise DataError(
            f"cannot resume from {path}: its {STATE_FILE}'s optimizer groups do not hold the parameters of "
            "this model with a distillation head; start over with --no-resume"
        )
    ids = [index for group in groups for index in group["params"]]
    saved_id = {name: index for (name, _), index in zip(then, ids, strict=True)}
    for name, param in then:
        moment = saved.get("state", {}).get(saved_id[name], {}).get("exp_avg")
        if moment is not None and tuple(moment.shape) != tuple(param.shape):
            raise DataError(
                f"cannot resume from {path}: its {STATE_FILE}'s optimizer state for {name} has shape "
                f"{tuple(moment.shape)}, the parameter {tuple(param.shape)}; start over with --no-resume"
            )
    state = {
        index: saved["state"][saved_id[name]]
        for index, name in enumerate(kept)
        if saved_id[name] in saved.get("state", {})
    }
    renumbered, start = [], 0
    for group, names in zip(groups, kept_groups, strict=True):
        settings = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        renumbered.append({**settings, "params": list(range(start, start + len(names)))})
        start += len(names)
    return {**saved, "state": state, "param_groups": renumbered}


# The settings of an AdamW group a config sets, by config key: (group key, index into it or None).
_OPTIMIZER_KEYS = {
    "weight_decay": ("weight_decay", None),
    "beta1": ("betas", 0),
    "beta2": ("betas", 1),
    "eps": ("eps", None),
}


def optimizer_changes(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> list[str]:
    """The config's optimizer settings (`weight_decay`, `beta1`, `beta2`, `eps`) that differ between the
    groups of a saved optimizer state and the live optimizer's, as `key old -> new`.

    Compared with the groups the interrupted run actually stepped with, not its recorded config: before
    `with_live_settings` a resume kept the saved groups while the checkpoints recorded the new config.
    The no-decay group's weight decay is 0 on both sides and never shows.
    """
    changes: dict[str, str] = {}
    for old_group, new_group in zip(saved.get("param_groups", []), optimizer.param_groups, strict=False):
        for name, (key, index) in _OPTIMIZER_KEYS.items():
            if key not in old_group:
                continue
            old, new = old_group[key], new_group[key]
            if index is not None:
                old, new = old[index], new[index]
            if old != new:
                changes.setdefault(name, f"{name} {old!r} -> {new!r}")
    return list(changes.values())


def with_live_settings(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A saved optimizer state with each group's settings replaced by the live optimizer's.

    `load_state_dict` replaces whole groups: the settings the optimizer was built with from the current
    config (weight decay, betas, eps) and for the current device (`fused`, `foreach`) gave way to the
    saved ones, so a changed config was silently ignored while the checkpoints recorded it, and a run
    started on CPU stayed unfused when resumed on CUDA. Only the moments and step counts are the
    interrupted run's to carry over; torch casts them by the groups given here (a fused group's step
    counts move to the parameters' device as float32), so switching `fused` either way is allowed.
    """
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return saved  # load_state_dict says what does not match
    live = [
        {k: v for k, v in group.items() if k not in ("params", "param_names")}
        for group in optimizer.param_groups
    ]
    return {**saved, "param_groups": [{**old, **new} for old, new in zip(groups, live, strict=True)]}
