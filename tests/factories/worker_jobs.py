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
