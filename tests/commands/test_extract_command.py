"""`htmllm extract`: an existing output survives a typo, a crash and an output that is the input."""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.commands import extract as extract_command
from service.core import pages
from tests.factories.cli import cli, kill_minus_nine_when, sigterm_given_back, stop_before_merge, write_pages
from tests.factories.disk import closed_directory, eio_for, unlistable_directory
from tests.memory import gzip_bomb, traced_peak

# The previous run's rows, as the command writes them (a file it did not write is not replaced without
# --overwrite: test_extract_output_safety.py).
OLD = '{"index": 0, "id": "old", "url": null, "error": {"code": "validation_error", "message": "old"}}\n'


def _extract(source: Path | str, output: Path | str) -> int:
    return main(
        ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    )


def _unreadable_rows(path: Path, n: int) -> Path:
    """Rows that become error rows without an extractor: the run needs no worker process."""
    path.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(n)))
    return path


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_missing_input_leaves_the_output_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    assert _extract(tmp_path / "typo.jsonl", output) == 1
    assert "does not exist" in capsys.readouterr().err
    assert output.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_an_input_behind_a_closed_directory_is_one_line_with_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input under a directory of mode 000 was a PermissionError traceback (`Path.is_dir` in the
    output-is-input check), and past it "cannot write <output>", the wrong file; source failures had no
    code, unlike `htmllm embed`'s. (Root searches any directory: the file system is patched.)"""
    closed = tmp_path / "noperm"
    (closed / "site").mkdir(parents=True)
    _unreadable_rows(closed / "pages.jsonl", 2)
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    closed_directory(monkeypatch, closed)
    for source in (closed / "pages.jsonl", closed / "site"):
        assert _extract(source, output) == 1
        assert capsys.readouterr().err == (
            f"htmllm extract: input_unreadable: page source {source} cannot be looked at: Permission denied "
            "(a directory on its path is closed to this user)\n"
        )
    assert output.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noperm", "results.jsonl"]
    # The other source failures carry their code too, as embed's and prune's do.
    assert _extract(tmp_path / "typo.jsonl", output) == 1
    assert (
        capsys.readouterr().err
        == f"htmllm extract: validation_error: page source {tmp_path / 'typo.jsonl'} does not exist\n"
    )


def test_an_output_that_is_the_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _unreadable_rows(tmp_path / "x.jsonl", 2)
    before = source.read_text()
    (tmp_path / "sub").mkdir()
    (tmp_path / "hard.jsonl").hardlink_to(source)
    for output in (source, tmp_path / "sub" / ".." / "x.jsonl", tmp_path / "hard.jsonl"):
        assert _extract(source, output) == 2, output
        assert "is the input" in capsys.readouterr().err
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "manifest.jsonl").write_text(before)
    assert _extract(corpus, corpus / "manifest.jsonl") == 2
    assert source.read_text() == before and (corpus / "manifest.jsonl").read_text() == before


def test_a_finished_run_replaces_the_output_with_open_w_modes(tmp_path: Path, umask_022: None) -> None:
    source = _unreadable_rows(tmp_path / "in.jsonl", 3)
    fresh = tmp_path / "fresh.jsonl"
    assert _extract(source, fresh) == 0
    rows = [json.loads(line) for line in fresh.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["r0", "r1", "r2"] and all("error" in r for r in rows)
    assert fresh.stat().st_mode & 0o777 == 0o644  # 0o666 & ~umask, not mkstemp's 0o600

    kept = tmp_path / "kept.jsonl"
    kept.write_text(OLD)
    kept.chmod(0o640)
    link = tmp_path / "link.jsonl"
    link.symlink_to(kept)
    assert _extract(source, link) == 0
    assert link.is_symlink() and kept.read_text() == fresh.read_text()
    assert kept.stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_run_that_crashes_leaves_the_output_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.commands.extract as command

    def crash(*_: object) -> dict[str, object]:
        raise RuntimeError("extractor bug")

    monkeypatch.setattr(command, "_process", crash)
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    with pytest.raises(RuntimeError, match="extractor bug"):
        _extract(_unreadable_rows(tmp_path / "in.jsonl", 5), output)
    assert output.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "results.jsonl"]


def test_an_unwritable_output_names_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that cannot be made (a missing one is: `test_a_missing_output_directory_is_made`)."""
    output = tmp_path / "closed" / "results.jsonl"
    mkdir = os.mkdir

    def refused(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path) == output.parent:  # as a parent directory of mode 555 refuses a user who is not root
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused)
    assert _extract(_unreadable_rows(tmp_path / "in.jsonl", 1), output) == 1
    assert capsys.readouterr().err == f"htmllm extract: cannot write {output}: Permission denied\n"


def test_a_missing_output_directory_is_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As `htmllm embed` (and `htmllm export-onnx`) make it: it was refused here, "No such file or
    directory", where embed went on."""
    output = tmp_path / "runs" / "today" / "results.jsonl"
    assert _extract(_unreadable_rows(tmp_path / "in.jsonl", 2), output) == 0
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == ["r0", "r1"]
    assert sorted(p.name for p in output.parent.iterdir()) == ["results.jsonl"]


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        (["--limit", "0"], 2, "--limit: must be at least 1, not 0"),
        (["--workers", "0"], 2, "--workers: must be at least 1, not 0"),
        (["--part-size", "0"], 2, "--part-size: must be at least 1, not 0"),
        (["--memory-limit-mb", "-1"], 2, "--memory-limit-mb: must be at least 0, not -1"),
        (  # an output under a file: "cannot write ...: Not a directory", without the code embed gives it
            ["--output", "{tmp}/in.jsonl/out.jsonl"], 1,
            "htmllm extract: validation_error: --output {tmp}/in.jsonl/out.jsonl is under {tmp}/in.jsonl, "
            "which is not a directory\n",
        ),
    ],
)  # fmt: skip
def test_options_are_refused_as_htmllm_embed_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], status: int, message: str
) -> None:
    """`--limit 0` wrote an empty output and exited 0 here; `htmllm embed` refuses it as a usage error."""
    source = _unreadable_rows(tmp_path / "in.jsonl", 2)
    options = [option.format(tmp=tmp_path) for option in options]
    code: object
    try:
        code = main(_args(source, tmp_path / "out.jsonl", *options))
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    err = capsys.readouterr().err
    assert code == status and message.format(tmp=tmp_path) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_ctrl_c_stops_at_once_and_leaves_the_output_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C used to wait for every page in the window to finish (jusText takes half a minute on each
    of these) and then end in a traceback; now the busy worker is killed and the exit code is 130."""
    import service.core.pages as pages_module
    from service.core.pages import Page

    slow = ("<html><body>" + "<div><p>alpha beta gamma delta epsilon</p></div>" * 20000).encode()

    def pages_then_ctrl_c(*_: object, **__: object) -> Iterator[Page]:
        yield Page(id="a", html=slow)
        yield Page(id="b", html=slow)
        raise KeyboardInterrupt

    monkeypatch.setattr(pages_module, "iter_pages", pages_then_ctrl_c)
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    args = ["--extractor", "justext", "--timeout-s", "300", "--workers", "1", "--no-progress"]
    started = time.perf_counter()
    try:
        code = main(["extract", "--input", str(tmp_path), "--output", str(output), *args])
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole pytest session
        pytest.fail(f"Ctrl-C ended in a traceback after {time.perf_counter() - started:.0f} s")
    assert code == 130 and time.perf_counter() - started < 15
    assert capsys.readouterr().err == f"htmllm extract: interrupted; {output} was left as it was\n"
    assert output.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


class _HungUpTerminal:
    """stderr of a terminal that is gone (SIGHUP): every write is EIO."""

    def write(self, text: str) -> int:
        raise OSError(errno.EIO, "Input/output error")

    def flush(self) -> None:
        raise OSError(errno.EIO, "Input/output error")


def test_an_interrupt_whose_line_the_terminal_cannot_take_keeps_its_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung-up terminal refuses the interrupt line: it had ended in an OSError traceback and status 1,
    where the interrupt's own status (130) says what happened."""
    import service.commands.extract as command

    def interrupted(*_: object) -> str:
        raise KeyboardInterrupt

    write_pages(tmp_path / "pages.jsonl", 2)
    monkeypatch.setattr(command, "_stream", interrupted)
    monkeypatch.setattr(sys, "stderr", _HungUpTerminal())
    assert (
        main(["extract", "--input", str(tmp_path / "pages.jsonl"), "--output", "-", "--no-progress"]) == 130
    )


def _args(source: Path, output: Path | str, *options: str) -> list[str]:
    return ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            *options]  # fmt: skip


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    """A row less its timings, the one thing two runs over the same pages write differently."""
    attempts = [{k: v for k, v in a.items() if k != "elapsed_s"} for a in row.get("attempts", [])]
    return {**{k: v for k, v in row.items() if k != "elapsed_s"}, "attempts": attempts}


@pytest.mark.slow  # a CLI process, and extractor workers for two more runs
def test_kill_minus_nine_then_resume_extracts_each_page_once_in_input_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    n = 300
    source = tmp_path / "pages.jsonl"
    write_pages(source, n)
    out = tmp_path / "out.jsonl"
    parts = tmp_path / "out.jsonl.parts"
    args = cli(*_args(source, out, "--part-size", "4"))
    kill_minus_nine_when(args, lambda: len(list(parts.glob("part-*.jsonl"))) >= 3)
    assert not out.exists(), "the first run finished before it could be killed"
    written_before = sum(len(json.loads(p.read_bytes().split(b"\n")[0])["ids"]) for p in parts.glob("part-*"))
    assert 0 < written_before < n

    assert main(args[3:]) == 0
    assert f"{n} pages, 0 failed" in capsys.readouterr().err
    assert not parts.exists()
    uninterrupted = tmp_path / "uninterrupted.jsonl"
    assert main(_args(source, uninterrupted, "--part-size", "4")) == 0
    rows = _rows(out)
    assert [row["id"] for row in rows] == [f"p{i}" for i in range(n)]
    assert all("text" in row and "error" not in row for row in rows)
    assert [_untimed(row) for row in rows] == [_untimed(row) for row in _rows(uninterrupted)]


def test_ctrl_c_keeps_the_parts_and_a_resume_with_other_options_or_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `htmllm embed`: run.json pins the input and the options that make the rows, a resume with
    others would mix two runs' rows in one file; the output is not touched until the resume ends."""
    source = _unreadable_rows(tmp_path / "in.jsonl", 5)
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    args = _args(source, output, "--part-size", "2")
    stop_before_merge(monkeypatch, args, "extract")
    parts = tmp_path / "results.jsonl.parts"
    assert capsys.readouterr().err == (
        f"htmllm extract: interrupted; {output} was left as it was; what was finished is kept in {parts}: "
        "run the same command again to go on\n"
    )
    assert len(list(parts.glob("part-*.jsonl"))) == 3

    assert main([*args, "--min-words", "10"]) == 1
    assert capsys.readouterr().err == (
        f"htmllm extract: validation_error: {parts} holds a run with other settings (min_words 50 -> 10); "
        "delete it, or pass --overwrite, to start over\n"
    )
    assert main([*args, "--extractor", "trafilatura"]) == 1
    assert (
        "other settings (extractor union -> trafilatura, order resiliparse,trafilatura,justext -> unset); "
        "delete it, or pass --overwrite, to start over\n" in capsys.readouterr().err
    )
    other = _unreadable_rows(tmp_path / "other.jsonl", 5)
    assert main(_args(other, output, "--part-size", "2")) == 1
    err = capsys.readouterr().err  # each path cut in its middle past 80 characters: never its name
    assert "other settings (input " in err and "/in.jsonl -> " in err and "/other.jsonl); delete it" in err
    # Parts of an older row layout (format 1 extracted pages over 16 MiB) are not merged with new rows.
    pinned = json.loads((parts / "run.json").read_text())
    (parts / "run.json").write_text(json.dumps({**pinned, "row_format": 1}))
    assert main(args) == 1
    expected = f"other settings (row_format 1 -> {extract_command.ROW_FORMAT}); delete it"
    assert expected in capsys.readouterr().err
    # Nor texts of an older extraction (run.json of format 5 had no extraction version).
    (parts / "run.json").write_text(
        json.dumps({k: v for k, v in pinned.items() if k != "extraction_version"})
    )
    assert main(args) == 1
    assert (
        f"other settings (extraction_version unset -> {pinned['extraction_version']}; written by an older "
        "htmllm); delete it, or pass --overwrite, to start over\n" in capsys.readouterr().err
    )
    (parts / "run.json").write_text(json.dumps(pinned))
    assert output.read_text() == OLD

    assert main([*args, "--workers", "2", "--part-size", "3"]) == 0  # neither changes a row
    assert (
        "5 pages, 5 failed (every extractor failed or the page could not be read), 0 passed the filter "
        "(>= 50 words); 5 of them done by the interrupted run" in capsys.readouterr().err
    )
    assert [row["id"] for row in _rows(output)] == [f"r{i}" for i in range(5)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "other.jsonl", "results.jsonl"]


def test_a_resume_over_an_input_that_changed_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _unreadable_rows(tmp_path / "in.jsonl", 4)
    output = tmp_path / "results.jsonl"
    args = _args(source, output, "--part-size", "2")
    stop_before_merge(monkeypatch, args, "extract")
    size = source.stat().st_size
    source.write_text("".join(json.dumps({"id": f"new{i}"}) + "\n" for i in range(4)))
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"input changed since the interrupted run (it was 1 file(s), {size} bytes, last modified" in err
    assert not output.exists()


def test_a_resume_over_an_input_of_pages_without_ids_rewritten_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows without ids are named by position: only the input's size and modification time tell."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"file": f"missing{i}.html"}) + "\n" for i in range(4)))
    output = tmp_path / "results.jsonl"
    args = _args(source, output, "--part-size", "2")
    stop_before_merge(monkeypatch, args, "extract")
    source.write_text("".join(json.dumps({"file": f"other{i}.html"}) + "\n" for i in range(4)))
    capsys.readouterr()
    assert main(args) == 1
    assert "input changed since the interrupted run (" in capsys.readouterr().err
    assert not output.exists()


def test_a_resume_over_a_page_file_a_manifest_names_replaced_since_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the manifest was pinned: the resume went on, its output mixing rows of the old page files and
    the new. (Corrupt gzip pages: error rows, no extractor needed.)"""
    corpus = tmp_path / "corpus"
    (corpus / "pages").mkdir(parents=True)
    for i in range(4):
        (corpus / "pages" / f"p{i}.html.gz").write_bytes(b"\x1f\x8b\x08 cut short")
    rows = "".join(json.dumps({"id": f"p{i}", "file": f"pages/p{i}.html.gz"}) + "\n" for i in range(4))
    (corpus / "manifest.jsonl").write_text(rows)
    output = tmp_path / "results.jsonl"
    args = _args(corpus, output, "--part-size", "2")
    stop_before_merge(monkeypatch, args, "extract")
    (corpus / "pages" / "p1.html.gz").write_bytes(gzip.compress(b"<p>the page it is now</p>"))
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "input changed since the interrupted run (it was 5 file(s)" in err and "delete" in err, err
    assert not output.exists()


@pytest.mark.parametrize("files", [[], ["notes.txt"]])
def test_a_directory_without_pages_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: list[str]
) -> None:
    """As a directory of JSONL files only is: an empty output and exit 0 would pass for a finished run."""
    source = tmp_path / "site"
    source.mkdir()
    for name in files:
        (source / name).write_text("not a page")
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    assert main(_args(source, output)) == 1
    assert capsys.readouterr().err == (
        f"htmllm extract: validation_error: page source {source} holds no pages: no .html or .htm file "
        "(optionally .gz) and no WARC file with an HTML record\n"
    )
    assert output.read_text() == OLD and not (tmp_path / "results.jsonl.parts").exists()


def test_a_part_cut_short_is_extracted_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _unreadable_rows(tmp_path / "in.jsonl", 6)
    output = tmp_path / "results.jsonl"
    args = _args(source, output, "--part-size", "2")
    stop_before_merge(monkeypatch, args, "extract")
    capsys.readouterr()
    parts = sorted((tmp_path / "results.jsonl.parts").glob("part-*.jsonl"))
    parts[1].write_bytes(parts[1].read_bytes()[:-10])  # damaged from outside
    assert main(args) == 0
    assert f"{parts[1]} cannot be read" in capsys.readouterr().err
    rows = _rows(output)
    assert [row["id"] for row in rows] == [f"r{i}" for i in range(6)] and all("error" in row for row in rows)


def test_standard_output_is_written_as_rows_come_and_leaves_nothing_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _unreadable_rows(tmp_path / "in.jsonl", 3)
    assert main(_args(source, "-", "--part-size", "1")) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["id"] for line in captured.out.splitlines()] == ["r0", "r1", "r2"]
    assert "3 pages, 3 failed" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_pages_over_the_cap_are_error_rows_read_in_bounded_memory_and_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line that inflates to 64 MiB (1 GiB once took 43 s and 5.2 GB, and its page was extracted) and a
    page over the cap each get their row, payload_too_large, and the run resumes over them as over any
    other row. The cap is lowered to 1 KiB (rows up to 4 KiB) so the test needs no 16 MiB page."""
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 1024)
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(
        gzip.compress(b'{"id": "r0"}\n')
        + gzip_bomb(b'{"id": "bomb", "html": "', 64 << 20, b'"}\n')
        + gzip.compress(json.dumps({"id": "big", "html": "x" * 2000}).encode() + b'\n{"id": "r3"}\n')
    )
    output = tmp_path / "out.jsonl"
    args = _args(source, output, "--part-size", "1")
    # every row extracted, the merge left to the resume
    _, peak = traced_peak(lambda: stop_before_merge(monkeypatch, args, "extract"))
    assert peak < 16 << 20
    capsys.readouterr()
    assert main(args) == 0
    assert "4 pages, 4 failed" in capsys.readouterr().err
    rows = _rows(output)
    assert [(row["id"], row["error"]["code"]) for row in rows] == [
        ("r0", "validation_error"),
        ("1", "payload_too_large"),  # its id was never read: named by its position
        ("big", "payload_too_large"),
        ("r3", "validation_error"),
    ]
    assert "line 2 has more than 4096 bytes" in rows[1]["error"]["message"]


@pytest.mark.parametrize(("option", "limit"), [([], 2048 * 2**20), (["--memory-limit-mb", "0"], None)])
def test_the_extractor_processes_get_the_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: list[str], limit: int | None
) -> None:
    """As in the service (HTMLLM_EXTRACT_MEMORY_LIMIT_MB): what the extraction limits misjudge fails a row."""
    import service.core.extract as extract

    seen: list[int | None] = []
    real = extract.ExtractorPool

    class Recorded(real):  # type: ignore[valid-type, misc]
        def __init__(self, *args: object, memory_limit_bytes: int | None = None, **kwargs: object) -> None:
            seen.append(memory_limit_bytes)
            super().__init__(*args, memory_limit_bytes=memory_limit_bytes, **kwargs)

    monkeypatch.setattr(extract, "ExtractorPool", Recorded)
    source = _unreadable_rows(tmp_path / "in.jsonl", 1)
    assert main(_args(source, tmp_path / "out.jsonl", *option)) == 0
    assert seen == [limit]
    with pytest.raises(SystemExit) as usage:
        main(_args(source, tmp_path / "out2.jsonl", "--memory-limit-mb", "-1"))
    assert usage.value.code == 2


def test_a_page_file_that_cannot_be_read_is_an_input_unreadable_row_a_resume_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError reading a row's page file (a file gone, a directory, EIO) was a `validation_error` row,
    as if the row were bad. It is `input_unreadable` now, and a resume keeps it as it keeps every failed
    row: done, though the disk answers by then. (Root reads a chmod 000 file: the reader is patched.)"""
    (tmp_path / "site").mkdir()
    (tmp_path / "eio.html").write_text("<p>a page on a failing disk</p>")
    (tmp_path / "gone.html").symlink_to(tmp_path / "nowhere.html")
    rows = [
        {"id": "gone", "file": "gone.html"},
        {"id": "dir", "file": "site"},
        {"id": "eio", "file": "eio.html"},
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in [*rows, {"id": "bad"}]))
    output = tmp_path / "out.jsonl"
    args = _args(source, output, "--part-size", "1")
    with monkeypatch.context() as patch:
        eio_for(patch, "eio.html")
        stop_before_merge(monkeypatch, args, "extract")
    capsys.readouterr()
    assert main(args) == 0
    assert "4 pages, 4 failed" in capsys.readouterr().err
    written = _rows(output)
    assert [(row["id"], row["error"]["code"]) for row in written] == [
        ("gone", "input_unreadable"),
        ("dir", "input_unreadable"),
        ("eio", "input_unreadable"),
        ("bad", "validation_error"),
    ]
    assert "Input/output error" in written[2]["error"]["message"]


_RUSSIAN = "Маленький город на берегу реки был полностью восстановлен после большого наводнения. "


@pytest.mark.parametrize("stream", [False, True])
def test_a_page_every_extractor_failed_on_counts_as_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    """With `--extractor all` such a row has no top-level `error`: "2 pages, 0 failed" it said."""
    nested = "<html><body>" + "<div>" * 100_000 + "</body></html>"  # refused by all three, in milliseconds
    good = "<html><body><article><p>" + _RUSSIAN * 10 + "</p></article></body></html>"
    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"id": "nested", "html": nested}) + "\n" + json.dumps({"id": "ok", "html": good})
    )
    output = "-" if stream else str(tmp_path / "out.jsonl")
    assert main(_args(source, output, "--extractor", "all")) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()] if stream else _rows(Path(output))
    assert all("error" in entry for entry in rows[0]["extractions"].values()) and "error" not in rows[0]
    assert "2 pages, 1 failed (every extractor failed or the page could not be read)" in captured.err


def test_a_row_reports_the_charset_its_page_was_decoded_from(tmp_path: Path) -> None:
    """A row's `encoding` that contradicts the page's `<meta>`: the reader transcodes the page to UTF-8,
    and the row said "utf-8" where the API, given the same bytes and charset, says windows-1251 (the
    WHATWG name both report, not Python's cp1251)."""
    html = f'<html><head><meta charset="utf-8"></head><body><p>{_RUSSIAN * 10}</p></body></html>'
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "ru.html").write_bytes(html.encode("cp1251"))
    rows = [{"id": "ru", "file": "pages/ru.html", "encoding": "windows-1251"}, {"id": "as-is", "html": html}]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    output = tmp_path / "out.jsonl"
    assert main(_args(tmp_path, output)) == 0
    first, second = _rows(output)
    assert first["encoding"] == "windows-1251" and "Маленький город" in first["text"] and first["passed"]
    assert second["encoding"] == "utf-8"


def _id_seven_twice(path: Path) -> Path:
    """Ten rows: row 3's real id is the integer 7 (read as "7"), and row 7 is not JSON, so it is named
    by its position, "7" too. Every row is an error row: the run needs no extraction."""
    lines = [json.dumps({"id": f"r{i}"}) for i in range(10)]
    lines[3] = json.dumps({"id": 7})
    lines[7] = "not json"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_every_row_has_its_input_position_which_tells_a_real_id_from_a_fallback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user found two rows with `id` "7" and no way to tell them apart in the JSONL (embed's Parquet
    has `index`); now every row starts with its `index`, on both the resumable and the streaming path."""
    source = _id_seven_twice(tmp_path / "in.jsonl")
    output = tmp_path / "out.jsonl"
    assert main(_args(source, output, "--part-size", "4")) == 0
    streamed = main(_args(source, "-"))
    assert streamed == 0
    for rows in (_rows(output), [json.loads(line) for line in capsys.readouterr().out.splitlines()]):
        assert [row["index"] for row in rows] == list(range(10))
        assert all(next(iter(row)) == "index" for row in rows)  # first, as embed's column is
        sevens = [row for row in rows if row["id"] == "7"]
        assert [row["index"] for row in sevens] == [3, 7]
        assert (
            "is not JSON" in sevens[1]["error"]["message"]
            and "is not JSON" not in sevens[0]["error"]["message"]
        )


def test_a_resume_writes_every_index_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume with a gap in its done-set (a middle part lost) extracts the gap's pages again and the
    merged output holds each input position once, in order, with the ids the input gives them."""
    source = _id_seven_twice(tmp_path / "in.jsonl")
    output = tmp_path / "out.jsonl"
    args = _args(source, output, "--part-size", "3")
    stop_before_merge(monkeypatch, args, "extract")
    parts = sorted((tmp_path / "out.jsonl.parts").glob("part-*.jsonl"))
    assert len(parts) == 4
    parts[1].unlink()  # indices 3..5: done again by the resume
    capsys.readouterr()
    assert main(args) == 0
    assert "10 pages, 10 failed" in capsys.readouterr().err
    rows = _rows(output)
    assert [row["index"] for row in rows] == list(range(10))
    assert [row["id"] for row in rows] == ["r0", "r1", "r2", "7", "r4", "r5", "r6", "7", "r8", "r9"]


def _bad_gzip_pages(site: Path, n: int) -> list[str]:
    """A directory of `n` pages that become error rows without an extractor (a gzip stream cut short)."""
    site.mkdir(exist_ok=True)
    for i in range(n):
        (site / f"p{i}.html.gz").write_bytes(b"\x1f\x8b\x08 truncated")
    return [f"p{i}.html.gz" for i in range(n)]


@pytest.mark.parametrize("name", ["out.jsonl", "out.html"])
def test_an_output_inside_the_input_directory_is_no_file_of_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The run's own parts directory (its lock, run.json, parts) and output were files of its input: the
    input's identity took their sizes and times, so a resume was refused as "input changed", and an
    output named like a page was read as one by the next run."""
    site = tmp_path / "site"
    ids = _bad_gzip_pages(site, 3)
    output = site / name
    args = _args(site, output, "--part-size", "1")
    for _ in range(2):  # the second time with the finished output in the directory
        stop_before_merge(monkeypatch, args, "extract")
        capsys.readouterr()
        assert main(args) == 0, capsys.readouterr().err
        assert "3 pages, 3 failed" in capsys.readouterr().err
        assert [row["id"] for row in _rows(output)] == ids
    assert sorted(p.name for p in site.iterdir()) == sorted([*ids, name])


def test_a_subdirectory_that_cannot_be_listed_is_an_input_unreadable_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its pages were missing from a run that ended with status 0 and said nothing. (Root lists any
    directory: `os.scandir` is patched.)"""
    site = tmp_path / "site"
    ids = _bad_gzip_pages(site, 2)
    (site / "private").mkdir()
    (site / "private" / "a.html").write_text("<p>a page</p>")
    unlistable_directory(monkeypatch, site / "private")
    output = tmp_path / "out.jsonl"
    assert main(_args(site, output)) == 0
    assert "3 pages, 3 failed" in capsys.readouterr().err
    rows = _rows(output)
    assert [row["id"] for row in rows] == [*ids, "private/"]
    assert rows[2]["error"]["code"] == "input_unreadable"
    assert "cannot list the directory" in rows[2]["error"]["message"]


def _warc_of_images() -> bytes:
    from tests.factories.warc import HttpResponse, response, warc_gz

    return warc_gz([response("png", HttpResponse(b"\x89PNG\r\n\x1a\n", "image/png"))])


# mtime=0: the bytes are the test's id, which every pytest-xdist process must collect alike.
EMPTY_GZIP = gzip.compress(b"", mtime=0)


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("empty.jsonl", b"", "no row: the file is empty or holds blank lines only"),
        ("blank.jsonl", b"\n  \n", "no row: the file is empty or holds blank lines only"),
        ("empty.jsonl.gz", EMPTY_GZIP, "no row: the file is empty or holds blank lines only"),
        ("empty.warc", b"", "no WARC record of an HTML response or resource"),
        ("empty.warc.gz", b"", "no WARC record of an HTML response or resource"),
        ("images.warc.gz", _warc_of_images(), "no WARC record of an HTML response or resource"),
        ("corpus/manifest.jsonl", b"", "its manifest manifest.jsonl has no row"),
    ],
)
def test_a_single_file_without_pages_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, why: str
) -> None:
    """As a directory without pages is: an empty output and exit 0 would pass for a finished run over a
    file that a failed copy left empty."""
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content)
    source = path.parent if name.endswith("manifest.jsonl") else path
    output = tmp_path / "results.jsonl"
    output.write_text(OLD)
    assert main(_args(source, output)) == 1
    assert capsys.readouterr().err == (
        f"htmllm extract: validation_error: page source {source} holds no pages: {why}\n"
    )
    assert output.read_text() == OLD and not (tmp_path / "results.jsonl.parts").exists()


def test_a_jsonl_file_in_utf16_is_one_line_not_a_phantom_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PowerShell's `>` writes UTF-16LE: its lines, split on the byte 0x0A, were two bad rows, the second
    one made of the newline's NUL byte."""
    source = tmp_path / "pages.jsonl"
    source.write_bytes((json.dumps({"id": "a", "html": "<p>a</p>"}) + "\r\n").encode("utf-16"))
    assert main(_args(source, tmp_path / "out.jsonl")) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(f"htmllm extract: validation_error: {source} is UTF-16LE text (")
        and err.count("\n") == 1
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl"]


def test_sigterm_keeps_what_was_finished_as_ctrl_c_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (Kubernetes', Slurm's) ended the run on the spot, status 143, its finished rows held for
    the next part lost. It ends as Ctrl-C does, with SIGTERM's status, less the rows from a failed row
    on (a worker killed by the same SIGTERM, sent to the process group, fails a page not for its own
    sake); SIGTERM's handler is given back."""
    import service.commands.extract as command
    import service.core.pages as pages_module
    from service.core.pages import Page

    source = _unreadable_rows(tmp_path / "in.jsonl", 5)  # its size and time: the input's identity
    ids = ["g0", "g1", "bad", "g3", "g4"]
    terminate = True

    def pages_then_sigterm(*_: object, **__: object) -> Iterator[Page]:
        yield from (Page(id=page_id, html=b"<p>a page</p>") for page_id in ids)
        if terminate:  # the window holds 2 pages: g0, g1 and bad have their rows
            signal.raise_signal(signal.SIGTERM)

    def extracted(index: int, page: Page, *_: object) -> dict[str, Any]:
        row: dict[str, Any] = {"index": index, "id": page.id, "url": None}
        if page.id == "bad":
            return {**row, "error": {"code": "extraction_failed", "message": "its worker was killed"}}
        return {**row, "text": "a page", "passed": False}

    monkeypatch.setattr(pages_module, "iter_pages", pages_then_sigterm)
    monkeypatch.setattr(command, "_process", extracted)
    output = tmp_path / "out.jsonl"
    args = _args(source, output, "--part-size", "10")
    with sigterm_given_back():
        assert main(args) == 143
    parts = tmp_path / "out.jsonl.parts"
    assert capsys.readouterr().err == (
        f"htmllm extract: terminated (SIGTERM); {output} was left as it was; what was finished is kept in "
        f"{parts}: run the same command again to go on\n"
    )
    (part,) = parts.glob("part-*.jsonl")
    assert [json.loads(line)["id"] for line in part.read_text().splitlines()[1:]] == ["g0", "g1"]
    terminate = False
    assert main(args) == 0
    assert "2 of them done by the interrupted run" in capsys.readouterr().err
    assert [row["id"] for row in _rows(output)] == ids


# --- an extractor process killed from outside (the OOM killer): not the page's failure ---

_KILLED = "the kernel picks the process extracting this page"
_KILLED_PAGE = (
    "<html><body><article>"
    + "".join(f"<p>Sentence {i} says that {_KILLED}, though nothing in it is wrong.</p>" for i in range(12))
    + "</article></body></html>"
)


def _timeless(value: Any) -> Any:
    """A row less every `elapsed_s`, nested ones included (an `all` row's extractions)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "elapsed_s"}
    return [_timeless(v) for v in value] if isinstance(value, list) else value


def _pages_with_one_killed(path: Path) -> Path:
    good = "<html><body><article><p>" + _RUSSIAN * 10 + "</p></article></body></html>"
    rows = [("a", good), ("killed", _KILLED_PAGE), ("c", good)]
    path.write_text("".join(json.dumps({"id": i, "html": html}) + "\n" for i, html in rows))
    return path


def test_a_page_whose_extractor_process_is_killed_from_outside_is_extracted_in_a_fresh_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its resiliparse attempt was `extraction_failed` ("died (exit code -9)") and the union took
    trafilatura's text: the row depended on the OOM killer, and was done for good."""
    from service.core.extract.pool import LOST_WORKER_RETRIES
    from tests.factories.worker_kills import kill_workers_holding

    source = _pages_with_one_killed(tmp_path / "pages.jsonl")
    clean, out = tmp_path / "clean.jsonl", tmp_path / "out.jsonl"
    assert main(_args(source, clean)) == 0
    with monkeypatch.context() as patch:
        killed = kill_workers_holding(patch, _KILLED.encode(), kills=LOST_WORKER_RETRIES)
        assert main(_args(source, out)) == 0
    assert len(set(killed)) == LOST_WORKER_RETRIES
    assert "3 pages, 0 failed" in capsys.readouterr().err
    assert _timeless(_rows(out)) == _timeless(_rows(clean))


@pytest.mark.parametrize("extractor", ["union", "all"])
def test_a_page_whose_extractor_process_is_killed_in_every_try_is_left_for_the_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, extractor: str
) -> None:
    """As `htmllm embed` leaves such a page: not written (it was a permanent `extraction_failed` row, or
    the union's next extractor's text), exit 1 without merging, and the resume extracts it."""
    from service.core.extract.pool import LOST_WORKER_RETRIES
    from tests.factories.worker_kills import kill_workers_holding

    source = _pages_with_one_killed(tmp_path / "pages.jsonl")
    clean, out = tmp_path / "clean.jsonl", tmp_path / "out.jsonl"
    args = _args(source, out, "--part-size", "1", "--extractor", extractor)
    assert main(_args(source, clean, "--extractor", extractor)) == 0
    capsys.readouterr()
    with monkeypatch.context() as patch:
        killed = kill_workers_holding(patch, _KILLED.encode(), kills=LOST_WORKER_RETRIES + 1)
        assert main(args) == 1
    assert len(set(killed)) == LOST_WORKER_RETRIES + 1
    parts = tmp_path / "out.jsonl.parts"
    err = capsys.readouterr().err
    assert err.startswith(
        "htmllm extract: 1 pages were left for the next run (1 not_ready; first: not_ready: resiliparse did "
        "not run on this page: its extractor worker was killed from outside"
    ), err
    assert err.endswith(
        f"try it again later); {out} was not written, what was finished is kept in {parts}: run the same "
        "command again to extract them\n"
    )
    assert err.count("\n") == 1 and not out.exists()
    written = [json.loads(p.read_text().splitlines()[1]) for p in parts.glob("part-*.jsonl")]
    assert sorted(row["index"] for row in written) == [0, 2]

    assert main(args) == 0  # the resume extracts it
    assert "3 pages, 0 failed" in capsys.readouterr().err
    assert _timeless(_rows(out)) == _timeless(_rows(clean))


def test_a_streamed_page_whose_extractor_process_is_killed_in_every_try_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Standard output cannot be resumed: the page's row holds the retryable `not_ready`, which the
    summary does not count as a failed page, and the run exits 1."""
    from service.core.extract.pool import LOST_WORKER_RETRIES
    from tests.factories.worker_kills import kill_workers_holding

    source = _pages_with_one_killed(tmp_path / "pages.jsonl")
    with monkeypatch.context() as patch:
        kill_workers_holding(patch, _KILLED.encode(), kills=LOST_WORKER_RETRIES + 1)
        assert main(_args(source, "-")) == 1
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2] and "text" in rows[0] and "text" in rows[2]
    assert rows[1]["error"]["code"] == "not_ready" and "killed from outside" in rows[1]["error"]["message"]
    assert "htmllm extract: 3 pages, 0 failed" in captured.err
    assert "htmllm extract: 1 pages were not extracted (1 not_ready; first: not_ready: " in captured.err
    assert captured.err.endswith("): their rows hold that error; run the command again to extract them\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl"]


def test_overwrite_discards_an_interrupted_run_of_other_settings_as_embed_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal says "or pass --overwrite": with it the interrupted run's parts go, said in one line,
    and this run starts over (it had been refused all the same, where `htmllm embed` starts over)."""
    source = _unreadable_rows(tmp_path / "in.jsonl", 5)
    output = tmp_path / "results.jsonl"
    args = _args(source, output, "--part-size", "2")
    stop_before_merge(monkeypatch, args, "extract")
    parts = tmp_path / "results.jsonl.parts"
    assert parts.is_dir()
    capsys.readouterr()
    assert main([*args, "--min-words", "10", "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "htmllm extract: --overwrite: " in err and "other settings (min_words 50 -> 10)" in err, err
    assert "done by the interrupted run" not in err
    assert len(_rows(output)) == 5 and not parts.exists()
