"""A server whose lifespan cannot start (its preprocessing processes, out of file descriptors) says so in one
line, with the limit and how to raise it.

uvicorn logs what a failed lifespan start sends it, which was Starlette's whole traceback: about 100
lines, the cause (`[Errno 24] Too many open files`) at their end, with the forkserver's own traceback
among them. The server is the real command, run with a low `RLIMIT_NOFILE`.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.test_serve_start import ENTRIES, ROOT, server_env

LIMIT = 16  # past the model's load and the port's bind, short of a preprocessing process's start


def _low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
def test_a_lifespan_start_out_of_descriptors_is_one_line_naming_the_limit(tiny_checkpoint: Path) -> None:
    env = server_env(
        tiny_checkpoint, 0, HTMLLM_PREPROCESS_POOL="process", HTMLLM_WARMUP="false", HTMLLM_LOG_FORMAT="text"
    )
    proc = subprocess.run(
        ENTRIES["python-m-service-api"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=_low_descriptor_limit,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output  # uvicorn's status for a failed lifespan start
    assert "Traceback" not in output, output
    failed = [line for line in output.splitlines() if "the server cannot start:" in line]
    assert len(failed) == 1, output
    assert "preprocessing worker could not be launched: too many open files" in failed[0]
    assert f"the limit is {LIMIT} open files (RLIMIT_NOFILE): raise it with `ulimit -n`" in failed[0]
