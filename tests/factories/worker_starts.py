"""Worker initializers for the tests of a worker's start, importable by the workers that run them (a test
module's own functions pickle by that module's name)."""

from __future__ import annotations

import os
import time


def hang_while_starting(pid_file: str) -> None:
    """A worker's initializer: write this worker's pid to `pid_file`, then hang, as a start that is slow but
    would succeed does (imports on an overloaded node). Bounded (60 s), so that a worker a test failed to
    kill ends anyway; a test kills it by its pid."""
    with open(pid_file + ".part", "w") as written:
        written.write(str(os.getpid()))
    os.replace(pid_file + ".part", pid_file)
    time.sleep(60)
