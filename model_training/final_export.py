"""The run's final outputs: `model/` (the served export), `summary.json` and `training_curve.png`.

`pretrain.train` exports `model/` once its schedule is complete; what decides whether an existing
`model/` is this run's own export (its run id and step), what a re-export with other export options
(`EXPORT_KEYS`) keeps of the training's records and task heads, what replacing an earlier model loses,
and how `model/` is swapped in whole (never half of two models) live here, apart from the loop. The
periodic checkpoints are `training_checkpoints`'.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, cast

import torch

from model_training.train_config import TrainConfig
from model_training.training_checkpoints import SESSION_KEYS
from service.core.checkpoint import CheckpointMeta, load_checkpoint, read_meta
from service.core.errors import HtmllmError
from service.core.modeling import HtmlEncoderModel, TaskHead
from service.core.quantization import QUANTIZED_ONNX_FILES

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
CURVE_FILE = "training_curve.png"


def own_export(model_dir: Path, step: int, run_id: str | None) -> CheckpointMeta | None:
    """`model_dir`'s htmllm.json if it is the final export of `step` of the run `run_id` (the run of the
    checkpoint resumed from), else None.

    The run id, not the step or config: a run started over with --no-resume and killed between its
    final checkpoint and the export has the same step and possibly the same name, and its predecessor's
    model/ must not pass for its own. `run_id` None is a checkpoint from before run ids: compared as then.
    """
    try:
        meta = read_meta(model_dir)
    except HtmllmError:
        return None
    training = meta.training
    if run_id is not None and training.get("run_id") != run_id:
        return None
    return meta if training.get("steps") == step else None


# The keys of a config that shape the export of a finished run; the others cannot change a model whose
# training is over.
EXPORT_KEYS = ("name", "export_dtype", "max_length")


def export_changes(meta: CheckpointMeta, config: TrainConfig) -> list[str]:
    """The export options of `config` that differ from those `meta`'s export was made with."""
    saved = meta.training.get("config") or {}
    return [
        f"{key} {saved.get(key)!r} -> {getattr(config, key)!r}"
        for key in EXPORT_KEYS
        if saved.get(key) != getattr(config, key)
    ]


# The keys of summary.json (a subset of the export's `training` record): a re-export carries them over.
SUMMARY_KEYS = (
    "steps",
    "total_steps",
    "train_documents",
    "heldout_documents",
    "tokens_seen_this_session",
    "seconds_this_session",
    *SESSION_KEYS,
    "heldout",
    "final_train",
    "run_id",
    "exports",
)


def reexport_records(
    meta: CheckpointMeta, config: TrainConfig, changes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """summary.json and the `training` record of a finished run exported again with `changes`.

    Both are those of the training, read from `meta` (the run's own export, so its run id and step
    are checked): its figures, data and config, with only the export options (`EXPORT_KEYS`) of
    `config` applied, and the re-export appended to `exports` (what changed, and when, in UTC).
    The held-out figures stay those measured at the end of training, at the length it trained at.
    """
    training = dict(meta.training)
    saved = training.get("config") or {}
    exports = [
        *training.get("exports", []),
        {"changes": changes, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    ]
    training["config"] = {**saved, **{key: getattr(config, key) for key in EXPORT_KEYS}}
    training["exports"] = exports
    summary = {key: training[key] for key in SUMMARY_KEYS if key in training}
    return summary, training


def carry_heads(
    model_dir: Path,
    meta: CheckpointMeta,
    export: HtmlEncoderModel,
    changes: list[str],
    *,
    step: int,
    max_length: int,
) -> None:
    """Attach the task heads of `model_dir` (this run's export of `step`) to its new export.

    Only the export options changed: the encoder's weights are the same (at most cast to another dtype)
    and the heads, trained on its embeddings (`htmllm heads train`), stay valid; exported whole, the
    model had lost them. Their recorded metrics were measured at the length of the old export.
    """
    what = ", ".join(changes)
    if not meta.heads:
        logger.info("%s is the model of step %d; exporting it again with %s", model_dir, step, what)
        return
    try:
        heads = load_checkpoint(model_dir).model.heads
    except HtmllmError as exc:  # heads/ damaged by hand: the export goes on without them, said
        logger.warning(
            "%s is the model of step %d, exported again with %s; its task heads cannot be read and are "
            "not carried over (%s): train them again with `htmllm heads train`",
            model_dir,
            step,
            what,
            exc,
        )
        return
    for head in heads.values():
        export.add_head(cast(TaskHead, head))
    logger.info(
        "%s is the model of step %d; exporting it again with %s, its task heads carried over: %s",
        model_dir,
        step,
        what,
        ", ".join(heads),
    )
    old_length = (meta.training.get("config") or {}).get("max_length")
    if old_length is not None and old_length != max_length:
        logger.warning(
            "the metrics htmllm.json records for the task heads (%s) were measured at max_length %s; "
            "the model is now served at %d: run `htmllm heads train` again to measure them there",
            ", ".join(heads),
            old_length,
            max_length,
        )


def warn_replaced(model_dir: Path, step: int, run_id: str) -> None:
    """Say what of an earlier `model_dir` the export of `step` of run `run_id` replacing it does not carry
    over.

    A run trained on past its old end, or started again after its checkpoints were deleted, exports a
    new encoder: the task heads trained into the earlier model/ (`htmllm heads train`) fit the old
    encoder's embeddings, and its ONNX graphs hold the old weights, so neither is kept. They went without
    a word, and the user learned it from a service that served no heads.
    """
    try:
        meta = read_meta(model_dir)
    except HtmllmError:  # no model/ (the usual case), or one without a readable htmllm.json: none to name
        meta = None
    heads = [head.name for head in meta.heads] if meta is not None else []
    graphs = sorted(path.name for path in model_dir.glob("*.onnx"))
    if not heads and not graphs:
        return
    old_step = meta.training.get("steps") if meta is not None else None
    which = f"the model of step {old_step}" if isinstance(old_step, int) else "an earlier model"
    if meta is not None and meta.training_run_id != run_id:
        which += " of another run"
    dropped: list[str] = []
    if heads:
        dropped.append(
            f"its task heads {', '.join(heads)} (trained on the old encoder's embeddings): train them "
            f"again with `htmllm heads train --checkpoint {model_dir} --tasks TASKS_DIR`"
        )
    if graphs:
        quantized = {file: kind for kind, file in QUANTIZED_ONNX_FILES.items()}
        commands = [
            f"`htmllm export-onnx --checkpoint {model_dir}"
            + (f" --quantize {quantized[graph]}`" if graph in quantized else "`")
            for graph in graphs
        ]
        dropped.append(
            f"its ONNX graphs {', '.join(graphs)} (of the old weights): export again with "
            f"{' and '.join(commands)}"
        )
    logger.warning(
        "%s held %s; the model of step %d replaces it without %s",
        model_dir,
        which,
        step,
        "; and without ".join(dropped),
    )


def discard_outputs(out: Path) -> None:
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


def swap_in(new: Path, target: Path) -> None:
    """Replace directory `target` by the complete directory `new`."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def export_copy(model: HtmlEncoderModel, dtype_name: str) -> HtmlEncoderModel:
    """The model on CPU in the export dtype (a copy: the live one keeps training precision)."""
    dtype = getattr(torch, dtype_name)
    export = copy.deepcopy(model).cpu()
    export.encoder.to(dtype)
    return export
