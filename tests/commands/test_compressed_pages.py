"""`htmllm embed`, `htmllm extract` and `htmllm prune` on a page still compressed once the reader has
undone what is declared or expected (a WARC body's Content-Encoding, a page file's one gzip): the page's
error row with code `unsupported_media_type`, as the API refuses such a body, where binary noise had been
embedded (and its "text" extracted) as a normal row, error null, status 0."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import zstandard

from service.cli import main
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.pages import make_pages
from tests.factories.warc import HttpResponse, response, warc_gz

PAGE = make_pages(1, seed=3, min_words=60, max_words=80)[0].encode()
REFUSED = "unsupported_media_type"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("compressed") / "tiny")


def _warc(path: Path) -> Path:
    """A page, its gzip declared, its gzip undeclared, its zstd undeclared, and gzip twice under one
    `Content-Encoding: gzip`."""
    gzipped = {"Content-Encoding": "gzip"}
    records = [
        response("plain", HttpResponse(PAGE)),
        response("declared", HttpResponse(gzip.compress(PAGE), headers=gzipped)),
        response("gzip", HttpResponse(gzip.compress(PAGE))),
        response("zstd", HttpResponse(zstandard.ZstdCompressor().compress(PAGE))),
        response("twice", HttpResponse(gzip.compress(gzip.compress(PAGE)), headers=gzipped)),
    ]
    path.write_bytes(warc_gz(records))
    return path


WARC_ERRORS = [None, None, REFUSED, REFUSED, REFUSED]


def _directory(path: Path) -> Path:
    """A page, its gzip file, a zlib file and gzip inside gzip."""
    path.mkdir()
    (path / "a.html").write_bytes(PAGE)
    (path / "b.html.gz").write_bytes(gzip.compress(PAGE))
    (path / "c.html").write_bytes(zlib.compress(PAGE))
    (path / "d.html.gz").write_bytes(gzip.compress(gzip.compress(PAGE)))
    return path


DIRECTORY_ERRORS = [None, None, REFUSED, REFUSED]


def _embed(checkpoint: Path, source: Path, output: Path) -> list[dict[str, Any]]:
    args = ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1"]  # fmt: skip
    assert main(args) == 0
    rows: list[dict[str, Any]] = pq.read_table(output).to_pylist()
    return rows


def _extract(source: Path, output: Path) -> list[dict[str, Any]]:
    args = ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress"]
    assert main(args) == 0
    return [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(("make", "errors"), [(_warc, WARC_ERRORS), (_directory, DIRECTORY_ERRORS)])
def test_embed_refuses_a_page_still_compressed(
    checkpoint: Path, tmp_path: Path, make: Any, errors: list[str | None]
) -> None:
    source = make(tmp_path / ("crawl.warc.gz" if make is _warc else "pages"))
    rows = _embed(checkpoint, source, tmp_path / "out.parquet")
    assert [row["error"] for row in rows] == errors
    for row in rows:
        assert (row["embedding"] is None) == (row["error"] is not None)
    # Every page whose bytes read as the page is embedded alike: the noise had been a vector of its own.
    good = [row["embedding"] for row in rows if row["error"] is None]
    assert all(embedding == good[0] for embedding in good)
    messages = [row["error_message"] for row in rows if row["error"] is not None]
    assert all("-compressed" in message for message in messages), messages


@pytest.mark.parametrize(("make", "errors"), [(_warc, WARC_ERRORS), (_directory, DIRECTORY_ERRORS)])
def test_extract_refuses_a_page_still_compressed(tmp_path: Path, make: Any, errors: list[str | None]) -> None:
    source = make(tmp_path / ("crawl.warc.gz" if make is _warc else "pages"))
    rows = _extract(source, tmp_path / "texts.jsonl")
    assert [row["error"]["code"] if "error" in row else None for row in rows] == errors
    assert all("text" not in row for row in rows if "error" in row)
    if make is _warc:
        said = rows[2]["error"]["message"]
        assert "the HTTP body is gzip-compressed but its Content-Encoding does not say so" in said
    else:
        assert "the file holds zlib-compressed bytes" in rows[2]["error"]["message"]


def test_prune_refuses_a_file_still_compressed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "page.html"
    page.write_bytes(zstandard.ZstdCompressor().compress(PAGE))
    assert main(["prune", str(page)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{REFUSED}: " in captured.err and "the file holds zstd-compressed bytes" in captured.err
