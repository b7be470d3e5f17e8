"""`htmllm extract`: an existing output survives a typo, a crash and an output that is the input."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli import main

OLD = "the previous run's rows\n"


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


def test_an_unwritable_output_names_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "missing-dir" / "results.jsonl"
    assert _extract(_unreadable_rows(tmp_path / "in.jsonl", 1), output) == 1
    assert capsys.readouterr().err == f"htmllm extract: cannot write {output}: No such file or directory\n"


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
