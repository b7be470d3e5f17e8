"""A hang-up (SIGHUP: the terminal or SSH session closed) during `htmllm data prepare`, sent to the
command's whole process group as the kernel sends it: the command ends as after Ctrl-C, in one line and
status 129, and its pool's workers leave the stopping to it.

The workers ignored Ctrl-C and SIGTERM but not SIGHUP: each took the command's own SIGHUP handler with
the fork, which raised KeyboardInterrupt in it, and died printing `Process ForkPoolWorker-N:` and a
traceback (one taking the pool's queue lock could hang the command, as a group's SIGTERM once did).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.factories.cli import python_in_own_group, write_pages
from tests.factories.tokenizer import build_tiny_tokenizer
from tests.model_training.test_interrupts import htmllm, interrupt

pytestmark = pytest.mark.slow

# The `htmllm` command line with one function of model_training.data replaced (argv[1]: `stop:NAME` or
# `hold:NAME`), so that it is known where the command is when the hang-up comes: `stop` says so and
# waits; `hold`, for the pool's initializer, says so and takes the hang-up, which the worker must hold
# back until it has said which signals it ignores, then sends it again and goes on.
CHILD = """
import os, signal, sys, threading
import model_training.data as module

how, _, name = sys.argv[1].partition(":")
real = getattr(module, name)

def stop(*args, **kwargs):
    os.write(2, f"test: at {name}\\n".encode())  # one write: a worker's line is never cut in two
    threading.Event().wait()

def hold(*args, **kwargs):
    os.write(2, f"test: at {name}\\n".encode())
    os.kill(os.getpid(), signal.sigwait({signal.SIGHUP}))
    return real(*args, **kwargs)

setattr(module, name, {"stop": stop, "hold": hold}[how])
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, whatever this test process inherited
from service.cli import main

sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hangup")
    write_pages(root / "pages.jsonl", 80)
    build_tiny_tokenizer().save(root / "tokenizer")
    return root


@pytest.mark.parametrize("at", ["stop:pages_within_cap", "hold:_init_worker"])
def test_data_prepare_hung_up_ends_in_one_line_and_runs_again(inputs: Path, tmp_path: Path, at: str) -> None:
    """Hung up while the pool's workers wait for pages, or while they start."""
    out = tmp_path / "shards"
    argv = ["data", "prepare", "--corpus", str(inputs / "pages.jsonl"), "--tokenizer",
            str(inputs / "tokenizer"), "--out", str(out), "--extractor", "none", "--no-progress"]  # fmt: skip
    ended = interrupt(argv, signal.SIGHUP, at=at, child=CHILD)
    status, err = ended.status, ended.err
    assert status == 128 + signal.SIGHUP, err
    assert "Traceback" not in err and "ForkPoolWorker" not in err, err
    said = [line for line in err.splitlines() if not line.startswith("test: ")]
    assert said == [
        f"htmllm data prepare: hung up (SIGHUP); nothing is kept (no {out} is left behind; a preparation "
        "does not resume): run the same command again to prepare them from the first page"
    ], err
    assert not out.exists()  # the run made it, and it is removed with nothing in it
    again = htmllm(*argv)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["written"] > 0 and (out / "manifest.json").is_file()


# `data prepare`'s pool as the command runs it (under `sigterm_as_ctrl_c`), one worker, in a session of
# its own: it says its worker's pid once that worker has started, waits for the hang-up, then sends the
# pool a job after it and says which pid took it. The hang-up reached the worker before the job (it was
# pending when the job was sent), so a worker that died of it cannot be the one that answers.
POOL_CHILD = """
import os, signal, sys, threading
from multiprocessing import get_context
from model_training.data import _worker_pool
from service.commands.resume_state import sigterm_as_ctrl_c
from tests.factories.tokenizer import build_tiny_tokenizer

signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
tokenizer = build_tiny_tokenizer().to_json()
with sigterm_as_ctrl_c() as termination, _worker_pool(get_context("fork"), 1, tokenizer, 64) as pool:
    try:
        print(pool.apply(os.getpid), flush=True)  # after its initializer; the hang-up comes after
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    print(pool.apply_async(os.getpid).get(timeout=60), flush=True)  # a bound for a hang, not a timing
sys.exit(termination.status)
"""


def test_the_pool_worker_outlives_a_hang_up_of_the_group() -> None:
    """The hang-up the command stops on does not kill its worker first: the same worker answers the job
    sent after it, and nothing is printed. It died of the KeyboardInterrupt its inherited SIGHUP handler
    raised, printing a traceback, and a new worker took the job."""
    process = python_in_own_group(POOL_CHILD)
    assert process.stdout is not None
    before = process.stdout.readline()
    assert before.strip().isdigit(), process.communicate()
    os.killpg(process.pid, signal.SIGHUP)
    try:
        after, err = process.communicate(timeout=120)  # a bound for a hang, not a timing
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert process.returncode == 128 + signal.SIGHUP, err
    assert after.split() == [before.strip()], err
    assert err == ""
