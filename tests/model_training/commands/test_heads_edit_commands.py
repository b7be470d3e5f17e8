"""`htmllm heads remove` and `htmllm heads rename` from the command line (exit statuses, the model card
rewritten), and the card of every `htmllm heads` command rewritten under the heads lock, so that two
commands run at once leave a card listing the heads htmllm.json holds."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from model_training import default_model
from model_training.default_model import CARD_FILE, heads_line, heads_section
from model_training.evaluation.derive import derive_tasks
from service.cli import main
from service.core.checkpoint import checkpoint_fingerprint, load_checkpoint, read_meta
from service.core.modeling import HeadSpec
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.evaluation.pagegen import write_corpus
from tests.model_training.evaluation.test_runner import fake_engine


def _write_card(ckpt: Path) -> None:
    """A card as `make default-model` writes one (its heads section between the markers), hand edits kept."""
    heads = read_meta(ckpt).heads
    lines = ["# tiny", "", "- Encoder: hand-edited.", heads_line(heads), "", *heads_section(heads), ""]
    (ckpt / CARD_FILE).write_text("\n".join([*lines, "## Limits", "- Mine.", ""]), encoding="utf-8")


def _assert_card_lists(ckpt: Path, heads: list[HeadSpec]) -> None:
    card = (ckpt / CARD_FILE).read_text(encoding="utf-8")
    assert heads_line(heads) in card and "\n".join(heads_section(heads)) in card, card
    assert "- Encoder: hand-edited." in card and "- Mine." in card


def test_remove_and_rename_change_the_heads_and_the_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    _write_card(ckpt)
    assert main(["heads", "rename", "--checkpoint", str(ckpt), "page_type", "kind"]) == 0
    assert f"renamed head 'page_type' of {ckpt} to 'kind'" in capsys.readouterr().out
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["kind", "quality"]
    _assert_card_lists(ckpt, read_meta(ckpt).heads)
    assert main(["heads", "remove", "--checkpoint", str(ckpt), "quality"]) == 0
    assert f"removed head 'quality' from {ckpt}" in capsys.readouterr().out
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["kind"]
    _assert_card_lists(ckpt, read_meta(ckpt).heads)
    assert sorted(file.name for file in (ckpt / "heads").iterdir()) == ["kind.safetensors"]


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (["remove", "topic"], 2, "unknown_head: checkpoint {ckpt} has no head 'topic'"),
        (["rename", "topic", "kind"], 2, "unknown_head"),
        (["rename", "quality", "page_type"], 2, "validation_error: checkpoint {ckpt} has a head 'page_type'"),
        (["rename", "quality", "embedding"], 2, "validation_error: head 'embedding'"),
        (["rename", "quality", "q v2"], 2, "validation_error: head 'q v2': a head name must be ASCII"),
        (["rename", "quality", "x" * 201], 2, "validation_error: head 'xxx"),  # a traceback, exit 1
    ],
)
def test_a_refused_name_exits_2_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], status: int, said: str
) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    _write_card(ckpt)
    card, fingerprint = (ckpt / CARD_FILE).read_bytes(), checkpoint_fingerprint(ckpt)
    assert main(["heads", args[0], "--checkpoint", str(ckpt), *args[1:]]) == status
    assert f"htmllm heads {args[0]}: {said.format(ckpt=ckpt)}" in capsys.readouterr().err
    assert (ckpt / CARD_FILE).read_bytes() == card and checkpoint_fingerprint(ckpt) == fingerprint
    assert sorted(file.name for file in (ckpt / "heads").iterdir()) == [
        "page_type.safetensors",
        "quality.safetensors",
    ]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["rename", "--checkpoint", "{ckpt}", "quality", "-x"], "old new"),
        (["rename", "-x", "--checkpoint", "{ckpt}", "quality"], "old new"),
        (["remove", "--checkpoint", "{ckpt}", "-x"], "name"),
        (["remove", "--checkpoint={ckpt}", "--", "quality", "-x"], None),  # past `--`: argparse's own word
    ],
)
def test_a_head_name_that_begins_with_a_dash_is_told_to_go_after_double_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], names: str | None
) -> None:
    """argparse reads `-x` as an option wherever it stands and had said "the following arguments are
    required: new", of the name just given: a usage error (status 2) that says what to type instead."""
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    fingerprint = checkpoint_fingerprint(ckpt)
    with pytest.raises(SystemExit) as exited:
        main(["heads", *(arg.format(ckpt=ckpt) for arg in args)])
    assert exited.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    if names is None:
        assert err == "htmllm: error: unrecognized arguments: -x"
    else:
        assert err == (
            f"htmllm heads {args[0]}: error: '-x' reads as an option (it begins with '-'), and the "
            "command has none of that name: a head name that begins with '-' goes after `--`, which ends "
            f"the options: htmllm heads {args[0]} --checkpoint CHECKPOINT -- {names}"
        )
    assert checkpoint_fingerprint(ckpt) == fingerprint


def test_a_head_called_with_a_dash_first_is_renamed_and_removed_after_double_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    assert main(["heads", "rename", "--checkpoint", str(ckpt), "--", "quality", "-x"]) == 0
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type", "-x"]
    # Options, abbreviated or with `=`, and a negative number are no head names to refuse.
    assert main(["heads", "rename", "--check", str(ckpt), "--", "-x", "-1"]) == 0
    assert main(["heads", "remove", f"--checkpoint={ckpt}", "-1"]) == 0
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type"]
    assert "removed head '-1'" in capsys.readouterr().out


def test_no_checkpoint_exits_1_and_makes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert main(["heads", "remove", "--checkpoint", str(missing), "quality"]) == 1
    assert f"checkpoint_invalid: checkpoint directory {missing} does not exist" in capsys.readouterr().err
    assert not missing.exists()  # no heads/ nor lock file made for it


def test_a_training_runs_folder_is_pointed_to_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_tiny_checkpoint(tmp_path / "run" / "model")
    assert main(["heads", "remove", "--checkpoint", str(tmp_path / "run"), "quality"]) == 1
    assert f"--checkpoint {tmp_path / 'run' / 'model'}" in capsys.readouterr().err


def test_a_card_is_rewritten_under_the_lock_of_the_change_it_describes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`heads train` A had rewritten the card after letting go of the heads lock: `heads remove` B,
    run between A's reading htmllm.json for the card and A's writing it, wrote its card first, and A's
    then listed the head B had removed. B, started there, must wait for A (asked without waiting first,
    so that no timing decides the outcome) and write the last card."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    _write_card(ckpt)
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    train = ["heads", "train", "--checkpoint", str(ckpt), "--tasks", str(tmp_path / "tasks"), "--cache", ""]
    train += ["--hidden", "8", "--max-epochs", "2", "--patience", "1", "--folds", "3"]

    b_waits, b_done = threading.Event(), threading.Event()
    b_stopped = threading.Event()  # B waits for the lock, or is done
    statuses: list[int] = []
    real_flock, real_update = fcntl.flock, default_model.update_card_heads

    def flock(fd: int, operation: int) -> None:
        if threading.current_thread().name != "B":
            return real_flock(fd, operation)
        try:
            return real_flock(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            b_waits.set()  # A holds the lock: B waits for it
            b_stopped.set()
            return real_flock(fd, operation)

    def remove() -> None:
        try:
            statuses.append(main(["heads", "remove", "--checkpoint", str(ckpt), "page_kind"]))
        finally:
            b_done.set()
            b_stopped.set()

    b = threading.Thread(target=remove, name="B")

    def update_card_heads(text: str, before: list[HeadSpec], after: list[HeadSpec]) -> str | None:
        if not b.is_alive() and not b_done.is_set():  # A, with the heads it read for the card
            b.start()
            assert b_stopped.wait(30), "B neither waited for the lock nor ran"  # a failure guard only
        return real_update(text, before, after)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(default_model, "update_card_heads", update_card_heads)
    assert main(train) == 0
    b.join(60)
    assert statuses == [0]
    heads = read_meta(ckpt).heads
    assert [spec.name for spec in heads] == ["page_type", "quality", "schema_type"]
    _assert_card_lists(ckpt, heads)
    assert b_waits.is_set()
