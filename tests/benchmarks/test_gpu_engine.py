"""benchmarks/gpu_engine.sh's dry run: every mode's rows, the rotary's share and the profiles reach $OUT.

A device call is short and rare; what the script writes is checked here, on the CPU, before one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.scripts import ROOT


@pytest.mark.slow
def test_the_dry_run_writes_every_mode_with_the_rotary_share_and_the_profiles(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "COMPILE": "0", "PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_engine.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    figures = json.loads((tmp_path / "gpu_engine.json").read_text())
    rows = {(row["attention"], row["length"]): row for row in figures["rows"]}
    labels = ("64", "256", "mixed 16-200")
    assert set(rows) == {(mode, label) for mode in ("sdpa", "varlen", "sdpa-hf") for label in labels}
    for mode in ("sdpa", "varlen"):  # our eager forward, at the middle length
        assert 0 < rows[(mode, "256")]["rotary_share"] < 1
    assert "rotary_share" not in rows[("sdpa-hf", "256")]  # transformers' forward has its own rotary
    profiles = (tmp_path / "gpu_profile.txt").read_text()
    assert [line for line in profiles.splitlines() if line.startswith("== ")] == [
        f"== {mode}, 4 x 256 tokens, one pass ==" for mode in ("sdpa", "varlen", "sdpa-hf")
    ]
    assert "MFU at 256 tokens, varlen:" in done.stdout
