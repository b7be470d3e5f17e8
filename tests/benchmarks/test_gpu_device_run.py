"""benchmarks/gpu_device_run.sh refuses what would waste a device call before it spends any of it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks.scripts import ROOT


@pytest.mark.parametrize("parts", ["engines", "engine servce", "all"])
def test_a_misspelt_part_is_refused_before_anything_runs(tmp_path: Path, parts: str) -> None:
    """`PARTS=engines` had installed the wheels, printed the environment, run nothing and exited 0."""
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_device_run.sh")],
        env={**os.environ, "PARTS": parts, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "is no part of this run (engine, service)" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # not even the log: nothing ran
