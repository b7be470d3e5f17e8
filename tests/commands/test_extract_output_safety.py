"""`htmllm extract --output`: what the run would replace is refused when it is not the run's own to
replace (a page file of the input, another tool's file), and its own earlier output is replaced as ever."""

from __future__ import annotations

import errno
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from service.cli import main

# A row as this command writes it: what an earlier run's output starts with.
EARLIER = (
    json.dumps({"index": 0, "id": "old", "url": None, "error": {"code": "validation_error", "message": "x"}})
    + "\n"
)


def _args(source: Path, output: Path, *options: str) -> list[str]:
    return ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            *options]  # fmt: skip


def _error_rows(path: Path, n: int) -> Path:
    """Rows with neither `html` nor `file`: error rows, so a run needs no extractor process."""
    path.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(n)))
    return path


def _tree(top: Path) -> dict[str, bytes]:
    """Every file under `top` with its bytes: a refused run must leave all of them as they were."""
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def test_a_page_file_of_a_directory_input_is_refused_however_it_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--input ow --output ow/a12_normal.html` said "2 pages" (the page left out as the run's own
    output) and then wrote its rows over the page, exit code 0."""
    site = tmp_path / "ow"
    (site / "sub").mkdir(parents=True)
    (site / "a12_normal.html").write_text("<html><body><p>a page of the input</p></body></html>")
    (site / "b.html").write_text("<html><body><p>another</p></body></html>")
    (site / "sub" / "c.htm").write_text("<html><body><p>a third</p></body></html>")
    (tmp_path / "link.html").symlink_to(site / "sub" / "c.htm")
    (tmp_path / "hard.html").hardlink_to(site / "b.html")
    before = _tree(tmp_path)
    for output, page in [
        (site / "a12_normal.html", site / "a12_normal.html"),
        (tmp_path / "link.html", site / "sub" / "c.htm"),  # through a symlink
        (tmp_path / "hard.html", site / "b.html"),  # a hard link
    ]:
        for options in ([], ["--overwrite"]):  # never a file to replace
            assert main(_args(site, output, *options)) == 2, (output, options)
            assert capsys.readouterr().err == (
                f"htmllm extract: validation_error: --output {output} is the input's page file {page}: the "
                "run would replace it with its rows\n"
            )
    assert _tree(tmp_path) == before  # nothing written, nothing locked (no parts directory)


def test_a_page_file_a_corpus_manifest_names_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--input mc --output mc/pages/p0002.html.gz` read the page, then replaced it with rows."""
    corpus = tmp_path / "mc"
    (corpus / "pages").mkdir(parents=True)
    rows = []
    for i in range(5):
        name = f"pages/p{i:04d}.html.gz"
        (corpus / name).write_bytes(gzip.compress(f"<html><body><p>page {i}</p></body></html>".encode()))
        rows.append({"id": f"p{i}", "file": name})
    (corpus / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = _tree(tmp_path)
    output = corpus / "pages" / "p0002.html.gz"
    for options in ([], ["--overwrite"]):
        assert main(_args(corpus, output, *options)) == 2
        assert capsys.readouterr().err == (
            f"htmllm extract: validation_error: --output {output} is the input's page file {output}: the "
            "run would replace it with its rows\n"
        )
    assert _tree(tmp_path) == before


def test_another_file_is_replaced_only_with_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--output precious.txt` overwrote the user's notes without a word; `htmllm embed` refuses such a
    file unless --overwrite, and so does this command now, with the same words. A JSONL file of texts
    with `id`, `url` and `text` is no output of it either: its rows start with `index`."""
    source = _error_rows(tmp_path / "in.jsonl", 2)
    for name, content in [
        ("precious.txt", "my notes\n"),
        ("texts.jsonl", json.dumps({"id": "a", "url": None, "text": "curated"}) + "\n"),
    ]:
        output = tmp_path / name
        output.write_text(content)
        assert main(_args(source, output)) == 2
        assert capsys.readouterr().err == (
            f"htmllm extract: validation_error: {output} was not written by htmllm extract (its first line "
            "is not a row of it); pass --overwrite to replace it\n"
        )
        assert output.read_text() == content
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.jsonl", name])
        assert main(_args(source, output, "--overwrite")) == 0
        assert "htmllm extract: 2 pages, 2 failed" in capsys.readouterr().err
        assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == ["r0", "r1"]
        output.unlink()


def test_its_own_earlier_output_and_an_empty_file_are_replaced_without_overwrite(tmp_path: Path) -> None:
    """As the docs say a run does: a JSONL output records nothing of how it was made, so it is made again."""
    source = _error_rows(tmp_path / "in.jsonl", 3)
    output = tmp_path / "out.jsonl"
    for content in (EARLIER, "", None):  # None: the output the run before this one wrote
        if content is not None:
            output.write_text(content)
        assert main(_args(source, output)) == 0
        assert [json.loads(line)["index"] for line in output.read_text().splitlines()] == [0, 1, 2]
    # A run filtered with grep or jq still starts with one of the command's rows.
    output.write_text(EARLIER.replace('"index": 0', '"index": 41'))
    assert main(_args(source, output)) == 0


def test_an_output_that_cannot_be_read_is_said_so_and_replaced_only_with_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the command wrote it is unknown: never taken for its own. (Root reads a chmod 000 file:
    opening it is patched.)"""
    source = _error_rows(tmp_path / "in.jsonl", 2)
    output = tmp_path / "out.jsonl"
    output.write_text(EARLIER)
    real_open = Path.open

    def closed(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == output and args[:1] == ("rb",):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "open", closed)
        assert main(_args(source, output)) == 2
        assert capsys.readouterr().err == (
            f"htmllm extract: validation_error: {output} exists but cannot be read (Permission denied), so "
            "this run cannot tell whether htmllm extract wrote it: make it readable, or pass --overwrite to "
            "replace it unread\n"
        )
        assert output.read_text() == EARLIER
        assert main(_args(source, output, "--overwrite")) == 0
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == ["r0", "r1"]


def test_an_input_that_does_not_exist_is_said_before_a_file_it_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The input's failure is the one the reader gives (exit code 1), as with no output there."""
    output = tmp_path / "notes.txt"
    output.write_text("my notes\n")
    assert main(_args(tmp_path / "typo.jsonl", output)) == 1
    assert capsys.readouterr().err == (
        f"htmllm extract: validation_error: page source {tmp_path / 'typo.jsonl'} does not exist\n"
    )
    assert output.read_text() == "my notes\n"
