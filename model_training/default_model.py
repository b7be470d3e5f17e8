"""The last step of `make default-model`: bundle a finished run into `service/assets/default-model/`.

    python -m model_training.default_model --run runs/default-model --out service/assets/default-model

copies the run's served checkpoint (with the heads `htmllm heads train` added), checks that it loads
strictly and fits the size budget, copies the training curve into docs/, and writes MODEL_CARD.md from
the figures the pipeline recorded: tokenizer, shards, teacher, pretraining summary, heads' metrics and
the evaluation report. Nothing in the card is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model_training.data import read_manifest
from model_training.evaluation.tasks import HASH_METRIC
from model_training.final_export import CURVE_FILE, SUMMARY_FILE
from model_training.teacher import TeacherMeta, read_teacher_meta
from service.core.checkpoint import copy_checkpoint, load_checkpoint
from service.core.errors import CheckpointError
from service.core.modeling import HeadSpec

MAX_BUNDLE_BYTES = 40 * 1024 * 1024
CARD_FILE = "MODEL_CARD.md"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "htmllm.json")
# The card's heads section lies between these lines: `htmllm heads train` rewrites it from htmllm.json
# after adding or replacing heads (`update_card_heads`), and leaves the rest of the card, which a user may
# have edited by hand, as it is. Comments: a Markdown viewer shows neither.
HEADS_BEGIN = "<!-- htmllm heads: from htmllm.json; `htmllm heads train` rewrites up to the end line -->"
HEADS_END = "<!-- /htmllm heads -->"
# How cards written before the markers (the bundled model's) begin the section, and its table's header.
HEADS_HEADING = "### Task heads (`htmllm heads train`, cross-validated by site)"
HEADS_TABLE_HEADER = "| Head | Kind | Classes | Metrics |"


def _load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _format_metrics(metrics: dict[str, float]) -> str:
    """`f1_macro 0.651 ± 0.044, 945 pages` from a head's recorded metrics."""
    parts: list[str] = []
    for name, value in sorted(metrics.items()):
        if name.endswith("_std") or name in ("pages", "cv_folds", "max_length", HASH_METRIC):
            continue
        std = metrics.get(f"{name}_std")
        parts.append(f"{name} {value:.3f}" + (f" ± {std:.3f}" if std is not None else ""))
    if "pages" in metrics:
        parts.append(f"{int(metrics['pages'])} pages")
    if "cv_folds" in metrics:
        parts.append(f"{int(metrics['cv_folds'])}-fold CV")
    if "max_length" in metrics:  # the length the head was trained and measured at (`heads train`)
        parts.append(f"at {int(metrics['max_length'])} tokens")
    if HASH_METRIC in metrics:  # which pages, labels and folds: report.json's tasks[].sha256 starts so
        parts.append(f"tasks sha256 {int(metrics[HASH_METRIC]):012x}")
    return ", ".join(parts) or "-"


def heads_line(heads: Sequence[HeadSpec]) -> str:
    """The card's "What it is" line naming the heads."""
    return f"- Heads: {', '.join(s.name for s in heads) or 'none'}."


def heads_section(heads: Sequence[HeadSpec]) -> list[str]:
    """The card's heads section, between its markers: with no heads, the markers alone, for a later
    `htmllm heads train` to fill."""
    lines = [HEADS_BEGIN]
    if heads:
        lines += [HEADS_HEADING, "", HEADS_TABLE_HEADER, "|---|---|---|---|"]
        for spec in heads:
            lines.append(
                f"| {spec.name} | {spec.kind} | {len(spec.labels) or '-'} | {_format_metrics(spec.metrics)} |"
            )
        lines.append("")  # a table ends at a blank line: the end marker is no row of it
    lines.append(HEADS_END)
    return lines


def _section_bounds(lines: Sequence[str]) -> tuple[int, int] | None:
    """[start, end) of the heads section in a card's lines: between the markers, or, in a card written
    before them, the heading and the table that follows it; None where neither is found intact."""
    stripped = [line.strip() for line in lines]
    if stripped.count(HEADS_BEGIN) == 1 and stripped.count(HEADS_END) == 1:
        start, end = stripped.index(HEADS_BEGIN), stripped.index(HEADS_END)
        return (start, end + 1) if start < end else None
    if HEADS_BEGIN in stripped or HEADS_END in stripped or stripped.count(HEADS_HEADING) != 1:
        return None  # a marker lost, or doubled: which lines are ours is a guess
    start = stripped.index(HEADS_HEADING)
    if stripped[start + 1 : start + 3] != ["", HEADS_TABLE_HEADER]:
        return None
    end = start + 3
    while end < len(stripped) and stripped[end].startswith("|"):
        end += 1
    return start, end


def update_card_heads(text: str, before: Sequence[HeadSpec], after: Sequence[HeadSpec]) -> str | None:
    """A card's text with its heads section rewritten for the heads `after`, and its "- Heads:" line
    too where it still names the heads `before` (the user's wording is left alone); None where the
    card has no heads section to find (a card written by hand), for the caller to say it is stale.

    The heads of a published checkpoint's card had stayed those it was bundled with after `htmllm
    heads train` added or replaced some, while htmllm.json and /info listed the new ones.
    """
    newline = "\r\n" if "\r\n" in text else "\n"  # a card saved on Windows keeps its line ends
    lines = text.replace("\r\n", "\n").split("\n")
    bounds = _section_bounds(lines)
    if bounds is None:
        return None
    start, end = bounds
    lines[start:end] = heads_section(after)
    old_line = heads_line(before)
    return newline.join(heads_line(after) if line == old_line else line for line in lines)


def _results_section(report_md: Path) -> str:
    """The "## Results" section of the evaluation report (the table of systems), if there is one."""
    if not report_md.is_file():
        return ""
    text = report_md.read_text(encoding="utf-8")
    start = text.find("## Results")
    if start < 0:
        return ""
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else len(text)].strip()
    return section.replace("## Results", "### Frozen-encoder evaluation (`htmllm eval run`)", 1)


def _pages(count: object) -> str:
    """A page count as the card prints it: `1,033`, or `?` where the run recorded none."""
    if isinstance(count, bool) or not isinstance(count, int | float):
        return "?"
    return f"{int(count):,}"


def _labelled_pages(heads: Sequence[HeadSpec]) -> str:
    """The pages the heads' figures were measured on, as a count or a range (`467-945`); "" for none."""
    counts = sorted({int(spec.metrics["pages"]) for spec in heads if "pages" in spec.metrics})
    if not counts:
        return ""
    return _pages(counts[0]) if len(counts) == 1 else f"{_pages(counts[0])}-{_pages(counts[-1])}"


def _pretraining_seconds(summary: dict[str, Any]) -> Any:
    """The pretraining time the card gives: the run's over all its sessions where it records that, else
    the last session's (a run from before the totals)."""
    total = summary.get("seconds_all_sessions")
    return total if total is not None else summary.get("seconds_this_session")


def _pretraining_note(summary: dict[str, Any]) -> str:
    """What the card's pretraining time is, ending its time line."""
    sessions = summary.get("sessions")
    if summary.get("seconds_all_sessions") is not None:
        if isinstance(sessions, int) and sessions > 1:
            return (
                f"; pretraining's is the sum of the run's {sessions} sessions (a session killed after its "
                "last checkpoint counts up to that checkpoint: the next trained its later steps again)."
            )
        return "."
    if summary.get("seconds_this_session") is not None:
        return (
            "; pretraining's is the session's that finished the run (a resumed run's earlier sessions are "
            "not counted)."
        )
    return "."


def _distilled(training: dict[str, Any]) -> bool:
    """Whether the run trained the distillation objective, from its checkpoint's `training` record.

    A run with `loss_weights.distil = 0` reads no teacher (its record's `teacher` is null); one from
    before that, which read a teacher it gave weight 0, did not distil either.
    """
    weights = (training.get("config") or {}).get("loss_weights") or {}
    return training.get("teacher", {}) is not None and weights.get("distil", 1.0) > 0


def _teacher_line(teacher: TeacherMeta | None) -> str:
    """The card's teacher line: which model read what, or that there was none."""
    if teacher is None:
        return "- Teacher: none; no distillation was used (`loss_weights.distil = 0`)."
    return (
        f"- Teacher: `{teacher.model}` ({teacher.dim}-d) on the page's {teacher.view} "
        f"(union extraction; {teacher.fallbacks} pages with no extracted text used pruned HTML), "
        f"truncated to {teacher.max_seq_length} of its tokens."
    )


def _objectives_line(config: dict[str, Any], distilled: bool) -> str:
    """The card's objectives line, naming distillation only where the run trained it (its weights too:
    `'distil': 0.0` beside "no distillation" named a loss the run never computed)."""
    distillation = (
        f", teacher-weighted contrastive distillation (rank-{config.get('distil_rank')} head, "
        f"temperature {config.get('temperature')})"
        if distilled
        else " (no distillation)"
    )
    weights = config.get("loss_weights")
    if isinstance(weights, dict) and not distilled:
        weights = {name: weight for name, weight in weights.items() if name != "distil"}
    return (
        f"- Objectives: MLM ({config.get('mask_prob')} masking, 80/10/10, tied decoder), bag-of-words from "
        f"[CLS]{distillation}; weights {weights}, each divided by its first-batch value "
        "and multiplied by a fresh U(0,1) per step."
    )


def _measured(record: dict[str, Any], *keys: str) -> str | None:
    """`record`'s figures `keys` as the card prints them (`6.140 / 5.998`); None where one of them was
    not measured: a 0.000 in its place read as a measurement."""
    values = [record.get(key) for key in keys]
    if any(isinstance(value, bool) or not isinstance(value, int | float) for value in values):
        return None
    return " / ".join(f"{value:.3f}" for value in values)


def _heldout_pages(heldout: dict[str, Any]) -> int | None:
    """The pages the held-out figures were measured on; None for a run without held-out pages
    (`htmllm data prepare --holdout-fraction 0`), whose `heldout` record is empty."""
    count = heldout.get("documents")
    if isinstance(count, bool) or not isinstance(count, int | float) or count <= 0:
        return None
    return int(count)  # runs before the count was an int recorded it as a float (10.0)


def _figure_rows(heldout: dict[str, Any], final: dict[str, Any], distilled: bool) -> list[str]:
    """The figures table's rows, those the run measured only: a run without distillation has no teacher
    figures and a run without held-out pages no held-out ones; a 0.000 printed for either read as a
    measurement."""
    losses = ("mlm", "bow", "distil") if distilled else ("mlm", "bow")
    names = "MLM / BOW / distillation" if distilled else "MLM / BOW"
    pages = _heldout_pages(heldout)
    rows: list[tuple[str, str | None]] = []
    if pages is not None:
        if distilled:
            rows += [
                ("Distillation cosine to the teacher (projected student)", _measured(heldout, "cosine")),
                ("Same, constant mean-teacher prediction (the floor)", _measured(heldout, "centroid_cosine")),
                ("Teacher retrieval top-1 among held-out pages", _measured(heldout, "top1")),
            ]
        rows += [
            ("Held-out pages", f"{pages:,}"),
            (f"{names} loss, held out", _measured(heldout, *(f"{name}_loss" for name in losses))),
        ]
    rows.append((f"{names} loss, last training step", _measured(final, *losses)))
    return [f"| {label} | {value} |" for label, value in rows if value is not None]


def _figures_intro(heldout: dict[str, Any]) -> str:
    """The line above the figures table: what the held-out figures were measured on, or that there are
    none (the table had printed 0.000 held-out losses for a run without held-out pages)."""
    if _heldout_pages(heldout) is None:
        return (
            "No pages were held out (the shards have none: `htmllm data prepare --holdout-fraction 0`), so "
            "there are no held-out figures; the losses are the last training step's:"
        )
    return "Held-out pages (sites never seen in training), clean input (the MLM loss: masked, fixed masks):"


def _limits_line(heldout: dict[str, Any], labelled: str) -> str:
    """The card's line on how noisy its figures are, naming the pages they were measured on."""
    pages = _heldout_pages(heldout)
    measured = [
        *([f"{pages:,} held-out pages"] if pages is not None else []),
        *([f"{labelled} labelled pages"] if labelled else []),
    ]
    if not measured:
        return "- No pages were held out: the pretraining figures are training losses, none of unseen pages."
    return (
        f"- Figures on {' and '.join(measured)} are noisy; compare them with the baselines in the same "
        "table, not with the paper."
    )


def render_card(run: Path, bundle: Path, *, eval_dir: Path | None, curve: Path | None = None) -> str:
    """MODEL_CARD.md from the run's recorded figures; `curve` is where the training curve is copied (None:
    the run's own, where it has one).

    Every figure is the run's: the pages, the corpus and the device its manifest and config record (the
    card had said "~1,000 pages" of the shared corpus on 2 CPU cores for any run). The pretraining time
    is that of all the run's sessions (`seconds_all_sessions`); a run from before the totals records only
    the session that finished it, and the card says so rather than pass it for the whole."""
    checkpoint = load_checkpoint(bundle)
    meta = checkpoint.meta
    training = meta.training
    config = training.get("config", {})
    summary = _load_json(run / "pretrain" / SUMMARY_FILE) or training
    heldout = summary.get("heldout", {})
    final = summary.get("final_train", {})
    tokenizer_report = _load_json(run / "tokenizer" / "training.json")
    shards = read_manifest(run / "shards")
    stats = shards.get("stats", {})
    distilled = _distilled(training)
    # Without distillation the run read no teacher vectors: run/teacher need not exist.
    teacher = read_teacher_meta(run / "teacher") if distilled else None
    params = sum(p.numel() for p in checkpoint.model.encoder.parameters())
    seconds = {
        "tokenizer": tokenizer_report.get("seconds"),
        "shards": _load_json(run / "logs" / "data.json").get("seconds"),
        "teacher": teacher.seconds if teacher is not None else None,
        "pretraining": _pretraining_seconds(summary),
    }
    corpus = f"`{shards['source']}`" if shards.get("source") else "its corpus"
    if curve is None and (run / "pretrain" / CURVE_FILE).is_file():
        curve = run / "pretrain" / CURVE_FILE
    labelled = _labelled_pages(meta.heads)
    lines = [
        f"# {meta.name}: the bundled default model",
        "",
        "A **small, demo-quality** HTML encoder so that `make serve` works out of the box. It is the "
        f"`{config.get('preset')}` preset of our ModernBERT encoder, pretrained (device and time below) "
        f"on the {_pages(stats.get('pages'))} pages of {corpus}. "
        "The paper's models were trained on millions of pages on 8xH100; do not expect this one to be good "
        "at anything beyond demonstrating the pipeline end to end. Retrain with `make default-model` (or "
        "`htmllm train` on your own shards).",
        "",
        "## What it is",
        "",
        f"- Encoder: ModernBERT `{config.get('preset')}` preset, {meta.embedding_dim}-d embeddings, "
        f"{params / 1e6:.1f}M parameters, stored as {config.get('export_dtype')}; pooling `{meta.pooling}`.",
        f"- Input: pruned HTML (prune version {meta.prune_version}), at most {meta.max_length} tokens.",
        f"- Tokenizer: HTML-aware WordPiece, {checkpoint.tokenizer.vocab_size} ids with "
        f"{len(checkpoint.tokenizer.tag_token_ids)} tag tokens, trained on "
        f"{tokenizer_report.get('pages', '?')} pruned pages (sha256 {meta.tokenizer_sha256[:16]}).",
        heads_line(meta.heads),
        "",
        "## How it was trained",
        "",
        f"- Data: `htmllm data prepare` on {stats.get('pages', '?')} pages: {stats.get('written', '?')} kept "
        f"({stats.get('train', '?')} train, {stats.get('heldout', '?')} held out by domain), "
        f"{stats.get('tokens', 0):,} tokens; at most {shards.get('sampling', {}).get('per_domain', '?')} "
        f"pages per domain; skipped: {stats.get('skipped') or 'none'}.",
        _teacher_line(teacher),
        _objectives_line(config, distilled),
        f"- Optimisation: AdamW, peak lr {config.get('lr')}, trapezoidal schedule "
        f"({config.get('warmup_frac')} warm-up, {config.get('cooldown_frac')} cool-down), "
        f"{summary.get('steps')} steps of {config.get('batch_size')} x {config.get('grad_accum')} pages, "
        f"{config.get('max_length')} tokens, on {config.get('device')}.",
        "- Time (seconds, on the machine that built it): "
        + ", ".join(f"{k} {v}" for k, v in seconds.items() if v is not None)
        + _pretraining_note(summary),
        "",
        "## Figures",
        "",
        _figures_intro(heldout),
        "",
        "| Figure | Value |",
        "|---|---|",
        *_figure_rows(heldout, final, distilled),
        "",
        *([f"The training curve is `{curve}`.", ""] if curve is not None else []),
    ]
    lines += [*heads_section(meta.heads), ""]
    results = _results_section(eval_dir / "report.md") if eval_dir is not None else ""
    if results:
        lines += [results, ""]
    lines += [
        "## Limits",
        "",
        f"- Trained on {_pages(stats.get('written'))} pages of {corpus}.",
        f"- Pages longer than {meta.max_length} tokens of pruned HTML are truncated.",
        _limits_line(heldout, labelled),
        "- Embeddings are for demos and tests of the service; use a properly pretrained checkpoint for",
        "  anything that matters.",
        "",
    ]
    return "\n".join(lines)


def bundle(run: Path, out: Path, *, curve: Path | None, eval_dir: Path | None) -> Path:
    """Copy the run's checkpoint to `out`, verify it, write the card; returns the card's path."""
    source = run / "pretrain" / "model"
    for name in CHECKPOINT_FILES:
        if not (source / name).is_file():
            raise SystemExit(f"{source} has no {name}: run the pretraining step first")
    # Built beside `out` and moved into place once complete: a copy that fails half way (a disk full, a
    # checkpoint that kept changing) leaves the assets as they were, not a half-written model.
    staging = out.with_name(out.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    # As a load reads it: a `save_heads` killed after its commit point completed (or read through), its
    # stage and lock left behind, and copied again should a save overtake the copy.
    try:
        copy_checkpoint(source, staging)
    except CheckpointError as exc:
        raise SystemExit(str(exc)) from exc
    size = _directory_bytes(staging)
    if size > MAX_BUNDLE_BYTES:
        raise SystemExit(
            f"{source} is {size / 2**20:.1f} MiB, over the {MAX_BUNDLE_BYTES / 2**20:.0f} MiB budget"
        )
    card = staging / CARD_FILE
    copied = curve if curve is not None and (run / "pretrain" / CURVE_FILE).is_file() else None
    card.write_text(render_card(run, staging, eval_dir=eval_dir, curve=copied), encoding="utf-8")
    card.chmod(0o644)
    replaced = out.with_name(out.name + ".old")
    if replaced.exists():
        shutil.rmtree(replaced)
    if out.exists():
        out.rename(replaced)
    staging.rename(out)
    shutil.rmtree(replaced, ignore_errors=True)
    card = out / CARD_FILE
    if curve is not None and (run / "pretrain" / CURVE_FILE).is_file():
        curve.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run / "pretrain" / CURVE_FILE, curve)
    return card


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bundle a default-model run into the service's assets")
    parser.add_argument(
        "--run", type=Path, default=Path("runs/default-model"), help="the pipeline's run directory"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("service/assets/default-model"), help="bundle directory (replaced)"
    )
    parser.add_argument(
        "--curve", type=Path, default=Path("docs/training_curve.png"), help="copy the curve here"
    )
    parser.add_argument("--eval", type=Path, default=None, help="an `htmllm eval run` report directory")
    args = parser.parse_args(argv)
    card = bundle(args.run, args.out, curve=args.curve, eval_dir=args.eval)
    print(f"wrote {args.out} ({_directory_bytes(args.out) / 2**20:.1f} MiB) and {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
