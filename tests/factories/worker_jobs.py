"""Jobs for the worker-pool tests, importable by the workers that run them (a test module's own functions
pickle by that module's name, so one module here serves every test file that runs them)."""

from __future__ import annotations

import os
import signal
import time


def add(a: int, b: int) -> int:
    return a + b


def pid() -> int:
    """The worker's pid: which worker ran the job."""
    return os.getpid()


def pid_of_page(page: str) -> int:
    """The worker's pid, called as a page's job is (one argument)."""
    return os.getpid()


def spin(seconds: float) -> int:
    """Busy on the CPU for `seconds`: what a pathological page does to its worker."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return os.getpid()


def stop_self() -> int:
    """Stop this worker (SIGSTOP), as an operator's or a debugger's stop, or a frozen cgroup, does."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return os.getpid()


def orphaned_while_starting(pid_file: str) -> None:
    """A worker's initializer: write this worker's pid to `pid_file`, SIGKILL the forkserver that forked it
    (as the kernel's OOM killer may pick it), then hang: a start that never says ready, orphaned meanwhile.
    Bounded (60 s), so that a worker a test failed to kill ends anyway."""
    with open(pid_file + ".part", "w") as written:
        written.write(str(os.getpid()))
    os.replace(pid_file + ".part", pid_file)
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
