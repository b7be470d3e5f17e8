"""The evaluation report: Markdown tables, the JSON of every figure, and a plot of metric vs length.

The main table has one row per system (checkpoints and baselines) and one column per task, each cell the
k-fold mean ± std, plus the NMM against the random-embedding row. The truncation study (the paper's
Table 3) and the input study (Table 4) are views of the same rows, shown when the run varied them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from model_training.evaluation.runner import EvalResult, SystemResult

MARKDOWN_FILE = "report.md"
JSON_FILE = "report.json"
PLOT_FILE = "context_length.png"


def _cell(system: SystemResult, task: str) -> str:
    result = system.scores.get(task)
    return f"{result.mean:.3f} ± {result.std:.3f}" if result is not None else "–"


def _nmm(system: SystemResult) -> str:
    return f"{system.nmm:.3f}" if system.nmm is not None else "–"


def _folds(result: EvalResult) -> str:
    """ "5-fold", or what the tasks had when their rows carried different fold counts (`--folds` is only
    the count for tasks without folds of their own): the report had said 5-fold whatever the run used."""
    counts = sorted({int(t["folds"]) for t in result.tasks})
    return f"{counts[0]}-fold" if len(counts) == 1 else "k-fold (per task: the Folds column)"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def render_markdown(result: EvalResult, *, title: str = "Evaluation report") -> str:
    tasks = [t["name"] for t in result.tasks]
    metric_of = {t["name"]: t["metric"] for t in result.tasks}
    lines = [f"# {title}", ""]
    lines += _table(
        ["Task", "Kind", "Metric", "Pages", "Sites", "Folds", "Classes"],
        [
            [
                t["name"],
                t["kind"],
                t["metric"],
                str(t["pages"]),
                str(t["sites"]),
                str(t["folds"]),
                ", ".join(t["labels"]) or "–",
            ]
            for t in result.tasks
        ],
    )
    if result.excluded:
        lines += [
            "",
            f"{len(result.excluded)} page(s) excluded from every system (failed pruning or extraction).",
        ]
    task_header = [f"{t} ({metric_of[t]})" for t in tasks]
    lines += [
        "",
        "## Results",
        "",
        f"{_folds(result)} cross-validation by site (mean ± std over folds); "
        "NMM against the random-embedding row.",
        "",
    ]
    lines += _table(
        ["System", *task_header, "NMM", f"Head params ({tasks[0]})"],
        [[s.name, *(_cell(s, t) for t in tasks), _nmm(s), f"{s.head_parameters:,}"] for s in result.systems],
    )
    if result.spread:
        seeds = next(iter(result.spread.values()))["seeds"]
        lines += [
            "",
            "## Seed spread",
            "",
            f"Each figure's mean ± sample std over {len(seeds)} runs with seeds {seeds} (head "
            "initialisation, data order, early-stopping sites; the folds too where the tasks' rows carry "
            "none). The tables above are the first seed's. Differences smaller than these stds are noise.",
            "",
        ]

        def spread(name: str, figure: str) -> str:
            value = result.spread.get(name, {}).get(figure)
            return f"{value['mean']:.3f} ± {value['std']:.3f}" if value else "–"

        lines += _table(
            ["System", *task_header, "NMM"],
            [[s.name, *(spread(s.name, t) for t in tasks), spread(s.name, "nmm")] for s in result.systems],
        )
    checkpoints = [s for s in result.systems if s.kind == "checkpoint"]
    order = {c: i for i, c in enumerate(dict.fromkeys(s.checkpoint for s in checkpoints))}  # as given
    if len({s.truncate for s in checkpoints}) > 1:
        lines += ["", "## Context length (truncation study)", ""]
        rows = sorted(checkpoints, key=lambda s: (order[s.checkpoint], s.input or "", s.truncate or 0))
        lines += _table(
            ["Checkpoint", "Input", "Max tokens", "Pages truncated", *task_header, "NMM"],
            [
                [
                    s.model or s.name,
                    s.input or "",
                    str(s.truncate),
                    f"{100 * (s.truncated_fraction or 0):.0f}%",
                    *(_cell(s, t) for t in tasks),
                    _nmm(s),
                ]
                for s in rows
            ],
        )
    if len({s.input for s in checkpoints}) > 1:
        lines += ["", "## Pruned HTML vs extracted text (input study)", ""]
        rows = sorted(checkpoints, key=lambda s: (order[s.checkpoint], s.truncate or 0, s.input or ""))
        lines += _table(
            ["Checkpoint", "Max tokens", "Input", *task_header, "NMM"],
            [
                [
                    s.model or s.name,
                    str(s.truncate),
                    s.input or "",
                    *(_cell(s, t) for t in tasks),
                    _nmm(s),
                ]
                for s in rows
            ],
        )
    return "\n".join(lines) + "\n"


def render_plot(result: EvalResult, path: Path) -> bool:
    """Metric vs context length per task (and NMM); baselines as horizontal lines. False: nothing to plot."""
    checkpoints = [s for s in result.systems if s.kind == "checkpoint"]
    if not checkpoints:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t["name"], t["metric"]) for t in result.tasks]
    if any(s.nmm is not None for s in result.systems):
        panels.append(("NMM", "NMM"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    series: dict[tuple[str, str], list[SystemResult]] = {}
    for s in checkpoints:
        series.setdefault((s.model or s.name, s.input or ""), []).append(s)

    def value(s: SystemResult, panel: str) -> float | None:
        if panel == "NMM":
            return s.nmm
        return s.scores[panel].mean if panel in s.scores else None

    lengths = sorted({s.truncate for s in checkpoints if s.truncate is not None})
    for ax, (panel, metric) in zip(axes[0], panels, strict=True):
        for (name, input_mode), rows in series.items():
            rows = sorted(rows, key=lambda s: s.truncate or 0)
            points = [(s.truncate, value(s, panel)) for s in rows if value(s, panel) is not None]
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], marker="o", label=f"{name} ({input_mode})"
            )
        for s in result.systems:
            if s.kind != "checkpoint" and value(s, panel) is not None:
                ax.axhline(value(s, panel), linestyle="--", linewidth=1, color="grey")
                ax.annotate(
                    s.name,
                    (0.01, value(s, panel)),
                    xycoords=("axes fraction", "data"),
                    fontsize=6,
                    color="grey",
                    va="bottom",
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("max tokens")
        ax.set_ylabel(metric)
        ax.set_title(panel)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(result: EvalResult, out: str | Path, *, title: str = "Evaluation report") -> list[Path]:
    """Write report.md, report.json and (with a checkpoint row) context_length.png under `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / MARKDOWN_FILE, out / JSON_FILE]
    written[0].write_text(render_markdown(result, title=title), encoding="utf-8")
    written[1].write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    if render_plot(result, out / PLOT_FILE):
        written.append(out / PLOT_FILE)
    return written
