"""A directory of pages holding files the reader passes over by their names (`.xhtml`, `.php`, no suffix):
`htmllm extract` and `htmllm embed` count them in their summary, with their names, where they had been
left out of a run that looked complete."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from service.cli import main
from service.commands.resume_state import unread_files_note
from tests.factories.checkpoint import build_tiny_checkpoint

PAGE = "<html><body><p>A page of a mirrored site, with a few words in it.</p></body></html>"


def _mirror(directory: Path) -> Path:
    """A site as `wget -m` leaves it: one `.html` page, pages under other names, and files no page is
    named as (a stylesheet, an image, a dot file), which go unmentioned."""
    for name in (
        "about.html", "feed.xhtml", "index.php", "sub/index", "sub/notes.jsonl", "sub/more.aspx",
        "style.css", "logo.png", ".listing", ".git/config.php", ".git/HEAD",
    ):  # fmt: skip
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(PAGE)
    # Without a suffix, a page begins as one; a README or LICENSE does not.
    (directory / "README").write_text("A mirror of a site, made with wget.\n")
    (directory / "LICENSE").write_text("MIT license." + " " * 2000 + "<html> past the first KiB")
    return directory


def test_extract_counts_the_files_it_did_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _mirror(tmp_path / "site")
    output = source / "out.jsonl"  # the run's own output, in the directory: no file of it
    args = ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    assert main(args) == 0
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == ["about.html"]
    (summary,) = capsys.readouterr().err.splitlines()
    assert summary.startswith("htmllm extract: 1 pages, ")
    assert summary.endswith(
        f"; 5 files of {source} that may be pages were not read, their names ending in none of .html, .htm "
        "(optionally .gz) and the WARC suffixes (feed.xhtml, index.php, sub/index, ...): rename those that "
        "are pages; JSONL files are read one at a time, each as the input"
    ), summary


def test_extract_says_nothing_of_a_directory_whose_every_file_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "a.html").write_text(PAGE)
    args = ["extract", "--input", str(tmp_path / "site"), "--output", "-", "--workers", "1", "--no-progress"]
    assert main(args) == 0
    assert "not read" not in capsys.readouterr().err


def test_embed_counts_the_files_it_did_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    source = _mirror(tmp_path / "site")
    output = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1"]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.endswith(
        f"wrote 1 documents to {output}: 0 resumed from earlier runs, 1 embedded this run (0 failed); "
        f"5 files of {source} that may be pages were not read, their names ending in none of .html, .htm "
        "(optionally .gz) and the WARC suffixes (feed.xhtml, index.php, sub/index, ...): rename those that "
        "are pages; JSONL files are read one at a time, each as the input\n"
    ), err


def test_gzipped_pages_under_other_names_are_told_to_be_renamed(tmp_path: Path) -> None:
    """`page.php.gz` is gzip, which the reader reads: it needs a name, not "recompress" as a page
    compressed with zstd does (its name says gzip and its bytes are not, `fake.htm.gz`, is compressed
    otherwise)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "a.html").write_text(PAGE)
    for name in ("about.xhtml.gz", "b.htm.gzip", "page.php.gz"):
        (site / name).write_bytes(gzip.compress(PAGE.encode()))
    assert unread_files_note(site, None) == (
        f"; 3 files of {site} that may be pages were not read, their names ending in none of .html, .htm "
        "(optionally .gz) and the WARC suffixes (about.xhtml.gz, b.htm.gzip, page.php.gz): rename those "
        "that are pages"
    )
    (site / "c.html.zst").write_bytes(b"\x28\xb5\x2f\xfd not read")
    (site / "fake.php.gz").write_bytes(b"\x28\xb5\x2f\xfd not gzip")
    assert unread_files_note(site, None).endswith(
        "(about.xhtml.gz, b.htm.gzip, c.html.zst, ...): rename those that are pages; gzip is the one "
        "compression read (a WARC's zstd and LZ4 besides): recompress the others"
    )


def test_a_link_back_up_is_not_told_of_as_a_directory_read_already(tmp_path: Path) -> None:
    """`real/up -> ..` is a cycle, skipped as it always was: every run's summary had told of it."""
    site = tmp_path / "site"
    (site / "real").mkdir(parents=True)
    (site / "real" / "p.html").write_text(PAGE)
    os.symlink("..", site / "real" / "up")
    assert unread_files_note(site, None) == ""
    os.symlink("real", site / "mirror")  # a second way to `real`: told of
    assert unread_files_note(site, None) == (
        f"; 1 symlinks in {site} lead to directories read already (mirror): not followed again, each "
        "directory's pages were read once"
    )
