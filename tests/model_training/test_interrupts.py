"""Ctrl-C and SIGTERM in the training commands, as a user meets them: the `htmllm` process is started on
tiny generated data, signalled once it has reached a known point (a line it printed, never a sleep), to
its whole process group as a terminal's Ctrl-C or systemd's stop is, and must end in one line on stderr
saying what it kept and how to go on, with status 130 or 143; run again, it goes on from what it kept.

Python's default was a KeyboardInterrupt traceback and status -2, for SIGTERM death on the spot; the
pool workers of `data prepare` printed tracebacks of their own, and a SIGTERM to the group hung it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.factories.cli import ROOT, cli, cli_env, python_in_own_group, write_pages
from tests.factories.tokenizer import build_tiny_tokenizer
from tests.model_training.test_pretrain import _build_run_inputs

pytestmark = pytest.mark.slow

# The `htmllm` command line, with one function replaced (argv[1]: `stop:module:function`, `hold:...` or
# ""), so that the command is known to be there when it is signalled: `stop` says so on stderr and waits;
# `hold`, for a pool worker's initializer, says so and takes the signal, which the worker must hold back
# until its handlers are set, then sends it again and goes on. `-c`, so that the workers
# multiprocessing starts by spawning do not run this again as their main module.
CHILD = """
import importlib, os, signal, sys, threading

how, _, target = sys.argv[1].partition(":")
if target:
    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    real = getattr(module, name)

    def stop(*args, **kwargs):
        os.write(2, f"test: at {name}\\n".encode())  # one write: a worker's line is never cut in two
        threading.Event().wait()

    def hold(*args, **kwargs):
        os.write(2, f"test: at {name}\\n".encode())  # one write: a worker's line is never cut in two
        os.kill(os.getpid(), signal.sigwait({signal.SIGINT, signal.SIGTERM}))
        return real(*args, **kwargs)

    setattr(module, name, {"stop": stop, "hold": hold}[how])
# As in a terminal, whatever this test process inherited (a shell's background job ignores SIGINT).
signal.signal(signal.SIGINT, signal.default_int_handler)
from service.cli import main

sys.exit(main(sys.argv[2:]))
"""
# A logging record (train's step lines, eval's progress): written before or while the signal arrives;
# and `CHILD`'s lines (a second worker's) are not the command's.
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
HOW: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}


@dataclass
class Ended:
    status: int
    err: str  # all of stderr
    said: list[str]  # the lines after the one waited for, less logging records


def interrupt(
    argv: list[str], signum: int, *, wait_for: str = "^test: at ", at: str = "", child: str = CHILD
) -> Ended:
    """Run `htmllm argv` (stopped or held at `at`, see `CHILD`; `child`: another such script), send
    `signum` to its process group once a stderr line matches `wait_for`, and wait for it to end."""
    process = python_in_own_group(child, at, *argv, stdout=subprocess.DEVNULL)  # signalled whole
    assert process.stderr is not None
    before = []
    for line in process.stderr:
        before.append(line)
        if re.search(wait_for, line):
            break
    else:
        process.wait()
        pytest.fail(f"ended ({process.returncode}) before {wait_for!r}:\n{''.join(before)}")
    os.killpg(process.pid, signum)
    # A bound for a hang, not a timing: the group is killed if it is still there after 120 s.
    watchdog = threading.Timer(120, os.killpg, (process.pid, signal.SIGKILL))
    watchdog.start()
    try:
        rest = process.stderr.read()
        process.wait()
    finally:
        watchdog.cancel()
    assert process.returncode != -signal.SIGKILL, f"hung after the signal:\n{''.join(before)}{rest}"
    said = [
        line for line in rest.splitlines() if not LOG_RECORD.match(line) and not line.startswith("test: ")
    ]
    return Ended(process.returncode, "".join(before) + rest, said)


def htmllm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli(*argv), cwd=ROOT, env=cli_env(), capture_output=True, text=True, check=False)


def assert_one_line(ended: Ended, signum: int, line: str) -> None:
    assert ended.status == 128 + signum, ended.err
    assert "Traceback" not in ended.err and "Process ForkPoolWorker" not in ended.err, ended.err
    assert ended.said == [line], ended.err


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("interrupts")
    _build_run_inputs(root, documents=24)
    # A run far longer than the test: it is still training when the signal comes.
    (root / "config.toml").write_text(
        '[model]\npreset = "tiny"\nmax_length = 64\n\n[optim]\nbatch_size = 4\nmax_steps = 100000\n\n'
        '[loss]\ndistil_rank = 8\n\n[run]\ndevice = "cpu"\neval_every = 0\ncheckpoint_every = 2\n'
        "tensorboard = false\nlog_every = 1\n",
        encoding="utf-8",
    )
    write_pages(root / "pages.jsonl", 80)
    build_tiny_tokenizer().save(root / "tokenizer")
    return root


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_train_says_its_last_checkpoint_and_the_same_command_resumes_from_it(
    run_inputs: Path, tmp_path: Path, signum: int
) -> None:
    out = tmp_path / "run"
    argv = ["train", "--config", str(run_inputs / "config.toml"), "--shards", str(run_inputs / "shards"),
            "--teacher", str(run_inputs / "teacher"), "--out", str(out), "--no-progress"]  # fmt: skip
    ended = interrupt(argv, signum, wait_for=r"train_logs: step 3/")  # step 2's checkpoint is written
    found = re.search(r"the last checkpoint is step (\d+) ", ended.said[-1] if ended.said else "")
    assert found, ended.err
    step = int(found.group(1))
    checkpoint = out / "checkpoints" / f"step-{step:08d}"
    assert_one_line(
        ended,
        signum,
        f"htmllm train: {HOW[signum]}; the last checkpoint is step {step} ({checkpoint}): run the same "
        "command to resume from it",
    )
    assert step >= 2 and step % 2 == 0 and (checkpoint / "trainer_state.pt").is_file()
    # The same command goes on from there (stopped two steps on: the run is 100000 steps long).
    again = htmllm(*argv, "--stop-at-step", str(step + 2))
    assert again.returncode == 0, again.stderr
    assert f"resumed from {checkpoint} at step {step}" in again.stderr
    assert json.loads(again.stdout)["steps"] == step + 2


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize(
    "at", ["stop:model_training.data:pages_within_cap", "hold:model_training.data:_init_worker"]
)
def test_data_prepare_ends_with_its_pool_in_one_line(
    run_inputs: Path, tmp_path: Path, signum: int, at: str
) -> None:
    """Signalled while its pool's workers wait for pages, or while they start: Ctrl-C reached them too
    and each printed a traceback; a SIGTERM to the group killed the waiting ones holding the pool's
    queue lock, and the command, ending the pool, waited for that lock for ever."""
    out = tmp_path / "shards"
    argv = ["data", "prepare", "--corpus", str(run_inputs / "pages.jsonl"), "--tokenizer",
            str(run_inputs / "tokenizer"), "--out", str(out), "--extractor", "none"]  # fmt: skip
    argv.append("--no-progress")
    ended = interrupt(argv, signum, at=at)
    assert_one_line(
        ended,
        signum,
        f"htmllm data prepare: {HOW[signum]}; nothing is kept (no {out} is left behind; a preparation "
        "does not resume): run the same command again to prepare them from the first page",
    )
    assert not out.exists()  # the run made it, and it is removed with nothing in it
    again = htmllm(*argv)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["written"] > 0 and (out / "manifest.json").is_file()


def test_tokenizer_train_ends_in_one_line(run_inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "tokenizer"
    argv = ["tokenizer", "train", "--corpus", str(run_inputs / "pages.jsonl"), "--split", "all",
            "--vocab-size", "640", "--min-frequency", "2", "--tags", "10", "--out", str(out)]  # fmt: skip
    ended = interrupt(argv, signal.SIGTERM, at="stop:model_training.data:pages_within_cap")
    assert_one_line(
        ended,
        signal.SIGTERM,
        f"htmllm tokenizer train: terminated (SIGTERM); nothing is kept (no {out} is left behind; "
        "tokenizer training does not resume): run the same command again to start over",
    )
    assert not out.exists()  # the run made it, and it is removed with nothing in it


def test_teacher_embed_ends_in_one_line(run_inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "teacher"
    argv = ["teacher", "embed", "--input", str(run_inputs / "shards"), "--out", str(out), "--no-progress"]
    ended = interrupt(argv, signal.SIGINT, at="stop:model_training.teacher:load_teacher")
    assert_one_line(
        ended,
        signal.SIGINT,
        f"htmllm teacher embed: interrupted; nothing is kept (no {out} is left behind; a teacher run does "
        "not resume): run the same command again to embed the shards from the first",
    )
    assert not out.exists()  # the run made it, and it is removed with nothing in it


@pytest.fixture(scope="module")
def eval_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_training.evaluation.derive import derive_tasks
    from tests.factories.checkpoint import build_tiny_checkpoint
    from tests.model_training.evaluation.pagegen import write_corpus

    root = tmp_path_factory.mktemp("interrupted-eval")
    derive_tasks(write_corpus(root / "corpus.jsonl", sites=9, pages_per_site=4), root / "tasks", min_pages=4,
                 min_sites=3, folds=3)  # fmt: skip
    build_tiny_checkpoint(root / "ckpt")
    return root


@pytest.mark.parametrize(
    ("command", "signum", "before"),
    [
        (["eval", "run", "--baselines", "", "--out", "{tmp}/report"], signal.SIGINT,
         "no {tmp}/report is left behind (the report is written at the end); "),
        (["heads", "train"], signal.SIGTERM, "no head was written into {ckpt}; "),
    ],
)  # fmt: skip
def test_eval_and_heads_keep_their_embeddings_for_the_same_command(
    eval_inputs: Path, tmp_path: Path, command: list[str], signum: int, before: str
) -> None:
    """Stopped once the checkpoint's embeddings are done (at the first head's cross-validation): the
    cache holds them, and the same command again does not embed a page."""
    checkpoint, cache = eval_inputs / "ckpt", tmp_path / "cache"
    argv = [*(part.format(tmp=tmp_path) for part in command), "--checkpoint", str(checkpoint),
            "--tasks", str(eval_inputs / "tasks"), "--cache", str(cache), "--hidden", "16"]  # fmt: skip
    argv += ["--max-epochs", "3"]
    ended = interrupt(argv, signum, at="stop:model_training.evaluation.runner:cross_validate")
    assert_one_line(
        ended,
        signum,
        f"htmllm {' '.join(command[:2])}: {HOW[signum]}; {before.format(tmp=tmp_path, ckpt=checkpoint)}"
        f"the stages finished (pages pruned, extracted, a checkpoint's or baseline's embeddings) are kept "
        f"in the cache {cache}: run the same command again to go on from them",
    )
    embedding = re.compile(r"embedding \d+ pages with ")  # the checkpoint's embedding, logged
    assert embedding.search(ended.err)
    again = htmllm(*argv)
    assert again.returncode == 0, again.stderr
    assert not embedding.search(again.stderr)
