"""`teacher embed`, `tokenizer train`, `eval run` and `tasks derive` that fail leave no `--out` they made
(nor the parents they made, nor part of their output), as `data prepare` does (test_data_output_cleanup):
each had left the empty directory, or part of its files, which looked like a finished run's output to
whoever listed it later. Never removed: a directory that existed before, a complete output, anything the
run did not write, and what a rerun goes on from (`eval run`'s cache, `tasks derive`'s copied pages)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

from model_training.data import NO_EXTRACTION, DataError, prepare_shards
from model_training.evaluation import report as eval_report
from model_training.evaluation.derive import DERIVE_FILE, PAGES_DIR, derive_tasks
from model_training.outputs import file_names, output_dir
from model_training.teacher import TEACHER_META_FILE, embed_shards
from service.cli import main
from service.core.tokenizer import HtmlTokenizer
from tests.factories.cli import write_pages
from tests.model_training.evaluation.pagegen import write_corpus
from tests.model_training.test_data import _tokenizer_file, _write_corpus
from tests.model_training.test_teacher import _tiny_bert


def _disk_full(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_output_dir_keeps_what_a_rerun_goes_on_from_and_a_complete_output(tmp_path: Path) -> None:
    """The run's files and an empty `subdirs` go with the directory; files of a subdirectory the pattern
    does not name (a cache) keep it, and a `complete` file keeps everything."""
    written = file_names("part.bin")
    out = tmp_path / "a" / "out"
    with pytest.raises(KeyboardInterrupt), output_dir(out, written=written, subdirs=["cache"]) as made:
        (made / "part.bin").write_bytes(b"x")
        (made / "cache").mkdir()
        raise KeyboardInterrupt
    assert not (tmp_path / "a").exists()
    with pytest.raises(KeyboardInterrupt), output_dir(out, written=written, subdirs=["cache"]) as made:
        (made / "part.bin").write_bytes(b"x")
        (made / "cache").mkdir()
        (made / "cache" / "page.gz").write_bytes(b"kept")
        raise KeyboardInterrupt
    assert [p.relative_to(tmp_path).as_posix() for p in sorted((tmp_path / "a").rglob("*"))] == [
        "a/out",
        "a/out/cache",
        "a/out/cache/page.gz",
    ]
    done = tmp_path / "done"
    with pytest.raises(KeyboardInterrupt), output_dir(done, written=written, complete="part.bin") as made:
        (made / "part.bin").write_bytes(b"x")
        raise KeyboardInterrupt
    assert (done / "part.bin").read_bytes() == b"x"


# teacher embed


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cleanup-teacher")
    out = root / "shards"
    prepare_shards(
        _write_corpus(root, 6), out, _tokenizer_file(root), extractor=NO_EXTRACTION, workers=1, shard_size=3,
        progress=False,
    )  # fmt: skip
    return out


def test_teacher_embed_that_cannot_load_its_teacher_leaves_no_directory_it_made(
    shards: Path, tmp_path: Path
) -> None:
    with pytest.raises(DataError, match="cannot load teacher"):
        embed_shards(shards, tmp_path / "runs" / "teacher", model=str(tmp_path / "no-model"), progress=False)
    assert not (tmp_path / "runs").exists()
    there = tmp_path / "there"
    there.mkdir()
    with pytest.raises(DataError, match="cannot load teacher"):
        embed_shards(shards, there, model=str(tmp_path / "no-model"), progress=False)
    assert there.is_dir()  # it existed before the run


def test_teacher_embed_that_fails_while_writing_removes_its_vectors_and_directory(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first shard's vectors written, then the disk full: one .npy and no teacher.json was left."""
    bert = _tiny_bert(tmp_path / "bert", positions=64)
    saved: list[str] = []
    real_save = np.save

    def save_then_disk_full(path: Path, array: np.ndarray) -> None:
        if saved:
            _disk_full()
        saved.append(Path(path).name)
        real_save(path, array)

    monkeypatch.setattr(np, "save", save_then_disk_full)
    out = tmp_path / "runs" / "teacher"
    with pytest.raises(OSError, match="No space"):
        embed_shards(shards, out, model=str(bert), progress=False)
    assert saved == ["shard-00000.npy"]
    assert not (tmp_path / "runs").exists()
    monkeypatch.undo()
    embed_shards(shards, out, model=str(bert), progress=False)  # and the same run again writes it whole
    assert (out / TEACHER_META_FILE).is_file()


# tokenizer train


def _train(corpus: Path, out: Path) -> list[str]:
    return ["tokenizer", "train", "--corpus", str(corpus), "--split", "all", "--vocab-size", "512",
            "--min-frequency", "2", "--tags", "10", "--no-progress", "--out", str(out)]  # fmt: skip


def test_tokenizer_train_that_fails_leaves_no_directory_it_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "runs" / "tokenizer"
    assert main(_train(tmp_path / "missing.jsonl", out)) == 1  # a corpus that does not exist
    assert "htmllm tokenizer: " in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    # The vocabulary trained, then the disk full at tokenizer.json: one line (it had been a traceback).
    corpus = tmp_path / "pages.jsonl"
    write_pages(corpus, 30)
    monkeypatch.setattr(HtmlTokenizer, "save", _disk_full)
    assert main(_train(corpus, out)) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "htmllm tokenizer: cannot read or write a file: [Errno 28] No space left on device"
    )
    assert not (tmp_path / "runs").exists()


def test_tokenizer_train_keeps_its_tokenizer_when_only_the_report_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_training.commands import tokenizer as command

    corpus = tmp_path / "pages.jsonl"
    write_pages(corpus, 30)
    monkeypatch.setattr(command, "write_report", _disk_full)
    out = tmp_path / "runs" / "tokenizer"
    assert main(_train(corpus, out)) == 1
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json"]  # complete but for its report
    assert HtmlTokenizer.from_file(out / "tokenizer.json").tag_token_ids  # a whole tokenizer


# eval run


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cleanup-eval")
    corpus = write_corpus(root / "corpus.jsonl", sites=9, pages_per_site=4)
    derive_tasks(corpus, root / "tasks", min_pages=4, min_sites=3, folds=3)
    return root / "tasks"


def _eval(tasks: Path, out: Path, cache: Path | str) -> list[str]:
    return ["eval", "run", "--tasks", str(tasks), "--baselines", "random", "--cache", str(cache),
            "--out", str(out), "--hidden", "8", "--max-epochs", "2"]  # fmt: skip


def test_eval_run_that_fails_leaves_no_report_directory_it_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "report"
    assert main(_eval(tmp_path / "missing", out, "")) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_eval_run_that_fails_while_writing_keeps_its_cache(
    tasks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report directory goes, the cache (beside it, or inside it) stays with the directories that
    hold it: a rerun goes on from it."""
    monkeypatch.setattr(eval_report, "write_report", _disk_full)
    beside = tmp_path / "beside"
    assert main(_eval(tasks, beside / "report", beside / "cache")) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert [p.name for p in beside.iterdir()] == ["cache"] and any((beside / "cache").iterdir())
    inside = tmp_path / "inside" / "report"
    assert main(_eval(tasks, inside, inside / "cache")) == 1
    assert [p.name for p in inside.iterdir()] == ["cache"] and any((inside / "cache").iterdir())


# tasks derive


def _derive(corpus: Path, out: Path) -> list[str]:
    return ["tasks", "derive", "--corpus", str(corpus), "--out", str(out), "--min-pages", "4",
            "--min-sites", "3", "--folds", "3"]  # fmt: skip


def test_tasks_derive_that_fails_before_a_page_is_copied_leaves_no_directory_it_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "tasks"
    assert main(_derive(tmp_path / "missing.jsonl", out)) == 1
    assert "htmllm tasks derive: " in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_text("{not json\n", encoding="utf-8")
    assert main(_derive(unreadable, out)) == 1
    assert not (tmp_path / "runs").exists()


def test_tasks_derive_keeps_the_pages_it_copied_and_its_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pages copied before an unreadable row are what the next run reuses; a derive.json says why no
    task was derived (`require_a_task`)."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=9, pages_per_site=4)
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    out = tmp_path / "runs" / "tasks"
    assert main(_derive(corpus, out)) == 1
    assert [p.name for p in out.iterdir()] == [PAGES_DIR] and len(list((out / PAGES_DIR).iterdir())) == 36
    one_page = tmp_path / "one.jsonl"
    one_page.write_text(corpus.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    assert main(_derive(one_page, tmp_path / "few")) == 1
    assert "records why" in capsys.readouterr().err
    reasons = json.loads((tmp_path / "few" / DERIVE_FILE).read_text(encoding="utf-8"))
    assert all(task["skipped"] for task in reasons)


@pytest.mark.parametrize("through", ["new/../kept", "new/deeper/../../kept"])
def test_an_out_through_a_directory_that_does_not_exist_is_refused_and_nothing_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    """`new/../kept` named `kept` by a way through `new`, which the run would make: `kept` (an earlier
    run's, without its manifest) had read as made by the run, and a failure removed its files (or the
    directory itself, empty) and left `new` behind."""
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "shard-00000.parquet").write_bytes(b"an earlier run's")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(DataError, match=r"'\.\.' after new"), output_dir(through, written=file_names("x")):
        pytest.fail("the directory was made")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def test_an_out_through_an_existing_parent_is_taken(tmp_path: Path) -> None:
    """`..` after a directory that exists is the kernel's to follow, as before."""
    (tmp_path / "old").mkdir()
    out = tmp_path / "old" / ".." / "new"
    with pytest.raises(KeyboardInterrupt), output_dir(out, written=file_names("x")) as made:
        (made / "x").write_bytes(b"")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


def test_tokenizer_eval_that_fails_leaves_no_directory_it_made_for_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json` and `--markdown` are checked (their directories made) before the evaluation: a run that
    then fails (here a tokenizer that does not exist) takes away the directories it made, both files'
    parents across one another, and keeps a directory that was there."""
    (tmp_path / "kept").mkdir()
    corpus = tmp_path / "pages.jsonl"
    write_pages(corpus, 4)
    run = ["tokenizer", "eval", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "missing.json")]
    json_file, table = tmp_path / "runs" / "a" / "b" / "t.json", tmp_path / "runs" / "t.md"
    kept_file = tmp_path / "kept" / "new" / "t.md"
    assert main([*run, "--json", str(json_file), "--markdown", str(table), "--no-progress"]) == 1
    assert main([*run, "--markdown", str(kept_file), "--no-progress"]) == 1
    assert "htmllm tokenizer: " in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.iterdir()) == ["kept", "pages.jsonl"]
    assert list((tmp_path / "kept").iterdir()) == []
    # A path that would make its directory through one it has yet to make is refused, as `--out` is.
    through = tmp_path / "new" / ".." / "kept" / "t.json"
    assert main([*run, "--json", str(through), "--no-progress"]) == 1
    assert "'..' after" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_tokenizer_eval_keeps_the_directories_of_the_files_it_wrote(tmp_path: Path) -> None:
    corpus = tmp_path / "pages.jsonl"
    write_pages(corpus, 30)
    tokenizer = tmp_path / "tok"
    assert main([*_train(corpus, tokenizer)]) == 0
    table = tmp_path / "runs" / "t.md"
    assert main(["tokenizer", "eval", "--corpus", str(corpus), "--split", "all", "--tokenizer",
                 str(tokenizer), "--markdown", str(table), "--no-progress"]) == 0  # fmt: skip
    assert table.read_text(encoding="utf-8").startswith("|")


def test_tokenizer_eval_cleans_up_a_directory_named_two_ways_and_checks_its_files_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--json a/b/t.json --markdown <abs>/a/t.md`: `a` named relative and absolute had been two
    directories, and the absolute one, tried first, stopped the removal at the non-empty `a` (its `b`
    still there), leaving both. And the files themselves are checked before the evaluation: one path for
    both, or a symlink to nowhere, had failed the run only at its end (or the JSON replaced the table)."""
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "pages.jsonl"
    write_pages(corpus, 4)
    run = ["tokenizer", "eval", "--corpus", str(corpus), "--tokenizer", "missing.json", "--no-progress"]
    assert main([*run, "--json", "a/b/t.json", "--markdown", str(tmp_path / "a" / "t.md")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl"]
    assert main([*run, "--json", "same.out", "--markdown", str(tmp_path / "x" / ".." / "same.out")]) == 1
    assert "name one file" in capsys.readouterr().err
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere" / "x.json")
    assert main([*run, "--json", "dangling.json", "--markdown", "md/new/t.md"]) == 1
    assert "cannot be reached" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "pages.jsonl"]
