"""The log line of each logged training step (`train_logs.StepLines`)."""

from __future__ import annotations

import logging

import pytest

from model_training.train_logs import StepLines

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


def test_under_ddp_the_rate_is_said_to_be_this_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="model_training")
    lines = StepLines(4, world=2, clock=iter([0.0, 0.0]).__next__)  # no time passed: 0, not a division error
    lines.log(1, RAW, 1.0, 1e-3, tokens_seen=10)
    assert caplog.records[0].getMessage().endswith(", 0 tokens/s on this process")


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
