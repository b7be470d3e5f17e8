"""How the benchmark scripts refuse a command line or an input they cannot use: one line, exit status 2.

Why: pointed at a missing corpus or checkpoint, or given a malformed option, a script printed a traceback
from deep inside the code it measures (`PageSourceError` from `iter_pages`, `FileNotFoundError` from
`shutil.copytree`, `ValueError` from `int()`, `OSError` from `sched_setaffinity`), sometimes after
seconds of loading, or a `CalledProcessError` that hid its child's reason altogether. A traceback reads
as a bug in the benchmark; these are the caller's inputs. So a script runs its `main` through `run`,
checks in argparse types what a type can (argparse's own one-line usage error, status 2), and raises
`OptionError` for what it can only check after parsing; `PageSourceError` and `CheckpointError` are
refused the same way wherever they come from, since they name the input and why it cannot be read.
Anything else still ends in a traceback: that one is the benchmark's bug.

    from benchmarks.options import run
    if __name__ == "__main__":
        sys.exit(run(main))
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from service.commands.options import OptionError as OptionError
from service.commands.options import at_least as at_least
from service.core.errors import CheckpointError
from service.core.pages import PageSourceError, iter_pages

T = TypeVar("T")

USAGE_STATUS = 2  # argparse's, for a command line that cannot work
# What a script refuses in one line: errors that name the input and why, never the script's own bugs.
REFUSED = (OptionError, PageSourceError, CheckpointError)


def _prefix() -> str:
    return f"{Path(sys.argv[0]).name}: error: "


def run(main: Callable[[], int | None]) -> int:
    """`main`'s exit status (None: 0), or `USAGE_STATUS` with one line on standard error when it refused
    its command line or an input (`REFUSED`)."""
    try:
        status = main()
    except REFUSED as exc:
        print(f"{_prefix()}{exc}", file=sys.stderr)
        return USAGE_STATUS
    return status or 0


def comma_list(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """An argparse type: comma-separated values, each parsed by `item` (`--lengths 256,512`), so that a
    malformed one is a usage error naming it, not a `ValueError` once the run has started."""

    def parse(text: str) -> list[T]:
        values = [part.strip() for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
        parsed = []
        for value in values:
            try:
                parsed.append(item(value))
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None
        return parsed

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a number above 0 (a CPU limit of 0 is no limit a cgroup takes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def affinity_cpu(text: str) -> int:
    """An argparse type: a CPU this process may run on (`--cpu` pins to it); `sched_setaffinity` said only
    "Invalid argument" for one the machine does not have."""
    cpu = at_least(0)(text)
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    if cpu not in allowed:
        raise argparse.ArgumentTypeError(f"CPU {cpu} is not one this process may run on: {sorted(allowed)}")
    return cpu


def check_page_source(source: str | Path) -> None:
    """Refuse a page source with no first page before the expensive work (a model load, a child process):
    `iter_pages` raises `PageSourceError` for a missing or unreadable one when it reads its first page."""
    if next(iter_pages(source, limit=1), None) is None:
        raise OptionError(f"no pages in {source}")


def child_output(command: list[str], *, env: dict[str, str] | None = None) -> str:
    """The standard output of a child process that measures in a fresh interpreter. A child that refused
    its input (`run`, status 2) is refused here the same, in its own line; one that failed otherwise ends
    the script with the tail of its standard error, where its traceback is (a `CalledProcessError` of a
    captured child showed none of it)."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode == USAGE_STATUS:
        lines = done.stderr.strip().splitlines()
        reason = lines[-1].removeprefix(_prefix()) if lines else "the child refused its command line"
        raise OptionError(reason)
    if done.returncode != 0:
        raise SystemExit(f"the child failed (exit status {done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout
