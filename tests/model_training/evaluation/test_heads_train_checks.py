"""What `htmllm heads train` refuses before a page is embedded: a label no page carries, and a
checkpoint that does not load; and `eval run`'s word on such a label.

A declared label without pages had been trained and served as a class the head never saw (scored near
0 on every page, left out of its f1_macro) without a word. A checkpoint holding another, broken head had
been given new heads, after every page was embedded, and stayed one the service refuses.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from model_training.evaluation.derive import derive_tasks
from model_training.evaluation.runner import EvalConfig, run_evaluation
from model_training.evaluation.tasks import load_tasks
from service.core.checkpoint import load_checkpoint, read_meta
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.evaluation.pagegen import write_corpus
from tests.model_training.evaluation.test_runner import TINY_HEAD, fake_engine


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    return tmp_path / "tasks"


def _args(ckpt: Path, tasks: Path) -> list[str]:
    args = ["heads", "train", "--checkpoint", str(ckpt), "--tasks", str(tasks), "--cache", ""]
    return [*args, "--hidden", "8", "--max-epochs", "2", "--patience", "1", "--folds", "3"]


def _add_label(task: Path, label: str) -> None:
    spec_file = task / "task.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    spec["labels"].append(label)
    spec_file.write_text(json.dumps(spec), encoding="utf-8")


def test_a_label_no_page_carries_is_refused_before_any_page_is_embedded(
    tmp_path: Path, tasks: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    _add_label(tasks / "page_kind", "never")
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt", heads=False)
    calls = fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    assert main(_args(ckpt, tasks)) == 1
    err = capsys.readouterr().err
    assert "validation_error" in err and "'never'" in err and "page_kind" in err and "task.json" in err, err
    assert calls == [] and read_meta(ckpt).heads == []


def test_a_label_whose_every_page_fails_pruning_is_refused(
    tmp_path: Path, tasks: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The label has a page in the task file, but that page is left out (it cannot be pruned)."""
    from service.cli import main

    _add_label(tasks / "page_kind", "empty")
    pages = tasks / "page_kind" / "pages.jsonl"
    row = {"id": "blank", "html": "", "label": "empty", "group": "blank.example", "fold": 0}
    pages.write_text(pages.read_text(encoding="utf-8") + json.dumps(row) + "\n", encoding="utf-8")
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt", heads=False)
    calls = fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    assert main(_args(ckpt, tasks)) == 1
    err = capsys.readouterr().err
    assert "'empty'" in err and "failed pruning" in err, err
    assert calls == [] and read_meta(ckpt).heads == []


def test_eval_run_warns_of_a_label_no_page_carries(tasks: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The figures do not suffer (f1_macro counts a class only where it is true or predicted), but the
    task is one `heads train` refuses: said where a task is usually tried first."""
    _add_label(tasks / "page_kind", "never")
    config = EvalConfig(baselines=("random",), head=TINY_HEAD)
    with caplog.at_level(logging.WARNING, logger="model_training.evaluation.runner"):
        run_evaluation(load_tasks(tasks, k=3), config)
    warned = [r.getMessage() for r in caplog.records if "'never'" in r.getMessage()]
    assert len(warned) == 1 and "page_kind" in warned[0], warned


def _break_head(ckpt: Path, name: str, other: str) -> None:
    """Copy another head's file over `name`'s: a load refuses it (its metadata names the other)."""
    shutil.copyfile(ckpt / "heads" / f"{other}.safetensors", ckpt / "heads" / f"{name}.safetensors")


def test_a_checkpoint_that_does_not_load_is_refused_before_any_page_is_embedded(
    tmp_path: Path, tasks: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")  # heads page_type and quality, no task of theirs
    _break_head(ckpt, "quality", "page_type")
    before = (ckpt / "htmllm.json").read_bytes()
    calls = fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    assert main(_args(ckpt, tasks)) == 1
    err = capsys.readouterr().err
    assert "checkpoint_invalid" in err and "quality.safetensors" in err, err
    assert "Nothing was trained" in err and "htmllm heads remove" in err  # what to do about it
    assert calls == [] and (ckpt / "htmllm.json").read_bytes() == before


def test_a_broken_head_the_run_replaces_does_not_stop_it(
    tmp_path: Path, tasks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retraining a broken head under its own name is the way out the load error gives: the check
    loads the checkpoint as the save leaves it, without the heads the run replaces."""
    from service.cli import main

    ckpt = build_tiny_checkpoint(tmp_path / "ckpt", heads=False)
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    assert main(_args(ckpt, tasks)) == 0  # heads page_kind and schema_type
    _break_head(ckpt, "page_kind", "schema_type")
    with pytest.raises(Exception, match="holds head"):
        load_checkpoint(ckpt)
    assert main(_args(ckpt, tasks)) == 0
    assert sorted(load_checkpoint(ckpt).model.heads) == ["page_kind", "schema_type"]


def test_a_broken_head_is_retrained_under_its_name_with_the_real_engine(tmp_path: Path, tasks: Path) -> None:
    """As above, with the pages embedded by the real Engine from a cold cache: it loads the encoder
    alone (the embeddings need no head), where loading every head had refused the broken one after
    `check_loads` let it through as the one the run replaces."""
    from service.cli import main

    ckpt = build_tiny_checkpoint(tmp_path / "ckpt", heads=False)
    assert main(_args(ckpt, tasks)) == 0
    _break_head(ckpt, "page_kind", "schema_type")
    assert main(_args(ckpt, tasks)) == 0
    assert sorted(load_checkpoint(ckpt).model.heads) == ["page_kind", "schema_type"]
