"""A tiny end-to-end run: generated pages, derived tasks, a tiny checkpoint, every system, the report;
then `htmllm heads train` writes served heads into the checkpoint without touching the encoder."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model_training.evaluation.derive import derive_tasks
from model_training.evaluation.heads import HeadConfig
from model_training.evaluation.report import write_report
from model_training.evaluation.runner import EvalConfig, run_evaluation
from model_training.evaluation.tasks import load_tasks
from service.cli import main
from service.core.checkpoint import WEIGHTS_FILE, load_checkpoint
from service.core.errors import HtmllmError
from service.engine.engine import Engine
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.evaluation.pagegen import page_html, write_corpus

SMALL_HEAD = HeadConfig(hidden=16, max_epochs=25, patience=4, batch_size=16)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    corpus = write_corpus(root / "corpus.jsonl", sites=9, pages_per_site=4)
    derive_tasks(corpus, root / "tasks", min_pages=4, min_sites=3, folds=3)
    build_tiny_checkpoint(root / "ckpt")
    build_tiny_checkpoint(root / "ckpt-b", seed=1, pooling="mean")
    return root


@pytest.mark.slow
def test_evaluation_run_reports_every_system_and_study(workdir: Path) -> None:
    tasks = load_tasks(workdir / "tasks")
    config = EvalConfig(
        checkpoints=(workdir / "ckpt", workdir / "ckpt-b"),
        truncate=(24, 128, 4096),  # 4096 is capped at the tiny model's 128
        inputs=("html", "text"),
        baselines=("random", "tfidf", "minilm"),
        head=SMALL_HEAD,
        cache_dir=workdir / "cache",
    )
    result = run_evaluation(tasks, config)
    kinds = [s.kind for s in result.systems]
    assert (
        kinds.count("checkpoint") == 2 * 2 * 2
        and len(set(s.name for s in result.systems)) == len(kinds)
        and {"random", "tfidf", "minilm"} <= set(kinds)
    )
    names = {t.spec.name for t in tasks}
    for system in result.systems:
        assert set(system.scores) == names
        assert all(len(r.folds) == 3 and 0.0 <= r.mean <= 1.0 for r in system.scores.values())
        assert system.nmm is not None
    random_row = next(s for s in result.systems if s.kind == "random")
    assert random_row.nmm == pytest.approx(0.0)
    html_rows = {
        s.truncate: s
        for s in result.systems
        if s.kind == "checkpoint" and s.input == "html" and s.checkpoint == str(workdir / "ckpt")
    }
    assert set(html_rows) == {24, 128}
    assert html_rows[24].truncated_fraction == 1.0  # every generated page is longer than 24 tokens
    assert (html_rows[128].truncated_fraction or 0.0) < 1.0
    # Both the cache and the report are on disk.
    assert len(list((workdir / "cache").glob("*.npz"))) == 2 * 2 * 2 + 1  # checkpoint systems + MiniLM
    written = write_report(result, workdir / "report")
    assert {p.name for p in written} == {"report.md", "report.json", "context_length.png"}
    markdown = (workdir / "report" / "report.md").read_text()
    assert (
        "## Context length (truncation study)" in markdown and "## Pruned HTML vs extracted text" in markdown
    )
    assert "TF-IDF" in markdown and "all-MiniLM-L6-v2" in markdown
    report = json.loads((workdir / "report" / "report.json").read_text())
    assert len(report["systems"]) == len(result.systems)
    assert (workdir / "report" / "context_length.png").read_bytes()[:4] == b"\x89PNG"


def encoder_state(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_checkpoint(path).model.encoder.state_dict().items()}


@pytest.mark.slow
def test_heads_train_writes_served_heads_and_leaves_the_encoder(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # `--cache ''` means no cache: nothing may land in the working directory
    ckpt = workdir / "ckpt"
    weights_before = hashlib.sha256((ckpt / WEIGHTS_FILE).read_bytes()).hexdigest()
    state_before = encoder_state(ckpt)
    argv = [
        "heads",
        "train",
        "--checkpoint",
        str(ckpt),
        "--tasks",
        str(workdir / "tasks"),
        "--cache",
        "",
        "--hidden",
        "16",
        "--max-epochs",
        "25",
        "--patience",
        "4",
        "--folds",
        "3",
    ]
    assert main(argv) == 0
    assert list(cwd.iterdir()) == []
    assert hashlib.sha256((ckpt / WEIGHTS_FILE).read_bytes()).hexdigest() == weights_before
    loaded = load_checkpoint(ckpt)
    for name, tensor in loaded.model.encoder.state_dict().items():
        assert torch.equal(tensor, state_before[name]), name
    specs = {spec.name: spec for spec in loaded.meta.heads}
    assert {"page_kind", "schema_type", "language", "page_type", "quality"} <= set(specs)
    assert specs["language"].labels == ["de", "en", "es"]
    assert 0.0 <= specs["language"].metrics["f1_macro"] <= 1.0 and specs["language"].metrics["cv_folds"] == 3
    stored = {h["name"]: h for h in json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))["heads"]}
    counts = {k: stored["language"]["metrics"][k] for k in ("cv_folds", "pages")}
    assert all(type(v) is int for v in counts.values()), counts  # had been stored as 3.0

    async def serve() -> dict[str, float]:
        async with Engine.from_checkpoint(ckpt) as engine:
            (result,) = await engine.embed([page_html(lang="es", kind="article", seed=7)], heads=["language"])
        scores = result.scores["language"]
        assert isinstance(scores, dict)
        return scores

    scores = asyncio.run(serve())
    assert set(scores) == {"de", "en", "es"}
    assert np.isclose(sum(scores.values()), 1.0, atol=1e-5)


@pytest.mark.slow
def test_cli_derive_and_eval_run(workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "tasks",
                "derive",
                "--corpus",
                str(workdir / "corpus.jsonl"),
                "--out",
                str(tmp_path / "t"),
                "--min-pages",
                "4",
                "--min-sites",
                "3",
                "--folds",
                "3",
            ]
        )
        == 0
    )
    assert "language: 36 pages from 9 sites" in capsys.readouterr().out
    argv = [
        "eval",
        "run",
        "--checkpoint",
        str(workdir / "ckpt-b"),
        "--tasks",
        str(tmp_path / "t" / "language"),
        "--baselines",
        "random",
        "--cache",
        "",
        "--out",
        str(tmp_path / "report"),
        "--hidden",
        "16",
        "--max-epochs",
        "10",
        "--patience",
        "3",
    ]
    assert main(argv) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [s["kind"] for s in report["systems"]] == ["random", "checkpoint"]
    assert report["tasks"][0]["name"] == "language"


def test_cli_reports_bad_input_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "run", "--tasks", str(tmp_path / "missing"), "--baselines", "random"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["eval", "run", "--tasks", str(tmp_path), "--baselines", "bogus"]) == 1
    assert "baselines must be some of" in capsys.readouterr().err


def test_heads_train_refuses_a_length_beyond_the_checkpoint_before_embedding(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to prune every page and start the Engine before the Engine refused the length.
    argv = ["heads", "train", "--checkpoint", str(workdir / "ckpt"), "--tasks", str(workdir / "tasks")]
    assert main([*argv, "--cache", str(tmp_path / "cache"), "--max-length", "100000"]) == 1
    assert not (tmp_path / "cache").exists()  # nothing was pruned or embedded
    assert "outside 8..128" in capsys.readouterr().err
    # A cache path that is a file is a message too, not an OSError traceback.
    a_file = tmp_path / "a-file"
    a_file.write_text("x", encoding="utf-8")
    assert main([*argv, "--cache", str(a_file), "--max-epochs", "2"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_engine_options_are_checked_before_any_page_is_pruned(tmp_path: Path) -> None:
    # These used to be refused by the Engine, after every page had been pruned (and extracted).
    with pytest.raises(HtmllmError, match="threads must be at least 1"):
        EvalConfig(baselines=("random",), threads=0)
    if not torch.cuda.is_available():
        with pytest.raises(HtmllmError, match="CUDA is not available"):
            EvalConfig(baselines=("random",), device="cuda")


@pytest.mark.parametrize(
    ("option", "said"),
    [(["--lr", "-1"], "head lr must be a positive number, got -1.0"),
     (["--lr", "nan"], "head lr must be a positive number"),
     (["--hidden", "0"], "head hidden must be at least 1, got 0"),
     (["--max-epochs", "0"], "head max_epochs must be at least 1, got 0"),
     (["--folds", "1"], "at least 2 folds, got 1")],
)  # fmt: skip
def test_head_options_are_refused_by_name_before_any_page_is_embedded(
    workdir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    option: list[str],
    said: str,
) -> None:
    """`--lr -1` had failed with torch's message once every page was embedded; `--hidden 0` printed
    the whole HeadConfig repr; `--folds 1` passed silently for tasks whose rows carry folds."""
    from model_training.evaluation import runner

    def no_work(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("pages were embedded before the options were checked")

    monkeypatch.setattr(runner, "train_heads", no_work)
    monkeypatch.setattr(runner, "run_evaluation", no_work)
    tasks = ["--tasks", str(workdir / "tasks"), "--cache", str(tmp_path / "cache"), *option]
    for argv, command in (
        (["heads", "train", "--checkpoint", str(workdir / "ckpt"), *tasks], "heads train"),
        (["eval", "run", "--baselines", "random", "--out", str(tmp_path / "out"), *tasks], "eval run"),
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"htmllm {command}: ") and said in err[0], err
        assert "HeadConfig(" not in err[0]


def test_eval_run_refuses_zero_folds(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "run", "--tasks", str(workdir / "tasks"), "--baselines", "random", "--folds", "0"]
    assert main([*argv, "--cache", "", "--out", str(tmp_path / "out")]) == 1
    assert "at least 2 folds, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "column"),
    # (A name with a '.', such as `page_kind.probs`, is no task name at all: tasks.py refuses it.)
    [("embedding", "embedding"), ("id", "id"), ("tokens", "tokens")],
)
def test_heads_train_refuses_a_task_named_for_an_output_column(
    workdir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    column: str,
) -> None:
    """A head named `embedding` had been trained and saved, and `htmllm embed` then refused the
    checkpoint's heads ("would write a column")."""
    import shutil

    from model_training.evaluation import runner

    def no_work(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("pages were embedded before the task names were checked")

    monkeypatch.setattr(runner, "train_heads", no_work)
    tasks = tmp_path / "tasks"
    shutil.copytree(workdir / "tasks", tasks)
    renamed = tasks / "x-renamed"  # after page_kind in name order
    shutil.copytree(tasks / "schema_type", renamed)
    spec = json.loads((renamed / "task.json").read_text(encoding="utf-8"))
    (renamed / "task.json").write_text(json.dumps({**spec, "name": name}), encoding="utf-8")
    argv = ["heads", "train", "--checkpoint", str(workdir / "ckpt"), "--tasks", str(tasks)]
    assert main([*argv, "--cache", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("htmllm heads train: validation_error: "), err
    assert f"task {name!r}" in err[0] and f"the column {column!r}" in err[0]
