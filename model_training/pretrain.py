"""`htmllm train`: pretraining with MLM + bag-of-words + teacher-weighted contrastive distillation.

`train(config)` reads top to bottom as the algorithm (after nanoGPT): set up the process (DDP under
torchrun), load shards and teacher vectors, build the encoder and the pretraining-only heads, resume if a
checkpoint exists, then loop: draw the step's loss coefficients, accumulate gradients over micro-batches,
clip, step AdamW at the trapezoidal learning rate, log, evaluate on held-out pages, checkpoint, and once
the schedule is complete export `model/`. The data is `run_data`'s, the model with its pretraining heads
`pretraining_model`'s, the held-out figures `heldout_eval`'s, the final outputs `final_export`'s. With
`loss_weights.distil = 0` the run reads no teacher vectors and builds no distillation head: it trains
MLM + bag-of-words alone.

Exact resume: a periodic checkpoint is a served-format checkpoint written by `service.core.checkpoint`
plus `trainer_state.pt` (optimizer, pretraining heads, loss scales, the coefficient and masking
generators, RNG states, step); `training_checkpoints` writes, finds and restores them. The data order is
a pure function of (seed, epoch, rank) (`batches.BatchOrder`), so the step number alone says where in
the data a resumed run continues, and an interrupted + resumed run produces the same losses as an
uninterrupted one.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from model_training.batches import BatchOrder, collate
from model_training.data import DataError, writable_dir
from model_training.devices import resolve_device
from model_training.final_export import (
    CURVE_FILE,
    SUMMARY_FILE,
    carry_heads,
    discard_outputs,
    export_changes,
    export_copy,
    own_export,
    reexport_records,
    swap_in,
    warn_replaced,
)
from model_training.heldout_eval import evaluate
from model_training.library_progress import drawn_as_bars, library_bars
from model_training.objectives import LossAggregator, MaskingConfig
from model_training.outputs import directories_to_make
from model_training.pretraining_model import PretrainingModel, all_special_ids, autocast, param_groups
from model_training.run_data import load_run_data
from model_training.train_config import TrainConfig
from model_training.train_logs import (
    METRICS_FILE,
    StepLines,
    last_train_record,
    log_record,
    open_tensorboard,
    plot_curves,
    strict_json,
    truncate_metrics,
)
from model_training.training_checkpoints import (
    check_resumable,
    data_identity,
    discard_checkpoints,
    gather_rank_states,
    latest_checkpoint,
    prune_checkpoints,
    restore,
    save_training_checkpoint,
    say_head_dropped,
    session_totals,
    warn_resume_changes,
)
from service.core.checkpoint import CheckpointMeta, save_checkpoint
from service.core.errors import ErrorCode, HtmllmError
from service.core.made_directories import remove_empty
from service.core.modeling import HtmlEncoderModel, build_config
from service.core.progress import progress_bar
from service.core.tokenizer import HtmlTokenizer

logger = logging.getLogger(__name__)

# --- schedule ---------------------------------------------------------------------------------------


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


def _run_length(max_steps: int, epochs: float, per_epoch: int, grad_accum: int) -> int:
    """Optimizer steps of a run: `max_steps`, or (0) `epochs` passes of `per_epoch` micro-batches."""
    return max_steps or max(1, int(epochs * per_epoch / grad_accum))


def _trained_total(training: dict[str, Any]) -> int | None:
    """The run length a checkpoint's steps were scheduled for, from its `training` record.

    Recorded as `total_steps` by every checkpoint since; an older one says it only by a `max_steps` in
    its config. Its `epochs` would count batches of its own size over the data of its time, neither of
    which the checkpoint records: None (unknown) then.
    """
    total = training.get("total_steps")
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        return total
    saved = training.get("config")
    max_steps = saved.get("max_steps") if isinstance(saved, dict) else None
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
        return max_steps
    return None


# --- checkpoint metadata (the checkpoints: training_checkpoints) ------------------------------------


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


# --- the loop ---------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    steps: int
    model_dir: Path | None
    summary: dict[str, Any]
    # Rank 0 (or the only process): the one that writes the outputs and reports them. Under torchrun
    # every rank returns, and each had printed its own report to the one stdout.
    master: bool = True


def train(config: TrainConfig, *, stop_at_step: int | None = None, resume: bool = True) -> TrainResult:
    """Run (or continue) pretraining as configured; `stop_at_step` ends early with a checkpoint."""
    if stop_at_step is not None and stop_at_step < 1:
        raise DataError(f"stop_at_step must be at least 1, got {stop_at_step}")
    # Process setup: one process per GPU under torchrun, else a single process.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if config.distils and config.batch_size * world < 2:
        # The contrastive loss takes its negatives from the micro-batch (gathered over the processes):
        # with one document there is none, the loss is exactly 0 and a run with grad_accum would train
        # without distillation while the config says it distils.
        raise DataError(
            f"config: batch_size {config.batch_size} on {world} process(es) leaves the distillation loss "
            "no negatives (it would be 0 at every step): use batch_size >= 2 (grad_accum for memory), or "
            "set loss_weights.distil = 0"
        )
    distributed = world > 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(resolve_device(config.device, local_rank=local_rank, source="config: "))
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
    made = directories_to_make(checkpoints) if master else []
    if master:
        writable_dir(checkpoints)
    started = time.perf_counter()

    try:
        # Data: token ids per document and, when the run distils, the teacher's vector for each;
        # held-out pages set aside.
        data = load_run_data(config)
    except BaseException:
        # Refused its data (a wrong --shards or --teacher), the run has written nothing: the run directory
        # it made for its checkpoints goes again, where it had been left empty to pass for a run.
        remove_empty(made)
        raise
    tokenizer, train_data, heldout, provenance = data.tokenizer, data.train, data.heldout, data.provenance
    shards_length = data.shards_length or config.max_length
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
    teacher_dim = data.teacher_dim  # None: no distillation, no teacher
    order = BatchOrder(len(train_data.ids), config.batch_size, seed=config.seed, rank=rank, world=world)
    per_step = config.grad_accum
    total_steps = _run_length(config.max_steps, config.epochs, order.per_epoch, per_step)
    if master:
        # Which of the two set the length: every shipped config sets max_steps, and a run that silently
        # ignored an `epochs` the user believed in took its length from elsewhere without a word.
        if config.max_steps:
            logger.info("run length: %d steps, from max_steps (epochs is not used)", total_steps)
        else:
            logger.info(
                "run length: %d steps, from epochs %g (%d training documents, %d per step; max_steps 0)",
                total_steps,
                config.epochs,
                len(train_data.ids),
                config.batch_size * per_step * world,
            )
    centroid = data.train_centroid()

    # Model: a randomly initialised encoder for the preset, plus the pretraining-only heads.
    model_config = build_config(config.preset, tokenizer, max_length=config.max_length)
    model = HtmlEncoderModel.from_config(
        model_config, pooling=config.pooling, attn_implementation=config.attn_implementation
    )
    if master:
        # The preset fixes the size only: the length is max_length (4096 unless set), whatever context
        # the preset table names, so `--preset tiny` alone is a tiny model at 4096 tokens.
        logger.info(
            "model: preset %s (%d layers, hidden %d, %.1fM parameters), max_length %d, %d ids",
            config.preset,
            model_config.num_hidden_layers,
            model_config.hidden_size,
            sum(p.numel() for p in model.parameters()) / 1e6,
            config.max_length,
            tokenizer.vocab_size,
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
        param_groups(pretraining, config.weight_decay),
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        fused=device.type == "cuda",
    )
    # Without a teacher the distillation loss is not computed at all, so it is no term of the total (and
    # draws no coefficient): the metrics and the summary leave it out rather than log a 0.
    weights = {name: weight for name, weight in config.loss_weights.items() if name in pretraining.loss_names}
    aggregator = LossAggregator(weights, seed=config.seed, random_coefficients=config.random_coefficients)
    mask_generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
    masking = MaskingConfig(mask_prob=config.mask_prob)

    # Resume from the newest periodic checkpoint, if any: same weights, optimizer, RNGs and step.
    step = 0
    found = latest_checkpoint(out) if resume else None
    if not resume and master:
        # --no-resume: the previous run's model/, summary and curve go before anything else is written
        # (a kill after this leaves none of them to be mistaken for this run's), then its checkpoints.
        # Only when asked: a run that merely finds no checkpoint (deleted to free disk, or an --out that
        # holds a model/ and its heads) keeps what is there until its own export replaces it, and the
        # run id below keeps an old model/ from passing for this run's.
        discard_outputs(out)
        discard_checkpoints(checkpoints)
    # The run's identity, written into every checkpoint and the export: model/ counts as this run's
    # final model only if it was exported from a checkpoint of the same run (`own_export`). A resume
    # keeps the checkpoint's; a checkpoint from before run ids gets a new one.
    found_training = check_resumable(found, config, tokenizer, teacher_dim) if found is not None else {}
    # The record whose session totals this session's add to (`session_totals`): None for a new run.
    resumed = found_training if found is not None else None
    found_run_id = found_training.get("run_id")
    run_id = str(found_run_id or uuid.uuid4().hex)
    last_step = total_steps if stop_at_step is None else min(stop_at_step, total_steps)
    if found is not None:
        restored = restore(
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
        step = restored.step
        logger.info("resumed from %s at step %d", found, step)
        if stop_at_step is not None and stop_at_step < step:
            # (it ran on from there, and nothing is taken back: the run would end at once, having
            # trained nothing, and its answer, no model, said nothing of why)
            raise DataError(
                f"stop_at_step (--stop-at-step) {stop_at_step} is behind the run, which is at step {step} "
                f"already ({found}): pass a later step, or --no-resume to start over"
            )
        trained_total = _trained_total(found_training)
        # A run whose schedule was complete (its own total reached) has nothing left to train whatever
        # the new total; of a checkpoint that does not say its total, only a total behind it is known
        # to be wrong.
        finished = step >= trained_total if trained_total is not None else step == total_steps
        if step >= total_steps and not finished:
            # Taken as finished, it exported a model whose learning rate never cooled down.
            of = f" of {trained_total}" if trained_total is not None else ""
            finish = f"{trained_total} or more" if trained_total is not None else f"above {step}"
            raise DataError(
                f"the run length of this config, {total_steps} steps, is not past the run, which is at "
                f"step {step}{of} already ({found}) and has not cooled down: a model exported now "
                f"would be unfinished; pass max_steps {finish} (--max-steps) to finish it, or "
                "--no-resume to start over"
            )
        if step < last_step:
            # Only a session that trains is told what it trains differently: a finished run run again
            # with other export options reads no document for training.
            if master and restored.head_dropped:
                say_head_dropped(found)
            warn_resume_changes(
                found,
                found_training,
                config,
                world=world,
                provenance=provenance,
                optimizer_changed=restored.optimizer_changed,
            )
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
        "config": config.record(),  # `teacher` null without distillation: no teacher was read
        "teacher": provenance["teacher"],
        "data": provenance["shards"].get("stats", {}),
        "data_identity": data_identity(provenance),
        "run_id": run_id,
        "world_size": world,
        # The schedule the steps of this session follow: a later resume with a smaller total tells
        # from it whether the run had finished (`_trained_total`).
        "total_steps": total_steps,
    }
    bar = progress_bar(
        total=total_steps, initial=step, desc="train", unit="step", disable=not (master and config.progress)
    )
    tokens_seen = 0
    lines = StepLines(total_steps, beside_bar=not bar.disable and drawn_as_bars(config.progress), world=world)
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
        raw = dict.fromkeys(pretraining.loss_names, 0.0)
        total_value = 0.0
        step_tokens = 0  # this process's real (unpadded) tokens of the step

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
            teacher = None if teacher_dim is None else torch.from_numpy(train_data.teacher[rows]).to(device)
            ids, mask, masked, labels = ids.to(device), mask.to(device), masked.to(device), labels.to(device)
            last_micro = not distributed or micro == per_step - 1
            sync = contextlib.nullcontext() if last_micro else _no_sync(engine)
            with sync:
                # The encoder runs under autocast; the losses inside switch it off (float32).
                with autocast(config, device):
                    losses = engine(ids, mask, masked, labels, teacher)
                total = aggregator.combine(losses, coefficients) / per_step
                total.backward()  # type: ignore[no-untyped-call]
            for name in raw:
                raw[name] += float(losses[name].detach()) / per_step
            total_value += float(total.detach())
            step_tokens += int(mask.sum())

        _check_finite(step + 1, raw, total_value, lr, device=device, distributed=distributed)
        tokens_seen += _all_processes(step_tokens, device=device, distributed=distributed)
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
            lines.log(step, raw, total_value, lr, tokens_seen)
            # Shown at the bar's next draw: a redraw here (tqdm's default) wrote a line per logged step
            # off a terminal, where the bar is meant to be a line every 30 s.
            bar.set_postfix({name: f"{value:.3f}" for name, value in raw.items()}, refresh=False)
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
            rank_states = gather_rank_states(mask_generator, distributed)
            if master:
                totals = session_totals(resumed, seconds=time.perf_counter() - started, tokens=tokens_seen)
                meta = _meta(
                    config,
                    pretraining.model,
                    tokenizer,
                    prune_version,
                    {**training_meta, "step": step, **totals},
                )
                with library_bars(config.progress):
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
                prune_checkpoints(checkpoints, config.keep_checkpoints)
            if distributed:
                dist.barrier()
    bar.close()
    if master and step < total_steps:
        # Stopped by --stop-at-step (the loop ends no earlier otherwise): the JSON report says only
        # "model": null, and a time-boxed session's log is where the next one is planned from.
        logger.info(
            "stopped at step %d of %d (--stop-at-step %s) with checkpoint %s: run the command again "
            "without --stop-at-step (or with a later one) to go on from there",
            step,
            total_steps,
            stop_at_step,
            checkpoints / f"step-{step:08d}",
        )

    # The served model: written once the schedule is complete, in the export dtype.
    model_dir: Path | None = None
    summary: dict[str, Any] = {}
    model_dir_done = out / "model"
    finished_before = master and step >= total_steps and step == resumed_step
    # model/ as this run's export of this step, if it is: with changed export options (`name`,
    # `export_dtype`, `max_length`) it is exported again, its task heads carried over.
    own_model = own_export(model_dir_done, step, found_run_id) if finished_before else None
    changes = export_changes(own_model, config) if own_model is not None else []
    if own_model is not None and not changes:
        # The command run again after the run finished: model/ is this run's export of this step
        # already, and may have task heads trained into it since (`htmllm heads train`); exporting
        # again would drop them.
        logger.info("%s is already the model of step %d; nothing to train or export", model_dir_done, step)
        model_dir = model_dir_done
        summary_file = out / SUMMARY_FILE
        summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
    elif master and step >= total_steps:
        if own_model is not None:
            # Exported again with other options: nothing was trained, so the summary and the training
            # record stay the training's (a session's zero tokens and seconds had replaced them); the
            # re-export is added to them as such.
            summary, export_training = reexport_records(own_model, config, changes)
        else:
            if not evaluation:
                evaluation = evaluate(
                    pretraining, heldout, config=config, device=device, train_centroid=centroid
                )
            seconds = time.perf_counter() - started
            summary = {
                "steps": step,
                "total_steps": total_steps,
                "train_documents": len(train_data.ids),
                "heldout_documents": len(heldout.ids),
                "tokens_seen_this_session": tokens_seen,
                "seconds_this_session": round(seconds, 1),
                **session_totals(resumed, seconds=seconds, tokens=tokens_seen),
                "heldout": evaluation,
                "final_train": last_train_record(metrics_file),
                "run_id": run_id,
            }
            export_training = {**training_meta, **summary}
        model_dir = model_dir_done
        export = export_copy(pretraining.model, config.export_dtype)
        if own_model is not None:
            carry_heads(model_dir_done, own_model, export, changes, step=step, max_length=config.max_length)
        # Written beside and swapped in, as the periodic checkpoints: a kill mid-write leaves the
        # previous model/ (or none), never a mix of two models' files.
        # The summary and curve go first: model/ is the last thing written, so a model/ of this run
        # means its summary is this run's too.
        tmp = model_dir.with_name(model_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with library_bars(config.progress):
            save_checkpoint(
                tmp,
                export,
                tokenizer,
                _meta(config, export, tokenizer, prune_version, export_training),
            )
        (out / SUMMARY_FILE).write_text(strict_json(summary, indent=2) + "\n", encoding="utf-8")
        plot_curves(metrics_file, out / CURVE_FILE)
        if own_model is None:
            warn_replaced(model_dir, step, run_id)
        swap_in(tmp, model_dir)
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
    return TrainResult(steps=step, model_dir=model_dir, summary=summary, master=master)


class TrainingDivergedError(HtmllmError):
    """A step whose loss is not finite: the run is stopped before the optimizer applies it."""

    code = ErrorCode.VALIDATION


def _check_finite(
    step: int, raw: dict[str, float], total: float, lr: float, *, device: torch.device, distributed: bool
) -> None:
    """Stop at the first step with a NaN or infinite loss, before its gradients reach the weights.

    Once one loss is NaN every later one is too (the weights are NaN after the step), and the run went
    on to its first checkpoint only to have it refused as holding NaN, the hours in between lost. Under
    DDP the verdict is agreed by all ranks (one scalar all-reduce), so no rank is left waiting at a
    collective for one that stopped.
    """
    diverged = not all(math.isfinite(value) for value in (*raw.values(), total))
    if distributed:
        flag = torch.tensor([float(diverged)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        diverged = bool(flag.item())
    if diverged:
        terms = ", ".join(f"{name} {value:.6g}" for name, value in {**raw, "total": total}.items())
        where = " on this process; one process's loss was not finite" if distributed else ""
        raise TrainingDivergedError(
            f"training diverged at step {step}: losses {terms}{where} at lr {lr:.3g}; nothing of this "
            "step was applied: lower lr (or raise warmup_frac) and run again, which resumes from the last "
            "checkpoint (--no-resume starts over)"
        )


def _all_processes(tokens: int, *, device: torch.device, distributed: bool) -> int:
    """The tokens of a step over all processes (one scalar all-reduce under DDP).

    Each process counted only its own documents, and rank 0 alone writes summary.json and the
    checkpoints: a run on 2 processes recorded half the tokens it trained on.
    """
    if not distributed:
        return tokens
    count = torch.tensor([tokens], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return int(count.item())


def _no_sync(engine: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """DDP's `no_sync`: skip the gradient all-reduce on micro-batches before the step's last."""
    context: contextlib.AbstractContextManager[Any] = engine.no_sync()  # type: ignore[operator]
    return context
