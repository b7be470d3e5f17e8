"""Run logs of `htmllm train`: metrics.jsonl, TensorBoard scalars and the training-curve PNG."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from model_training.train_config import TrainConfig
from service.core.atomic_files import replaced_atomically

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def open_tensorboard(out: Path, config: TrainConfig, *, resumed_at: int = 0) -> Any:
    """A SummaryWriter under OUT/tensorboard; None when disabled or not installed (jsonl still logs).

    A run resumed from the checkpoint of step N re-logs the steps after N that the interrupted session
    had already written, so events from step N + 1 on are purged (as `truncate_metrics` does for the
    jsonl), or TensorBoard would draw both sessions' values for those steps; a run started over
    (`--no-resume`, N = 0) hides every event of the earlier run.
    """
    if not config.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("tensorboard is not installed; logging to %s only", out / METRICS_FILE)
        return None
    return SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=resumed_at + 1)


def strict_json(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `value` with every NaN or infinite float written as null.

    Python's default writes bare `NaN` / `Infinity`, which is not JSON: `jq`, browsers and most
    other readers refuse the whole file for one such value.
    """
    return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def log_record(metrics_file: Path, writer: Any, record: dict[str, Any]) -> None:
    """Append one record to metrics.jsonl (the source of the curve and the card) and to TensorBoard."""
    with metrics_file.open("a", encoding="utf-8") as handle:
        handle.write(strict_json(record) + "\n")
    if writer is not None:
        for key, value in record.items():
            if key not in ("step", "split") and isinstance(value, float | int):
                writer.add_scalar(f"{record['split']}/{key}", value, record["step"])


class StepLines:
    """The log line of each logged step: losses, learning rate and tokens per second since the last.

    Through `logging`, not the bar: with `--no-progress` there is no bar, and a run (16 minutes for the
    default model) printed nothing until its final JSON; in a log file the bar is a line every 30 s at
    best. Beside a bar drawn on a terminal, the line is written above it (tqdm's logging redirect), not
    into it.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        beside_bar: bool = False,
        world: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total_steps = total_steps
        self.beside_bar = beside_bar
        # `tokens_seen` counts the tokens of every process (`pretrain` all-reduces them each step).
        self.unit = "tokens/s" if world == 1 else f"tokens/s on {world} processes"
        self._clock = clock
        self._since = clock()
        self._tokens = 0

    def log(self, step: int, raw: dict[str, float], total: float, lr: float, tokens_seen: int) -> None:
        """Log step `step`; `tokens_seen` counts this session's real (unpadded) tokens so far, of all
        processes. `raw` holds the losses the run trains ("distil" only where it distils)."""
        now = self._clock()
        elapsed = now - self._since
        rate = (tokens_seen - self._tokens) / elapsed if elapsed > 0 else 0.0
        self._since, self._tokens = now, tokens_seen
        redirect: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.beside_bar:
            from tqdm.contrib.logging import logging_redirect_tqdm

            redirect = logging_redirect_tqdm()
        with redirect:
            logger.info(
                "step %d/%d: %s (weighted total %.4f), lr %.3g, %.0f %s",
                step,
                self.total_steps,
                ", ".join(f"{name} {value:.4f}" for name, value in raw.items()),
                total,
                lr,
                rate,
                self.unit,
            )


def truncate_metrics(metrics_file: Path, step: int) -> None:
    """Drop records past `step` (a resumed run re-logs them), or start a fresh file at step 0.

    A session killed while appending leaves a torn last line; it is dropped like any record past the
    checkpoint (it was written after it), so the resumed session starts from whole lines.
    """
    if not metrics_file.is_file():
        return
    kept = [json.dumps(r) for r in read_metrics(metrics_file) if r["step"] <= step] if step else []
    with replaced_atomically(metrics_file) as tmp:  # interrupted, the records stay as they were
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def read_metrics(metrics_file: str | Path) -> list[dict[str, Any]]:
    """Every whole record of a metrics.jsonl ([] when there is none yet); a torn line is skipped."""
    path = Path(metrics_file)
    if not path.is_file():
        return []
    records: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("%s: line %d is not a whole record (an interrupted write); skipped", path, number)
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and "split" in record:
            records.append(record)
    return records


def last_train_record(metrics_file: Path) -> dict[str, Any]:
    """The last training-step record (the final losses reported in the summary)."""
    train_records = [r for r in read_metrics(metrics_file) if r["split"] == "train"]
    return train_records[-1] if train_records else {}


def plot_curves(metrics_file: str | Path, png: str | Path) -> None:
    """The training losses (raw and smoothed) and the held-out cosine, one PNG, a panel for each the run
    has.

    A run without distillation (`loss_weights.distil = 0`) logs no distillation loss and no cosine, and
    a run without held-out pages no cosine: their panels had been drawn empty beside the others.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_file)
    train_records = [r for r in records if r["split"] == "train"]
    heldout = [r for r in records if r["split"] == "heldout"]
    # Every run trains MLM and BOW (a weight of 0 still logs them); distillation only with a teacher.
    distilled = any("distil" in r for r in train_records) or any("distil_loss" in r for r in heldout)
    losses = ["mlm", "bow", *(["distil"] if distilled else [])]
    cosines = [r for r in heldout if "cosine" in r]
    panels = len(losses) + bool(cosines)
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.6), squeeze=False)
    for ax, name in zip(axes[0][: len(losses)], losses, strict=True):
        steps = [r["step"] for r in train_records]
        # A null (non-finite) is NaN, and so is a step from before a loss was logged.
        values = np.asarray([r.get(name) for r in train_records], dtype=float)
        ax.plot(steps, values, alpha=0.35, label="train (per step)")
        if len(values) >= 5:
            window = max(2, len(values) // 20)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1 :], smooth, label=f"train ({window}-point mean)")
        held = [(r["step"], r[f"{name}_loss"]) for r in heldout if f"{name}_loss" in r]
        if held:
            ax.plot(*zip(*held, strict=True), "o-", label="held-out")
        ax.set_title(f"{name} loss")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    if cosines:
        ax = axes[0][-1]
        ax.plot(
            [r["step"] for r in cosines], [r["cosine"] for r in cosines], "o-", label="student vs teacher"
        )
        ax.plot(
            [r["step"] for r in cosines],
            [r["centroid_cosine"] for r in cosines],
            "--",
            label="mean-teacher floor",
        )
        ax.legend(fontsize=7)
        ax.set_title("held-out cosine to the teacher")
        ax.set_xlabel("step")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
