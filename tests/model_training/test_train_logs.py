"""The log line of each logged training step (`train_logs.StepLines`), and the training curve."""

from __future__ import annotations

import gzip
import json
import logging
import struct
from pathlib import Path
from typing import Any

import pytest

from model_training.evaluation.derive import _store_page
from model_training.train_logs import StepLines, plot_curves, truncate_metrics
from service.core.pages import Page

RAW = {"mlm": 9.5, "bow": 8.25, "distil": 2.0}


def test_each_line_has_the_losses_lr_and_the_tokens_per_second_since_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="model_training")
    clock = iter([10.0, 12.0, 17.0]).__next__  # start, first line, second line
    lines = StepLines(150, clock=clock)
    lines.log(1, RAW, 1.5, 8e-5, tokens_seen=1000)
    lines.log(10, RAW, 1.25, 8e-4, tokens_seen=6000)
    assert [r.getMessage() for r in caplog.records] == [
        "step 1/150: mlm 9.5000, bow 8.2500, distil 2.0000 (weighted total 1.5000), lr 8e-05, 500 tokens/s",
        "step 10/150: mlm 9.5000, bow 8.2500, distil 2.0000 (weighted total 1.2500), lr 0.0008, "
        "1000 tokens/s",
    ]


def test_under_ddp_the_rate_is_said_to_be_of_all_processes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="model_training")
    lines = StepLines(4, world=2, clock=iter([0.0, 0.0]).__next__)  # no time passed: 0, not a division error
    lines.log(1, RAW, 1.0, 1e-3, tokens_seen=10)
    assert caplog.records[0].getMessage().endswith(", 0 tokens/s on 2 processes")


def test_beside_a_terminal_bar_the_line_goes_through_tqdm(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Written into a bar drawn on a terminal, a log line lands mid-bar; tqdm writes it above."""
    import tqdm.contrib.logging as tqdm_logging

    entered: list[bool] = []
    real = tqdm_logging.logging_redirect_tqdm

    def spy(*args: object, **kwargs: object) -> object:
        entered.append(True)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tqdm_logging, "logging_redirect_tqdm", spy)
    caplog.set_level(logging.INFO, logger="model_training")
    StepLines(2, clock=iter([0.0, 1.0, 2.0]).__next__).log(1, RAW, 1.0, 1e-3, tokens_seen=1)
    assert entered == []
    StepLines(2, beside_bar=True, clock=iter([0.0, 1.0]).__next__).log(1, RAW, 1.0, 1e-3, tokens_seen=1)
    assert entered == [True] and len(caplog.records) == 2


def _cut_short(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """`Path.<method>` writes half its data, then Ctrl-C arrives."""
    real = getattr(Path, method)

    def cut(self: Path, data: Any, *args: Any, **kwargs: Any) -> Any:
        real(self, data[: len(data) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, method, cut)


def test_an_interrupted_truncation_leaves_the_records_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """metrics.jsonl was rewritten in place as a run resumed: a Ctrl-C then could empty it."""
    metrics = tmp_path / "metrics.jsonl"
    before = "".join(json.dumps({"step": step, "loss": 1.0}) + "\n" for step in (1, 2, 3))
    metrics.write_text(before, encoding="utf-8")
    _cut_short(monkeypatch, "write_text")
    with pytest.raises(KeyboardInterrupt):
        truncate_metrics(metrics, 2)
    monkeypatch.undo()
    assert metrics.read_text(encoding="utf-8") == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_a_derived_page_cut_short_is_not_left_to_be_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page files are content-addressed and kept when present: a half-written one was reused by every
    later `tasks derive`."""
    page = Page(id="p", html=b"<html><body><p>" + b"words " * 2000 + b"</p></body></html>")
    _cut_short(monkeypatch, "write_bytes")
    with pytest.raises(KeyboardInterrupt):
        _store_page(tmp_path, page)
    monkeypatch.undo()
    assert not any(path.is_file() for path in tmp_path.rglob("*"))
    stored = tmp_path / _store_page(tmp_path, page).removeprefix("../")
    assert gzip.decompress(stored.read_bytes()) == page.html


def _panels(png: Path) -> int:
    """The panels of a `plot_curves` PNG, from its width (each panel 4 inches at 110 dpi)."""
    width = struct.unpack(">I", png.read_bytes()[16:20])[0]  # the IHDR chunk's width
    assert width % 440 == 0
    return int(width // 440)


def _metrics(path: Path, train: dict[str, float], heldout: dict[str, float] | None) -> Path:
    records = [{"step": step, "split": "train", **train} for step in (1, 2, 3)]
    if heldout is not None:
        records.append({"step": 3, "split": "heldout", **heldout})
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_curve_draws_only_the_panels_the_run_has(tmp_path: Path) -> None:
    """A run without distillation had an empty "distil loss" panel and an empty "held-out cosine to the
    teacher" panel beside its MLM and BOW curves."""
    png = tmp_path / "curve.png"
    no_teacher = {"mlm_loss": 6.0, "bow_loss": 5.0, "documents": 4}
    plot_curves(_metrics(tmp_path / "a.jsonl", {"mlm": 6.5, "bow": 5.5}, no_teacher), png)
    assert _panels(png) == 2
    distilled = {"mlm": 6.5, "bow": 5.5, "distil": 2.0}
    plot_curves(_metrics(tmp_path / "b.jsonl", distilled, None), png)  # no held-out pages: no cosine
    assert _panels(png) == 3
    heldout = {**no_teacher, "distil_loss": 1.5, "cosine": 0.4, "centroid_cosine": 0.3, "top1": 0.5}
    plot_curves(_metrics(tmp_path / "c.jsonl", distilled, heldout), png)
    assert _panels(png) == 4
