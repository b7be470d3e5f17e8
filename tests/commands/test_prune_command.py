"""`htmllm prune`: a reader that stops early ends the command quietly."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from service.cli import main


def test_a_closed_pipe_ends_the_command_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm prune big.html | head`: head has gone when the pruned page is written."""
    page = tmp_path / "big.html"
    page.write_text("<html><body>" + "<p>words the pruner keeps</p>" * 5000 + "</body></html>")
    reader, writer = os.pipe()
    os.close(reader)
    stdout = open(writer, "w", encoding="utf-8")  # noqa: SIM115 - closed below, after the command
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["prune", str(page)]) == 1
        stdout.write("what interpreter exit would flush")
        stdout.flush()  # stdout now leads to devnull: no second BrokenPipeError at exit
    finally:
        stdout.close()
    assert capsys.readouterr().err == ""
