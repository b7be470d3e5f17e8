"""A Ctrl-C that reaches a command's process after the command has returned, while the interpreter exits:
the command's status stands (`exits.ignore_late_stops`). Python puts SIGINT back to its default disposition
before it tears its modules down (a tenth of a second and more with torch loaded), and a Ctrl-C there
killed the process: status 130 for a run whose outputs were written whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.factories.cli import ROOT, cli_env
from tests.model_training.evaluation.pagegen import write_corpus

# `htmllm argv`, with a Ctrl-C sent by an object the interpreter frees while tearing down its modules,
# after its signal handling has ended: where a late Ctrl-C lands, without timing it. SIGINT's handler is
# Python's, as in a terminal (a shell's background job ignores it).
CHILD = """
import os, signal, sys

signal.signal(signal.SIGINT, signal.default_int_handler)


class LateCtrlC:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)


late = LateCtrlC()
from service.cli import main

sys.exit(main(sys.argv[1:]))
"""


def test_a_ctrl_c_while_the_interpreter_exits_leaves_the_commands_status(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    out = tmp_path / "tasks"
    argv = ["tasks", "derive", "--corpus", str(corpus), "--out", str(out), "--min-pages", "3"]
    argv += ["--min-sites", "3", "--folds", "3"]
    ended = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], cwd=ROOT, env=cli_env(), capture_output=True, text=True
    )
    assert ended.returncode == 0, ended.stderr  # it was -2: killed by the Ctrl-C, 130 in a shell
    assert "Traceback" not in ended.stderr
    assert list(out.glob("*/task.json"))  # the run's outputs, whole


def test_a_ctrl_c_while_the_interpreter_exits_leaves_a_service_commands_status(tmp_path: Path) -> None:
    # Every command goes through `service.cli.main`, the service's own (`htmllm prune`) as well.
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>A page to prune.</p></body></html>")
    ended = subprocess.run(
        [sys.executable, "-c", CHILD, "prune", str(page)],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert ended.returncode == 0, ended.stderr
    assert "A page to prune." in ended.stdout
