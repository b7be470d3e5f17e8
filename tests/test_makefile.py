"""The Makefile's set-up: a Python older than 3.11 is refused before a venv is made with it (pip's
"requires a different Python" came after, and the venv stayed, so every later make failed the same way),
and a venv an older Python made is named with what to do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _old_python(path: Path) -> Path:
    """An interpreter that fails the version check (exit 1 to any `-c`), as a 3.10 would."""
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(0o755)
    return path


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60
    )


def test_an_older_python_is_refused_before_a_venv_is_made(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = _make("install", f"PYTHON={_old_python(tmp_path / 'python3.10')}", f"VENV={venv}")
    assert done.returncode == 2, done.stderr
    assert "is not Python 3.11 or newer" in done.stderr and "PYTHON=python3.11" in done.stderr
    assert not venv.exists()


def test_a_venv_an_older_python_made_is_named_with_what_to_do(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _old_python(venv / "bin" / "python")
    done = _make("install", f"VENV={venv}")
    assert done.returncode == 2, done.stderr
    assert "was made with a Python older than 3.11: remove it (make clean)" in done.stderr


def test_help_names_the_two_set_up_commands() -> None:
    done = _make("help")
    assert done.returncode == 0
    assert "make serve" in done.stdout and "make test" in done.stdout
