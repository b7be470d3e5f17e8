"""SIGTERM while the model loads: the server exits at once (status 143, one log line), PID 1 included.

In a container the server is PID 1, and the kernel drops every signal PID 1 has no handler for: before
serve() installed one, a pod deleted during a slow start ran on until the kubelet's SIGKILL. Outside a
PID namespace SIGTERM's default action ends the process anyway, so the PID 1 case is reproduced with
`unshare --pid` (skipped where user namespaces are not allowed); the other tests fail without the
handler too (the status is -15, not 143; or the test's own handler, standing in for the default, runs).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.api import app as api_app
from service.api import main as api_main
from tests.api.conftest import tiny_settings
from tests.factories.cli import sigterm_given_back

ROOT = Path(__file__).resolve().parents[2]
LOG_LINE = "SIGTERM before the server started serving"

# `python -m service.api` whose model load announces itself in a file, then takes two minutes.
SLOW_LOAD = """
import os, sys, time
from service.api import app, main

def load_engine(settings):
    with open(os.environ["LOAD_BEGAN"], "w") as began:
        began.write(str(os.getpid()))
    time.sleep(120)
    raise AssertionError("the load was not stopped")

app.load_engine = load_engine
sys.exit(main.main())
"""


def test_a_sigterm_during_the_load_ends_serve_with_143(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In process: serve() has its handler in place when the load begins, returns 143 on SIGTERM, logs
    it, and gives SIGTERM's handler back (uvicorn, once it serves, installs and restores its own)."""
    seen: dict[str, Any] = {}

    def load_engine(settings: object) -> object:
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler interrupts this
        raise AssertionError("the load was not stopped")

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    caplog.set_level(logging.WARNING)
    with sigterm_given_back():  # SIGTERM left to it fails the test instead of ending pytest
        started = time.monotonic()
        assert api_main.serve(tiny_settings(tiny_checkpoint, log_level="warning")) == 143
        assert time.monotonic() - started < 20
    assert callable(seen["handler"]) and seen["handler"] is not signal.getsignal(signal.SIGTERM)
    assert LOG_LINE in caplog.text


def test_a_sigterm_after_the_load_closes_the_engine(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM between the load and uvicorn's start releases what the load built (a model child)."""
    closed: list[bool] = []
    real_load = api_app.load_engine

    def load_engine(settings: Any) -> Any:
        engine = real_load(settings)
        monkeypatch.setattr(engine, "close", lambda: closed.append(True))
        return engine

    def create_app(settings: object, engine: object, **_: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("the start was not stopped")

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    monkeypatch.setattr(api_app, "create_app", create_app)
    with sigterm_given_back():
        assert api_main.serve(tiny_settings(tiny_checkpoint, log_level="warning")) == 143
    assert closed == [True]


def unshare_pid() -> list[str]:
    """The command prefix that runs a process as PID 1 of a new PID namespace, or [] where not allowed."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    # --kill-child: should the test kill unshare, the server goes with it (it would ignore SIGTERM).
    prefix = [unshare, "--pid", "--fork", "--kill-child", "--map-root-user"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30, check=False)
    return prefix if probe.returncode == 0 else []


def child_pid(parent: int, deadline: float) -> int:
    """The one child of `parent` (unshare's forked child: the server, PID 1 inside its namespace)."""
    children = Path(f"/proc/{parent}/task/{parent}/children")
    while time.monotonic() < deadline:
        found = children.read_text().split()
        if found:
            return int(found[0])
        time.sleep(0.02)
    raise TimeoutError(f"process {parent} started no child")


@pytest.mark.slow
@pytest.mark.parametrize("as_pid_1", [False, True], ids=["process", "pid-1"])
def test_python_m_service_api_exits_promptly_on_sigterm_during_the_load(
    tiny_checkpoint: Path, tmp_path: Path, as_pid_1: bool
) -> None:
    prefix = unshare_pid() if as_pid_1 else []
    if as_pid_1 and not prefix:
        pytest.skip("unshare --pid --map-root-user is not allowed here")
    began = tmp_path / "began"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "LOAD_BEGAN": str(began),
            "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
            "HTMLLM_HOST": "127.0.0.1",
            "HTMLLM_PORT": "0",
            "HTMLLM_LOG_LEVEL": "warning",
        }
    )
    with (tmp_path / "output").open("w+b") as output:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", SLOW_LOAD], cwd=ROOT, env=env, stdout=output, stderr=output
        )
        try:
            deadline = time.monotonic() + 120
            while not began.exists():
                assert proc.poll() is None, "the server ended before its load began"
                assert time.monotonic() < deadline, "the load never began"
                time.sleep(0.02)
            # The server itself: under unshare, the child unshare forked (PID 1 in its namespace).
            server = child_pid(proc.pid, deadline) if prefix else proc.pid
            if prefix:
                assert began.read_text() == "1"  # it is PID 1 there, so the kernel's rule applies
            os.kill(server, signal.SIGTERM)
            # Without a handler, PID 1 ignores it and sleeps on; the default elsewhere gives -15.
            status = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        output.seek(0)
        text = output.read().decode(errors="replace")
    assert status == 143, text
    assert LOG_LINE in text


# The server as `python -m service.api` or `htmllm serve` runs it, SIGTERM-ing itself the moment its start
# first imports MODULE (pydantic: the settings; torch: their checks, seconds before the load). It records
# SIGTERM's handler at that moment in the file HANDLER_SEEN.
SIGTERM_AT_IMPORT = """
import os, runpy, signal, sys

def at_import(event, args):
    seen = os.environ["HANDLER_SEEN"]
    if event == "import" and args[0] == os.environ["MODULE"] and not os.path.exists(seen):
        with open(seen, "w") as seen:
            seen.write(repr(signal.getsignal(signal.SIGTERM)))
        os.kill(os.getpid(), signal.SIGTERM)

sys.addaudithook(at_import)
if sys.argv[1] == "htmllm":
    from service.cli import main
    sys.exit(main(["serve"]))
sys.argv = ["python -m service.api"]
runpy.run_module("service.api", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("entry", "module", "as_pid_1"),
    [
        ("service.api", "pydantic", False),
        ("service.api", "torch", False),
        ("htmllm", "torch", False),
        ("service.api", "torch", True),
    ],
    ids=["python-m-at-pydantic", "python-m-at-torch", "htmllm-serve-at-torch", "pid-1-at-torch"],
)
def test_a_sigterm_before_the_heavy_imports_ends_the_start_with_143(
    tiny_checkpoint: Path, tmp_path: Path, entry: str, module: str, as_pid_1: bool
) -> None:
    """The handler was installed in serve(), after `run_args` had imported pydantic and torch (7-9 s in a
    pod, the strace showed it 12.7 s after exec): a pod deleted then ran on as PID 1 until the SIGKILL,
    or elsewhere died of the signal without a word. The start now has it before either import: 143, one
    log line, nothing else."""
    prefix = unshare_pid() if as_pid_1 else []
    if as_pid_1 and not prefix:
        pytest.skip("unshare --pid --map-root-user is not allowed here")
    seen = tmp_path / "handler"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "MODULE": module,
            "HANDLER_SEEN": str(seen),
            "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
            "HTMLLM_HOST": "127.0.0.1",
            "HTMLLM_PORT": "0",
            "HTMLLM_LOG_LEVEL": "warning",
        }
    )
    args = [*prefix, sys.executable, "-c", SIGTERM_AT_IMPORT, entry]
    # Without the handler, PID 1 ignores the signal and goes on to serve: the timeout ends it.
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = proc.stdout + proc.stderr
    assert seen.read_text() != repr(signal.SIG_DFL), output  # the handler was in place at the import
    assert proc.returncode == 143, output
    lines = output.splitlines()
    assert len(lines) == 1 and LOG_LINE in lines[0], output
