"""`htmllm eval run` and `htmllm heads train`: what they refuse before any page is read, and what
`eval run` says of a checkpoint the service would refuse to serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.cli import main
from tests.factories.checkpoint import build_tiny_checkpoint


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_training.evaluation.derive import derive_tasks
    from tests.model_training.evaluation.pagegen import write_corpus

    root = tmp_path_factory.mktemp("eval-checks")
    derive_tasks(write_corpus(root / "corpus.jsonl", sites=9, pages_per_site=4), root / "tasks", min_pages=4,
                 min_sites=3, folds=3)  # fmt: skip
    build_tiny_checkpoint(root / "ckpt")
    return root


def _argv(command: str, inputs: Path, tmp_path: Path, checkpoint: Path) -> list[str]:
    argv = ["eval", "run", "--baselines", "", "--out", str(tmp_path / "report")] if command == "eval" else []
    argv = argv or ["heads", "train"]
    return [*argv, "--checkpoint", str(checkpoint), "--tasks", str(inputs / "tasks"), "--cache",
            str(tmp_path / "cache"), "--hidden", "16", "--max-epochs", "2"]  # fmt: skip


@pytest.mark.parametrize("command", ["eval", "heads"])
def test_a_training_runs_folder_gets_its_model_suggested(
    inputs: Path, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's folder, whose checkpoint is its model/, had been "htmllm.json is missing: ... is not an
    htmllm checkpoint", with no word of the checkpoint inside, where embed, serve and export-onnx name it."""
    run = tmp_path / "run"
    shutil.copytree(inputs / "ckpt", run / "model")
    assert main(_argv(command, inputs, tmp_path, run)) == 1
    prog = "htmllm eval run" if command == "eval" else "htmllm heads train"
    assert capsys.readouterr().err.splitlines() == [
        f"{prog}: checkpoint_invalid: {run} is not an htmllm checkpoint (it holds no htmllm.json); did you "
        f"mean --checkpoint {run / 'model'}?"
    ]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "report").exists()


@pytest.mark.parametrize("command", ["eval", "heads"])
def test_float16_on_a_cpu_is_refused_before_a_page_is_pruned(
    inputs: Path, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Engine refused it only when it started, once every page was pruned: minutes lost on a real task
    set. Both say so as a usage error, status 2."""
    status = main([*_argv(command, inputs, tmp_path, inputs / "ckpt"), "--dtype", "float16"])
    err = capsys.readouterr().err
    assert "float16 is for CUDA" in err and "Traceback" not in err
    assert not (tmp_path / "cache").exists()  # no page pruned, nothing embedded
    assert not (tmp_path / "report").exists()
    assert status == 2
    prog = "htmllm eval run" if command == "eval" else "htmllm heads train"
    assert err.splitlines() == [
        f"{prog}: --dtype float16 cannot run on --device cpu: float16 is for CUDA; on CPU use "
        "float32, or bfloat16 where AMX/AVX512-BF16 exist"
    ]


def test_eval_says_which_head_the_service_would_refuse_and_records_it(
    inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The evaluation embeds with the encoder alone, so a broken head file no longer fails it: a pre-deploy
    evaluation passed a checkpoint the service refuses to start on, without a word."""
    broken = tmp_path / "broken"
    shutil.copytree(inputs / "ckpt", broken)
    (broken / "heads" / "page_type.safetensors").write_bytes(b"not a safetensors file")
    argv = [*_argv("eval", inputs, tmp_path, broken), "--checkpoint", str(inputs / "ckpt")]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    (entry,) = report["unservable_heads"]  # the sound checkpoint is not listed
    assert (entry["checkpoint"], entry["head"]) == (str(broken), "page_type")
    assert "page_type.safetensors" in entry["reason"]
    assert err[-1] == (
        f"htmllm eval run: warning: {broken} cannot be served: the service would refuse to load its task "
        f"head 'page_type': {entry['reason']}"
    )
    rows = {system["checkpoint"] for system in report["systems"]}
    assert rows == {str(broken), str(inputs / "ckpt")}  # both evaluated all the same


def test_eval_help_shows_its_list_defaults_as_they_are_typed(capsys: pytest.CaptureFixture[str]) -> None:
    """The help had shown Python tuples: "(default: ('html',))"."""
    from service.cli import build_parser

    with pytest.raises(SystemExit):
        main(["eval", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: html)" in text and "(default: random,tfidf,minilm)" in text
    assert "(default: (" not in text
    args = build_parser().parse_args(["eval", "run", "--tasks", "t"])
    assert (args.input, args.baselines) == (("html",), ("random", "tfidf", "minilm"))


def test_a_repeated_seed_is_refused_and_the_seeds_run_are_recorded(
    inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--seeds 0,0` ran seed 0 once without a word, and report.json's config did not say which seeds
    its spread is over."""
    with pytest.raises(SystemExit) as exit_info:
        main([*_argv("eval", inputs, tmp_path, inputs / "ckpt"), "--seeds", "0,1,0"])
    assert exit_info.value.code == 2
    assert "argument --seeds: seed 0 is given more than once in '0,1,0'" in capsys.readouterr().err
    assert not (tmp_path / "report").exists() and not (tmp_path / "cache").exists()

    assert main([*_argv("eval", inputs, tmp_path, inputs / "ckpt"), "--seeds", "3,1"]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    assert report["config"]["seeds"] == [3, 1] and report["config"]["seed"] == 3
    assert main([*_argv("eval", inputs, tmp_path, inputs / "ckpt"), "--seed", "4"]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    assert report["config"]["seeds"] == [4]
