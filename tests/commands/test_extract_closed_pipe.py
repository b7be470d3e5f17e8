"""`htmllm extract --output - | head -1`: a reader that goes away ends the run quietly, with the shell's
status for SIGPIPE (141), as `cat` or `grep` end there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import main
from service.commands.exits import PIPE_CLOSED
from tests.factories.cli import ROOT, cli, cli_env


def _error_rows(path: Path, n: int) -> Path:
    """Rows that become error rows without an extractor: many, quickly."""
    path.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(n)))
    return path


def test_head_minus_one_ends_the_run_quietly_with_status_141(tmp_path: Path) -> None:
    """It had ended "htmllm extract: cannot write -: Broken pipe", status 1. 3,000 rows are more than the
    pipe and Python's buffer hold, so the run writes after the reader is gone."""
    source = _error_rows(tmp_path / "in.jsonl", 3000)
    args = cli("extract", "--input", str(source), "--output", "-", "--workers", "1", "--no-progress")
    process = subprocess.Popen(args, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    first = json.loads(process.stdout.readline())
    process.stdout.close()  # `head -1` has its line
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == PIPE_CLOSED == 141, err
    assert first["index"] == 0 and first["id"] == "r0"
    assert err == ""  # no "Broken pipe", no "Exception ignored", no summary of rows nobody read


# Runs the command given in its arguments with standard output a pipe whose reader is gone, and exits
# with its status. A process of its own makes the pipe: in pytest's, a fork by another test's pool or
# thread while the pipe is open would hold a copy of its read end, and the writes would meet a reader.
_INTO_A_CLOSED_PIPE = (
    "import os, subprocess, sys\n"
    "read, write = os.pipe()\n"
    "os.close(read)\n"
    "sys.exit(subprocess.run(sys.argv[1:], stdout=write).returncode)\n"
)


def test_rows_held_to_the_end_meet_the_closed_pipe_in_the_run_not_at_exit(tmp_path: Path) -> None:
    """Rows that fit Python's buffer reach the pipe when it is flushed: at interpreter exit, that was an
    "Exception ignored ... BrokenPipeError" and status 120 after a summary that said they were written.
    The run flushes them itself; standard output then points at devnull, so exit has nothing to raise.
    (Run in pytest's process, this once ended 0 under load: something there reached the pipe.)"""
    source = _error_rows(tmp_path / "in.jsonl", 2)
    command = cli("extract", "--input", str(source), "--output", "-", "--workers", "1", "--no-progress")
    args = [sys.executable, "-c", _INTO_A_CLOSED_PIPE, *command]
    env = {name: value for name, value in cli_env().items() if name != "PYTHONUNBUFFERED"}  # rows held
    ended = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert ended.returncode == PIPE_CLOSED, ended.stderr
    assert ended.stderr == b""  # no summary of rows nobody read, no "Exception ignored" at exit


def test_a_closed_standard_output_is_one_line_before_any_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm extract --output - >&-`: Python has no sys.stdout, and the first row's write was an
    AttributeError traceback."""
    monkeypatch.setattr(sys, "stdout", None)
    source = _error_rows(tmp_path / "in.jsonl", 2)
    assert main(["extract", "--input", str(source), "--output", "-", "--workers", "1", "--no-progress"]) == 1
    assert capsys.readouterr().err == "htmllm extract: --output -: standard output is closed\n"


def test_dev_stdout_into_a_pipe_is_written_in_place(tmp_path: Path) -> None:
    """`--output /dev/stdout | cat`: resolved, the name is `/proc/<pid>/fd/pipe:[...]`, which is not there,
    and the run had taken it for a new output file: "cannot write /dev/stdout", status 1."""
    source = _error_rows(tmp_path / "in.jsonl", 3)
    args = cli("extract", "--input", str(source), "--output", "/dev/stdout", "--workers", "1")
    args.append("--no-progress")
    ended = subprocess.run(args, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert ended.returncode == 0, ended.stderr  # error rows are rows: the summary counts them
    assert [json.loads(line)["id"] for line in ended.stdout.splitlines()] == ["r0", "r1", "r2"], ended.stderr
    assert "cannot write" not in ended.stderr
