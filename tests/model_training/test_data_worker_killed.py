"""A pool worker of `htmllm data prepare` killed under the run (the kernel's OOM killer, a `kill -9`):
the command fails in one line and status 1, its output left as it was, instead of waiting for ever.

multiprocessing's pool started a new worker but never ran the dead one's task again, and the command
sat idle with no output. A worker killed holding one of the pool's queue locks (an idle one holds the
task queue's while it waits) also hung the pool's own teardown, which takes that lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.factories.cli import python_in_own_group, write_pages
from tests.factories.tokenizer import build_tiny_tokenizer

PAGES = 40  # one chunk of the run (64 pages): 10 tasks of 4 pages

# The `htmllm` command line with the workers' function wrapped: each worker says which page it starts
# (`test: PID starts ID`), and the one that starts argv[1] holds it for ever, as a worker swapping on a
# huge page would until the OOM killer comes. The test kills a worker with SIGKILL from there.
CHILD = """
import os, sys, threading
import model_training.data as module

real, stuck = module._prune_and_tokenize, sys.argv[1]

def held(item):
    os.write(2, f"test: {os.getpid()} starts {item[0]}\\n".encode())  # one write: never cut in two
    if item[0] == stuck:
        threading.Event().wait()
    return real(item)

module._prune_and_tokenize = held
from service.cli import main

sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("worker-killed")
    write_pages(root / "pages.jsonl", PAGES)
    build_tiny_tokenizer().save(root / "tokenizer")
    return root


def _kill_a_worker(argv: list[str], stuck: str, *, victim: str) -> tuple[int, int, str]:
    """Run `htmllm argv` with page `stuck` held by its worker (`CHILD`); once the other worker has
    started the last page, SIGKILL the `victim` ("holder": the worker holding `stuck`, whose task is
    then never done; "other": the other one, once done with its pages and waiting for a task, holding
    the task queue's lock (`_waits_for_a_task`), while the holder still holds `stuck`). Returns the pid
    killed, the command's status and its stderr."""
    process = python_in_own_group(CHILD, stuck, *argv, stdout=subprocess.DEVNULL)  # killed whole if it hangs
    assert process.stderr is not None
    lines: list[str] = []
    started: dict[str, int] = {}
    for line in process.stderr:
        lines.append(line)
        if line.startswith("test: "):
            _, pid, _, page = line.split()
            started[page] = int(pid)
            if stuck in started and f"p{PAGES - 1}" in started:
                break
    else:
        process.wait()
        pytest.fail(f"ended ({process.returncode}) before both workers had started:\n{''.join(lines)}")
    holder, other = started[stuck], started[f"p{PAGES - 1}"]
    assert holder != other
    killed = holder if victim == "holder" else other
    if victim == "other":
        _waits_for_a_task(other)
    os.kill(killed, signal.SIGKILL)
    try:
        _, rest = process.communicate(timeout=30)  # a bound for a hang, not a timing
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"still running 30 s after its worker was killed:\n{''.join(lines)}")
    return killed, process.returncode, "".join(lines) + rest


def _waits_for_a_task(pid: int) -> None:
    """Return once worker `pid` is blocked reading the pool's task pipe, which it reads holding the task
    queue's lock (the holder, in its task, does not wait for that lock), as the kernel tells it: asleep
    (`stat`) in a pipe read (`wchan`); asleep at all where `wchan` does not tell. A bound for a hang of
    10 s, not a timing."""
    where = ""
    for _ in range(1000):
        try:
            state = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()[0]
            where = Path(f"/proc/{pid}/wchan").read_text(encoding="ascii").strip()
        except (OSError, IndexError):
            return
        if state == "S" and (where in ("", "0") or where.endswith("pipe_read")):
            return
        threading.Event().wait(0.01)
    pytest.fail(f"worker {pid} never waited for a task (wchan {where!r})")


@pytest.mark.parametrize("victim", ["holder", "other"])
def test_data_prepare_fails_in_one_line_when_a_worker_is_killed(
    inputs: Path, tmp_path: Path, victim: str
) -> None:
    """The run fails, whichever worker died: the one whose task never comes back, or one that held none
    of the pages still awaited (the pool's teardown must not wait for the queue lock it held). Nothing
    is written."""
    out = tmp_path / "shards"
    argv = ["data", "prepare", "--corpus", str(inputs / "pages.jsonl"), "--tokenizer",
            str(inputs / "tokenizer"), "--out", str(out), "--extractor", "none", "--no-progress"]  # fmt: skip
    killed, status, err = _kill_a_worker(argv, "p0", victim=victim)
    said = [line for line in err.splitlines() if not line.startswith("test: ")]
    assert status == 1, err
    assert "Traceback" not in err and "ForkPoolWorker" not in err, err
    assert said == [
        f"htmllm data prepare: a preparation worker (pid {killed}) was killed (SIGKILL: the "
        "kernel's OOM killer, or a kill -9?); nothing was written (a preparation does not resume): run the "
        "same command again, with fewer --workers"
    ], err
    assert not out.exists()  # the run made it, and it is removed with nothing in it


def _run_script(script: str, *, hung: str) -> tuple[str, str]:
    """Run `python -c script` in a process group of its own, which is killed whole (and the test failed
    with `hung`) if it is still there after 30 s; its stdout and stderr once it exited 0."""
    process = python_in_own_group(script)
    try:
        out, err = process.communicate(timeout=30)  # a bound for a hang, not a timing
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(hung)
    assert process.returncode == 0, err
    return out, err


# `data prepare`'s pool, two workers: one holds its task for ever, the other is killed as it sends a
# result, holding the result queue's lock (taken here by hand, then SIGKILL: the instant a kill must land
# on, which nothing outside can aim at). It says how the wait for the results ended, and which threads
# are left once the pool is ended.
RESULT_LOCK_CHILD = """
import os, signal, sys, threading
from multiprocessing import get_context
from model_training.data import WorkerLostError, _pool_results, _worker_pool
from tests.factories.tokenizer import build_tiny_tokenizer

def task(i):
    if i == 0:
        threading.Event().wait()
    if i == 5:
        frame = sys._getframe()
        while frame.f_code.co_name != "worker":  # multiprocessing.pool.worker, which holds the queues
            frame = frame.f_back
        frame.f_locals["outqueue"]._wlock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    return i

try:
    with _worker_pool(get_context("fork"), 2, build_tiny_tokenizer().to_json(), 64) as pool:
        _pool_results(pool, pool.map_async(task, range(8), chunksize=1))
except WorkerLostError as exc:
    print(exc.exit_code)
print(*sorted(thread.name for thread in threading.enumerate()))
"""


def test_the_pool_ends_when_a_worker_is_killed_holding_the_result_queue_lock() -> None:
    """The pool's own teardown writes its end mark under that lock, and had waited for it for ever."""
    out, err = _run_script(RESULT_LOCK_CHILD, hung="still running 30 s after its worker was killed")
    assert out.split("\n") == [str(-signal.SIGKILL), "MainThread", ""], err


# A worker kills itself, then a Ctrl-C lands in the pool's teardown, while it waits for its worker thread:
# it prints the workers still running once the interrupt is caught; its exit must not wait on any.
INTERRUPTED_TEARDOWN_CHILD = """
import os, signal, threading
from multiprocessing import active_children, get_context
from model_training.data import WorkerLostError, _pool_results, _worker_pool
from tests.factories.tokenizer import build_tiny_tokenizer

def task(i):
    if i == 0:
        threading.Event().wait()
    if i == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return i

def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

try:
    with _worker_pool(get_context("fork"), 2, build_tiny_tokenizer().to_json(), 64) as pool:
        pool._worker_handler.join = interrupted
        _pool_results(pool, pool.map_async(task, range(8), chunksize=1))
except (KeyboardInterrupt, WorkerLostError) as exc:
    left = active_children()
    for process in left:
        process.join(10)  # killed: a moment to die; not killed, they never end
    print(type(exc).__name__, [process.pid for process in left if process.exitcode is None])
"""


def test_a_ctrl_c_in_the_teardown_after_a_lost_worker_leaves_no_worker_running() -> None:
    """The teardown killed the workers only after its waits: interrupted in them, it left workers that
    ignore SIGTERM, which multiprocessing's exit sends them before it waits for them, for ever."""
    out, err = _run_script(
        INTERRUPTED_TEARDOWN_CHILD, hung="still running 30 s after the interrupted teardown"
    )
    assert out == "KeyboardInterrupt []\n", err
