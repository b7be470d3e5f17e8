"""The training commands' dispatch: every one runs under `interruptible`, which ends a run stopped by
Ctrl-C or SIGTERM in one line saying what its command kept (the commands' `ON_INTERRUPT`), with the
shell's status. The real processes, signalled, are tests/model_training/test_interrupts.py's."""

from __future__ import annotations

import argparse
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from model_training import cli
from model_training.commands import data, heads, teacher, train
from model_training.commands import eval as eval_command
from service.cli import build_parser


def _stopped(args: argparse.Namespace) -> int:
    raise KeyboardInterrupt


def _terminated(args: argparse.Namespace) -> int:
    signal.raise_signal(signal.SIGTERM)  # as `kill` sends it: taken as Ctrl-C while the command runs
    return 0


@pytest.mark.parametrize(
    ("func", "status", "how"), [(_stopped, 130, "interrupted"), (_terminated, 143, "terminated (SIGTERM)")]
)
def test_an_interrupted_command_says_what_it_kept_in_one_line(
    func: cli.Command, status: int, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = cli.interruptible("htmllm thing do", func, lambda args: f"kept {args.out}: run it again")
    assert run(argparse.Namespace(out="x")) == status
    assert capsys.readouterr().err.splitlines() == [f"htmllm thing do: {how}; kept x: run it again"]


def _hung_up(args: argparse.Namespace) -> int:
    signal.raise_signal(signal.SIGHUP)  # the terminal or SSH session closed
    return 0


class _HungUpTerminal:
    """stderr of a terminal that is gone: every write is EIO."""

    def write(self, text: str) -> int:
        raise OSError(5, "Input/output error")

    def flush(self) -> None:
        raise OSError(5, "Input/output error")


def test_a_hang_up_ends_the_command_as_sigterm_does_with_129(capsys: pytest.CaptureFixture[str]) -> None:
    run = cli.interruptible("htmllm thing do", _hung_up, lambda args: f"kept {args.out}: run it again")
    assert run(argparse.Namespace(out="x")) == 129
    assert capsys.readouterr().err.splitlines() == ["htmllm thing do: hung up (SIGHUP); kept x: run it again"]


def test_a_line_the_hung_up_terminal_cannot_take_leaves_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """Printing the line to a terminal that hung up raised EIO: a traceback and status 1 in place of 129."""
    monkeypatch.setattr(sys, "stderr", _HungUpTerminal())
    run = cli.interruptible("htmllm thing do", _hung_up, lambda args: "kept")
    assert run(argparse.Namespace()) == 129


def test_under_torchrun_only_rank_0_says_what_was_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every torchrun worker gets the signal: each had printed the same line, interleaved."""
    run = cli.interruptible("htmllm train", _stopped, lambda args: "kept step 10: run it again")
    line = "htmllm train: interrupted; kept step 10: run it again"
    for rank, said in (("1", []), ("3", []), ("0", [line])):
        monkeypatch.setenv("RANK", rank)
        assert run(argparse.Namespace()) == 130
        assert capsys.readouterr().err.splitlines() == said


def test_a_command_that_ends_by_itself_is_left_alone() -> None:
    run = cli.interruptible("htmllm thing do", lambda args: 3, lambda args: "unused")
    assert run(argparse.Namespace()) == 3


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return list(cli.commands(parser))


def test_every_training_command_runs_interruptible() -> None:
    """Each command a training module adds (`train`, and `data prepare`, `tokenizer train`, ... below
    their groups) is wrapped; the service's own commands are not this module's."""
    parser = build_parser()
    group = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    wrapped = {
        leaf.prog
        for name, sub in group.choices.items()
        for leaf in _leaves(sub)
        if hasattr(leaf.get_default("func"), "__wrapped__")
    }
    assert wrapped == {
        "htmllm tokenizer train", "htmllm tokenizer eval", "htmllm data prepare", "htmllm teacher embed",
        "htmllm train", "htmllm tasks derive", "htmllm eval run", "htmllm heads train", "htmllm heads remove",
        "htmllm heads rename",
    }  # fmt: skip


def test_a_command_whose_module_says_nothing_of_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def register(subparsers: argparse._SubParsersAction[Any]) -> None:
        group = subparsers.add_parser("extra").add_subparsers()
        group.add_parser("said").set_defaults(func=lambda args: 0)
        group.add_parser("unsaid").set_defaults(func=lambda args: 0)

    module = types.ModuleType("extra_module")
    module.register = register  # type: ignore[attr-defined]
    module.ON_INTERRUPT = {"said": lambda args: ""}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "extra_module", module)
    monkeypatch.setattr(cli, "TRAINING_COMMANDS", ("extra_module",))
    subparsers = argparse.ArgumentParser(prog="htmllm").add_subparsers()
    with pytest.raises(
        RuntimeError, match=r"extra_module\.ON_INTERRUPT says nothing of `htmllm extra unsaid`"
    ):
        cli.register(subparsers)


def _train_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    return parser.parse_args(["train", "--out", str(tmp_path / "run"), *extra])


def test_train_names_the_checkpoint_a_resume_starts_from(tmp_path: Path) -> None:
    args = _train_args(tmp_path)
    run = tmp_path / "run"
    assert train.interrupted(args) == (
        f"no checkpoint was written in {run} yet: run the same command again to start over"
    )
    for step in (2, 4):
        (run / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (run / "checkpoints" / f"step-{step:08d}" / "trainer_state.pt").write_bytes(b"")
    (run / "checkpoints" / "step-00000006.tmp").mkdir()  # cut short: no checkpoint
    (run / "checkpoints" / "latest").write_text("step-00000004\n", encoding="utf-8")
    last = run / "checkpoints" / "step-00000004"
    assert train.interrupted(args) == (
        f"the last checkpoint is step 4 ({last}): run the same command to resume from it"
    )
    # With --no-resume the same command would start over again. Stopped before training began (nothing
    # recorded), the checkpoint is the earlier run's, not yet discarded.
    no_resume = _train_args(tmp_path, "--no-resume")
    assert train.interrupted(no_resume) == (
        f"the earlier run's checkpoints were not discarded yet (the last is step 4, {last}) and the new run "
        "wrote none: run the same command again to start over"
    )
    setattr(no_resume, train.EARLIER_CHECKPOINT, None)  # the new run started where there was none
    assert train.interrupted(no_resume) == (
        f"the last checkpoint is step 4 ({last}): run it without --no-resume to resume from it"
    )


def test_data_prepare_says_when_its_output_was_left_incomplete(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path)
    again = "run the same command again to prepare them from the first page"
    assert data.interrupted_prepare(args) == (
        f"nothing is kept ({tmp_path} was left as it was; a preparation does not resume): {again}"
    )
    (tmp_path / "shard-00000.parquet").write_bytes(b"")  # written, the manifest not yet
    assert data.interrupted_prepare(args) == (
        f"{tmp_path} holds part of the new shards and no manifest.json (it is incomplete): {again}"
    )


def test_teacher_embed_says_when_its_output_was_left_incomplete(tmp_path: Path) -> None:
    again = "run the same command again to embed the shards from the first"
    gone = argparse.Namespace(out=tmp_path / "teacher")  # made by the run, and removed with it
    assert teacher.interrupted_embed(gone) == (
        f"nothing is kept (no {gone.out} is left behind; a teacher run does not resume): {again}"
    )
    args = argparse.Namespace(out=tmp_path)
    (tmp_path / "shard-00000.npy").write_bytes(b"")
    assert teacher.interrupted_embed(args) == (
        f"{tmp_path} holds part of the new vectors and no teacher.json (it is incomplete): run the same "
        "command again to embed the shards from the first"
    )


def test_eval_and_heads_without_a_cache_keep_nothing(tmp_path: Path) -> None:
    args = argparse.Namespace(cache="", out=tmp_path / "report", checkpoint=tmp_path / "ckpt")
    kept = "nothing is kept (--cache ''): run the same command again to start over"
    # A report directory the run made is removed with it; one that was there is left as it was.
    assert eval_command.interrupted_run(args) == (
        f"no {args.out} is left behind (the report is written at the end); {kept}"
    )
    args.out.mkdir()
    assert eval_command.interrupted_run(args) == f"the report in {args.out} is written at the end; {kept}"
    assert heads.interrupted_train(args) == f"no head was written into {args.checkpoint}; {kept}"
