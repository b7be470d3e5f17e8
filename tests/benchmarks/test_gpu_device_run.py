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


SHIM = """#!/bin/sh
printf '%s\\n' "$*" >> "$RECORD"
"""


@pytest.mark.parametrize("dry", [False, True])
def test_the_service_part_gives_service_py_command_lines_it_accepts(tmp_path: Path, dry: bool) -> None:
    """The service part's four command lines (its flags had been checked only by hand, with a rewritten
    copy of the script), on the device and in the CPU dry run: each parses with benchmarks/service.py's
    own options, names a preset that exists, and writes its own JSON."""
    from service.core.modeling import PRESETS
    from tests.benchmarks.scripts import load_script

    shim, record, out = tmp_path / "python", tmp_path / "calls.txt", tmp_path / "out"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    out.mkdir()
    env = {**os.environ, "PARTS": "service", "PYTHON": str(shim), "RECORD": str(record), "OUT": str(out)}
    env.pop("DRY_RUN", None)
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_device_run.sh")],
        env={**env, **({"DRY_RUN": "1"} if dry else {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [line.split() for line in record.read_text().splitlines() if "benchmarks/service.py" in line]
    assert len(calls) == 4, record.read_text()
    parser = load_script("service").build_parser()
    parser.allow_abbrev = False  # the flags as spelt, not a prefix argparse would take
    parser.exit_on_error = False
    parsed = [parser.parse_args(call[1:]) for call in calls]
    assert [(a.bundled, a.inference_process) for a in parsed] == [
        (True, False), (False, False), (True, True), (False, True)
    ]  # fmt: skip
    assert [a.json.name for a in parsed] == [
        f"gpu_service_{model}{suffix}.json" for suffix in ("", "_process") for model in ("default", "base")
    ]
    for args in parsed:
        assert args.preset in PRESETS
        assert (args.device, args.dtype) == (("cpu", "float32") if dry else ("cuda", "bfloat16"))
    assert [a.preset for a in parsed if not a.bundled] == (["tiny"] * 2 if dry else ["base"] * 2)
