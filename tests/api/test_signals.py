"""SIGHUP during the server's start: it ends the start as SIGTERM does (status 129, one log line), and a
SIGHUP that is ignored (`nohup`) stays ignored.

The terminal or SSH session of `make serve` / `htmllm serve` closing sends SIGHUP, and so do supervisors.
Its default action had ended the process on the spot, without a word; the batch commands already took it
as Ctrl-C. (A SIGHUP while the server serves drains it as SIGTERM does: tests/api/test_shutdown.py.)
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from service.api import app as api_app
from service.api import main as api_main
from tests.api.conftest import tiny_settings

ROOT = Path(__file__).resolve().parents[2]
SIGHUP_LINE = "SIGHUP before the server started serving: exiting (status 129)"


@contextmanager
def sighup_caught() -> Iterator[None]:
    """Within, a SIGHUP left to the handler from before fails the test instead of ending pytest's run (its
    default action); on leaving, that handler must be SIGHUP's again (the server gave it back)."""

    def left_to_default(*_: object) -> None:
        raise AssertionError("SIGHUP reached its default action: the process ends on the spot, no line")

    previous = signal.signal(signal.SIGHUP, left_to_default)
    try:
        yield
        assert signal.getsignal(signal.SIGHUP) is left_to_default  # given back
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_sighup_during_the_load_ends_serve_with_129(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def load_engine(settings: object) -> object:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(30)  # the handler interrupts this
        raise AssertionError("the load was not stopped")

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    caplog.set_level(logging.WARNING)
    with sighup_caught():
        assert api_main.serve(tiny_settings(tiny_checkpoint, log_level="warning")) == 129
    assert SIGHUP_LINE in caplog.text


def test_an_ignored_sighup_stays_ignored_during_the_start(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nohup htmllm serve`: the server goes on after the session that started it hung up."""
    seen: list[object] = []

    def load_engine(settings: object) -> object:
        seen.append(signal.getsignal(signal.SIGHUP))
        raise PermissionError(13, "Permission denied", "/somewhere")  # ends the start: status 1

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert api_main.serve(tiny_settings(tiny_checkpoint, log_level="warning")) == 1
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert seen == [signal.SIG_IGN]


# The server as `python -m service.api` or `htmllm serve` runs it, SIGHUP-ing itself the moment its start
# first imports pydantic (the settings), long before the load.
SIGHUP_AT_IMPORT = """
import os, runpy, signal, sys

def at_import(event, args):
    global sent
    if event == "import" and args[0] == "pydantic" and not sent:
        sent = True
        os.kill(os.getpid(), signal.SIGHUP)

sent = False
sys.addaudithook(at_import)
if sys.argv[1] == "htmllm":
    from service.cli import main
    sys.exit(main(["serve"]))
sys.argv = ["python -m service.api"]
runpy.run_module("service.api", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("entry", ["service.api", "htmllm"])
def test_a_sighup_before_the_heavy_imports_ends_the_start_with_129(tiny_checkpoint: Path, entry: str) -> None:
    """The handler is in place from the start's first line: the process died of the signal (-1), without
    a word, as it did once serving."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
            "HTMLLM_HOST": "127.0.0.1",
            "HTMLLM_PORT": "0",
            "HTMLLM_LOG_LEVEL": "warning",
        }
    )
    args = [sys.executable, "-c", SIGHUP_AT_IMPORT, entry]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 129, output
    lines = output.splitlines()
    assert len(lines) == 1 and SIGHUP_LINE in lines[0], output
