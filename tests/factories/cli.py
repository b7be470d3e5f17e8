"""The `htmllm` command line as a real process, for tests that kill it and run it again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.factories.pages import make_pages

ROOT = Path(__file__).resolve().parents[2]


def write_pages(path: Path, n: int) -> list[str]:
    """A JSONL file of `n` pages with ids p0, p1, ... (each 40 to 200 words); returns their HTML."""
    pages = make_pages(n, seed=5, min_words=40, max_words=200)
    with path.open("w", encoding="utf-8") as handle:
        for i, html in enumerate(pages):
            handle.write(json.dumps({"id": f"p{i}", "url": f"https://example.com/{i}", "html": html}) + "\n")
    return pages


def _sigterm_kills(*_: object) -> None:
    raise AssertionError("SIGTERM's default: the process ends at once, its held rows lost")


@contextlib.contextmanager
def sigterm_given_back() -> Iterator[None]:
    """Within, SIGTERM's handler fails the test if a run leaves the signal to it (SIGTERM's default would
    end the test process); on leaving, that handler must be SIGTERM's again (the run gave it back)
    before the one from before is restored."""
    previous = signal.signal(signal.SIGTERM, _sigterm_kills)
    try:
        yield
        assert signal.getsignal(signal.SIGTERM) is _sigterm_kills
    finally:
        signal.signal(signal.SIGTERM, previous)


def cli(*args: str) -> list[str]:
    """The command line that runs `htmllm *args` from this checkout."""
    return [sys.executable, "-m", "service.cli", *args]


def cli_env() -> dict[str, str]:
    """The environment a `cli` command line runs in: this checkout importable from anywhere."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run_python(
    script: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -c script args` from this checkout, in the `cli` environment (and `env` over it), run to
    its end: a process of its own (its forkserver, workers and limits its own); both streams captured as
    text. `timeout_s` bounds a hang, not a timing."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={**cli_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def python_in_own_group(script: str, *args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """`python -c script args` from this checkout, in the `cli` environment, in a process group of its own
    (signalled, or killed when it hangs, whole: its workers with it); stderr piped, both streams text."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=cli_env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_minus_nine_when(args: list[str], ready: Callable[[], bool]) -> None:
    """Start `args` (a `cli` command line) and kill -9 it once `ready()`; fails if it ends first."""
    process = subprocess.Popen(args, cwd=ROOT, env=cli_env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ready():
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()


def stop_before_merge(monkeypatch: pytest.MonkeyPatch, args: list[str], command: str = "embed") -> None:
    """Run `htmllm <args>` in this process until every part is written, and stop it as a kill before
    the merge would (Ctrl-C there: status 130): `command` "embed" (`merge`) or "extract" (`_merge`)."""
    import importlib

    from service.cli import main

    module = importlib.import_module(f"service.commands.{command}")

    def interrupted(*_: object, **__: object) -> NoReturn:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(module, "merge" if command == "embed" else "_merge", interrupted)
        assert main(args) == 130
