"""transformers' and huggingface_hub's bars follow our progress setting and stay off a log file."""

from __future__ import annotations

import importlib
import io
import sys

import pytest
from transformers.utils import logging as hf_logging

from model_training.library_progress import drawn_as_bars, library_bars

# (the module: `huggingface_hub.utils.tqdm` as an attribute is its tqdm class)
hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")
are_progress_bars_disabled = hub_tqdm.are_progress_bars_disabled


@pytest.fixture(autouse=True)
def bars_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both switches on, as the libraries start without HF_HUB_DISABLE_PROGRESS_BARS, whatever this
    machine's environment says; each test's changes are undone with them."""
    monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", None)
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("terminal", "show", "bars"), [(True, True, True), (True, False, False), (False, True, False)]
)
def test_library_bars_are_on_only_where_ours_are_drawn_as_bars(
    monkeypatch: pytest.MonkeyPatch, terminal: bool, show: bool, bars: bool
) -> None:
    monkeypatch.setattr(sys, "stderr", _Terminal() if terminal else io.StringIO())
    assert drawn_as_bars(show) is bars
    with library_bars(show):
        assert hf_logging.is_progress_bar_enabled() is bars
        assert are_progress_bars_disabled() is not bars  # the hub's downloads follow
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()


def test_a_switch_turned_off_before_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_DISABLE_PROGRESS_BARS, or a caller's own `disable_progress_bar()`, is not undone."""
    monkeypatch.setattr(sys, "stderr", _Terminal())
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    with library_bars(True):
        assert not hf_logging.is_progress_bar_enabled()
    assert not hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()


def test_a_closed_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    assert not drawn_as_bars(True)
