"""The benchmark scripts refuse a missing input or a malformed option in one line, exit status 2, before
their work: they printed a traceback from the code they measure (or a child's `CalledProcessError`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.scripts import ROOT

MISSING = "/nonexistent-htmllm-input"


def _refusal(script: str, *args: str, cwd: Path = ROOT) -> str:
    """The one line a script printed, having exited with status 2 and no traceback."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("script", "args", "said"),
    [
        ("prune.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("prune.py", ["--cpu", "4096"], "argument --cpu: CPU 4096 is not one this process may run on"),
        ("decoding.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("tokenization.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("tokenization.py", ["--lengths", "abc"], "argument --lengths: 'abc': invalid integer"),
        ("extract.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("extract_choice.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("memory.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("cpu_limit.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("cpu_limit.py", ["--limits", "1,abc"], "argument --limits: 'abc': invalid number"),
        ("precheck_cost.py", ["--baseline", MISSING], "is not a checkout with service/core/precheck"),
        ("precheck_cost.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
    ],
)
def test_a_missing_input_or_a_bad_option_is_one_line(script: str, args: list[str], said: str) -> None:
    line = _refusal(script, *args)
    assert line.startswith(f"{script}: error: ") and said in line, line


def test_an_empty_corpus_is_refused_before_the_children_start(tmp_path: Path) -> None:
    assert _refusal("memory.py", "--corpus", str(tmp_path)) == f"memory.py: error: no pages in {tmp_path}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args", "said"),
    [
        ("engine.py", ["--checkpoint", MISSING], f"{MISSING} is not an htmllm checkpoint"),
        ("engine.py", ["--preset", "nosuch"], "argument --preset: invalid choice: 'nosuch'"),
        ("result_cache.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
        ("service.py", ["--corpus", MISSING], f"page source {MISSING} does not exist"),
    ],
)
def test_the_torch_scripts_refuse_alike(script: str, args: list[str], said: str) -> None:
    line = _refusal(script, *args)
    assert line.startswith(f"{script}: error: ") and said in line, line
