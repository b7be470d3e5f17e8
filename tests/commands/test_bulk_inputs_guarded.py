"""`htmllm extract` and `htmllm embed` over inputs the reader had crashed on or misread in silence: a
JSONL row nested too deep (the run, and every resume of it, had ended in a traceback), a JSONL file
compressed under a plain name, a corpus directory whose manifest is not usable, and the notes a run
over a directory of pages ends with (files it did not read, manifests it did not use, symlinks to
directories read already)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from service.cli import main
from service.commands.resume_state import input_identity
from service.core.page_jsonl import MAX_ROW_DEPTH, NESTED_TOO_DEEP
from tests.factories.checkpoint import build_tiny_checkpoint

PAGE = "<html><body><p>A page of a site, with a few words in it.</p></body></html>"
DEEP = 100_000  # far past any recursion limit


def _deep_jsonl(path: Path) -> Path:
    """Rows: a page, one nested too deep, a page whose metadata nests as deep as a row may."""
    deep = '{"id": "deep", "html": "x", "m": ' + "[" * DEEP + "]" * DEEP + "}"
    most = MAX_ROW_DEPTH - 1  # `m`'s, in a row one deeper
    deepest = json.dumps({"id": "c", "html": PAGE})[:-1] + ', "m": ' + "[" * most + "]" * most + "}"
    rows = [json.dumps({"id": "a", "html": PAGE}), deep, deepest]
    path.write_text("\n".join(rows) + "\n")
    return path


def _extract(source: Path, output: Path | str, *extra: str) -> int:
    args = ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    return main([*args, "--min-words", "1", *extra])


def _rows(output: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def test_extract_writes_a_row_nested_too_deep_as_its_error_and_resumes_past_it(tmp_path: Path) -> None:
    source, output = _deep_jsonl(tmp_path / "pages.jsonl"), tmp_path / "out.jsonl"
    assert _extract(source, output, "--limit", "1") == 0  # a first run, then its continuation
    assert _extract(source, output) == 0
    rows = _rows(output)
    assert [(row["index"], row["id"]) for row in rows] == [(0, "a"), (1, "1"), (2, "c")]
    assert rows[1]["error"] == {
        "code": "validation_error",
        "message": f"{source}: line 2 {NESTED_TOO_DEEP}",
    }
    assert rows[2].get("error") is None  # as deep as a row may be: read, and written


def test_embed_writes_a_row_nested_too_deep_as_its_error(tmp_path: Path) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    source, output = _deep_jsonl(tmp_path / "pages.jsonl"), tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1"]  # fmt: skip
    assert main(args) == 0
    rows = pq.read_table(output, columns=["index", "id", "error", "error_message"]).to_pylist()
    assert [(row["id"], row["error"]) for row in rows] == [
        ("a", None),
        ("1", "validation_error"),
        ("c", None),
    ]
    assert rows[1]["error_message"].endswith(NESTED_TOO_DEEP)


def test_extract_refuses_a_zstd_file_named_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "pages.jsonl"
    rows = "".join(json.dumps({"id": f"p{i}", "html": PAGE}) + "\n" for i in range(100))
    source.write_bytes(zstandard.ZstdCompressor().compress(rows.encode()))
    assert _extract(source, tmp_path / "out.jsonl") == 1  # not one garbage row per 0x0A byte, and 0
    err = capsys.readouterr().err
    assert err.startswith(f"htmllm extract: unsupported_media_type: {source} is compressed with zstd"), err
    assert not (tmp_path / "out.jsonl").exists()


def _corpus(directory: Path) -> Path:
    (directory / "pages").mkdir(parents=True)
    for i in range(2):
        (directory / "pages" / f"{i}.html.gz").write_bytes(gzip.compress(PAGE.encode()))
    return directory


def _manifest_rows() -> bytes:
    rows = [{"id": f"doc-{i}", "url": f"https://site/{i}", "file": f"pages/{i}.html.gz"} for i in range(2)]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_extract_refuses_a_corpus_whose_manifest_is_a_dangling_symlink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _corpus(tmp_path / "corpus")
    os.symlink("/mnt/not-synced/manifest.jsonl", corpus / "manifest.jsonl")
    assert _extract(corpus, "-") == 1  # where its pages had been read as a directory's, named by path
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"htmllm extract: input_unreadable: page source {corpus} cannot be read: its manifest "
        f"{corpus}/manifest.jsonl is a symlink to /mnt/not-synced/manifest.jsonl, which is gone\n"
    )


def test_extract_reads_a_gzipped_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "manifest.jsonl.gz").write_bytes(gzip.compress(_manifest_rows()))
    assert _extract(corpus, "-") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["id"], row["url"]) for row in rows] == [
        ("doc-0", "https://site/0"),
        ("doc-1", "https://site/1"),
    ]


def test_extract_says_a_manifest_by_another_name_was_not_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "MANIFEST.jsonl").write_bytes(_manifest_rows())
    assert _extract(corpus, "-") == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["id"] for line in captured.out.splitlines()] == [
        "pages/0.html.gz",
        "pages/1.html.gz",
    ]
    assert captured.err.endswith(
        f"; {corpus} was read as a directory of pages: MANIFEST.jsonl was not used as its manifest, which is "
        "named manifest.jsonl (or manifest.jsonl.gz)\n"
    ), captured.err


def test_extract_counts_compressed_pages_arc_and_jsonl_files_it_did_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "a.html").write_text(PAGE)
    for name in ("b.html.zst", "c.htm.gzip", "d.html.br", "crawl.arc.gz", "crawl.warc.bz2", "shard.jsonl",
                 "shard.jsonl.zst", "style.css.gz", "backup.tar.gz"):  # fmt: skip
        (site / name).write_bytes(b"\x28\xb5\x2f\xfd not read")
    assert _extract(site, "-") == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["id"] for line in captured.out.splitlines()] == ["a.html"]
    assert captured.err.endswith(
        f"; 7 files of {site} that may be pages were not read, their names ending in none of .html, .htm "
        "(optionally .gz) and the WARC suffixes (b.html.zst, c.htm.gzip, crawl.arc.gz, ...): gzip is the one "
        "compression read (a WARC's zstd and LZ4 besides): recompress the others; ARC files are not read: "
        "convert them to WARC; JSONL files are read one at a time, each as the input\n"
    ), captured.err


def test_extract_reads_each_directory_once_and_says_which_links_it_did_not_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site"
    (site / "pages").mkdir(parents=True)
    (site / "pages" / "p.html").write_text(PAGE)
    os.symlink("pages", site / "mirror")
    os.symlink("pages", site / "also")
    assert _extract(site, "-") == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["id"] for line in captured.out.splitlines()] == ["pages/p.html"]
    assert captured.err.endswith(
        f"; 2 symlinks in {site} lead to directories read already (also, mirror): not followed again, each "
        "directory's pages were read once\n"
    ), captured.err


def test_embed_passes_over_mac_resource_forks(tmp_path: Path) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    site = tmp_path / "site"
    (site / "__MACOSX").mkdir(parents=True)
    (site / "a.html").write_text(PAGE)
    for fork in (site / "._a.html", site / "__MACOSX" / "._a.html"):
        fork.write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02\x00\x00\x00\x09")
    output = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(checkpoint), "--input", str(site), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1"]  # fmt: skip
    assert main(args) == 0
    assert pq.read_table(output, columns=["id"]).column("id").to_pylist() == ["a.html"]


def test_a_resume_over_a_directory_is_not_refused_for_a_hidden_file_changed(tmp_path: Path) -> None:
    """Hidden files are no part of the directory, its pages or its identity: Finder rewriting `.DS_Store`
    between a run and its resume had refused the resume as "input changed"."""
    site = tmp_path / "site"
    site.mkdir()
    for i in range(3):
        (site / f"{i}.html").write_text(PAGE)
    (site / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    output = tmp_path / "out.jsonl"
    pinned = input_identity(site, output)
    assert _extract(site, output, "--limit", "2") == 0
    (site / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1 rewritten by Finder")
    assert input_identity(site, output) == pinned
    assert _extract(site, output) == 0
    assert [row["id"] for row in _rows(output)] == ["0.html", "1.html", "2.html"]
