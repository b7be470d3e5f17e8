"""Bulk inputs `pages` had crashed on or misread in silence: a JSONL row nested too deep, a row's `file`
that is a WARC or JSONL file, a compressed JSONL file under a plain name, a corpus directory whose
manifest is not usable, a directory walk through a ladder of symlinks, macOS resource forks, a `url` of
the wrong type."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from pathlib import Path

import pytest
import zstandard

from service.core.errors import ErrorCode
from service.core.page_jsonl import MAX_ROW_DEPTH, NESTED_TOO_DEEP
from service.core.pages import (
    PageCompressedError,
    PageSourceError,
    PageUnreadableError,
    iter_pages,
    list_directory,
    named_files,
    source_kind,
    unused_manifests,
)
from tests.factories.warc import HttpResponse, response, warc_gz

PAGE = "<html><body><p>A page with a few words in it.</p></body></html>"
# Far past any recursion limit, wherever the reader is called from.
DEEP = 100_000


def _jsonl(path: Path, *rows: dict[str, object] | str) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def _deep_row(depth: int = DEEP, **fields: str) -> str:
    """A row of `fields` and a field `m` of arrays `depth` deep (the row `depth` + 1)."""
    return json.dumps(fields)[:-1] + ', "m": ' + "[" * depth + "]" * depth + "}"


def test_a_row_nested_too_deep_is_its_error_row(tmp_path: Path) -> None:
    source = _jsonl(
        tmp_path / "pages.jsonl", {"id": "a", "html": PAGE}, _deep_row(id="b", html=PAGE), {"html": PAGE}
    )
    pages = list(iter_pages(source, bad_rows="report"))
    assert [(p.id, p.error_code if p.error else None) for p in pages] == [
        ("a", None),
        ("1", ErrorCode.VALIDATION),  # not read far enough for its id: named by its position
        ("2", None),
    ]
    assert pages[1].error == f"{source}: line 2 {NESTED_TOO_DEEP}"
    assert NESTED_TOO_DEEP == "nests arrays and objects more than 200 deep (the limit for a row)"
    with pytest.raises(PageSourceError, match="more than 200 deep"):
        list(iter_pages(source))  # the default stops, with the row's error, not a RecursionError


def _read_below(frames: int, source: Path) -> list[tuple[str, str | None]]:
    """The pages of `source` read by a caller `frames` calls deep."""
    if frames:
        return _read_below(frames - 1, source)
    return [(page.id, page.error) for page in iter_pages(source, bad_rows="report")]


def test_how_deep_a_row_may_nest_does_not_depend_on_the_caller(tmp_path: Path) -> None:
    """Where the recursion limit struck had decided it: a row 301 deep was read from a shallow caller
    and an error from one 300 calls deeper, and said "is not JSON" of JSON. `MAX_ROW_DEPTH` is the rule,
    checked without recursion, and a row past it is named by its position from every caller."""
    depths = (MAX_ROW_DEPTH - 1, MAX_ROW_DEPTH, 300, 5_000, DEEP)  # `m`'s: the row is one deeper
    source = _jsonl(
        tmp_path / "pages.jsonl", *(_deep_row(depth, id=f"d{depth}", html=PAGE) for depth in depths)
    )
    too_deep = [f"{source}: line {line} {NESTED_TOO_DEEP}" for line in range(1, len(depths) + 1)]
    expected = [
        (f"d{MAX_ROW_DEPTH - 1}", None),
        ("1", too_deep[1]),
        ("2", too_deep[2]),
        ("3", too_deep[3]),
        ("4", too_deep[4]),
    ]
    assert _read_below(0, source) == expected
    assert _read_below(300, source) == expected


def test_a_deep_row_naming_a_file_names_nothing(tmp_path: Path) -> None:
    """The input identity's walk over the rows' files (`named_files`) parses such a row too."""
    (tmp_path / "a.html").write_text(PAGE)
    source = _jsonl(tmp_path / "pages.jsonl", _deep_row(file="b.html"), {"file": "a.html"})
    assert [name for name, _ in named_files(source)] == ["a.html"]


def test_a_url_of_another_type_is_an_error_row(tmp_path: Path) -> None:
    source = _jsonl(
        tmp_path / "pages.jsonl",
        {"id": "a", "url": 12345, "html": PAGE},
        {"id": "b", "url": ["https://example.com/"], "html": PAGE},
        {"id": "c", "url": None, "html": PAGE},
        {"id": "d", "url": "", "html": PAGE},
    )
    pages = list(iter_pages(source, bad_rows="report"))
    assert [(p.id, p.url, p.error) for p in pages] == [
        ("a", None, f"{source}: line 1: 'url' must be a string, not a number"),
        ("b", None, f"{source}: line 2: 'url' must be a string, not an array"),
        ("c", None, None),
        ("d", "", None),
    ]


def _warc() -> bytes:
    return warc_gz([response(f"r{i}", HttpResponse(b"<p>x</p>")) for i in range(3)])


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("crawl.warc.gz", _warc(), "a WARC file (by its name)"),
        ("CRAWL.WARC", gzip.decompress(_warc()), "a WARC file (by its name)"),
        ("crawl", _warc(), "a WARC file (by its content)"),  # gunzipped, it starts with WARC/
        ("shard.jsonl", json.dumps({"html": PAGE}).encode(), "a JSONL file (by its name)"),
        ("shard.dat", gzip.compress(json.dumps({"html": PAGE}).encode()), "a JSONL file (by its content)"),
    ],
    ids=["warc.gz", "warc upper case", "warc by content", "jsonl", "jsonl by content"],
)
def test_a_row_naming_a_page_source_is_an_error_row(
    tmp_path: Path, name: str, content: bytes, said: str
) -> None:
    (tmp_path / name).write_bytes(content)
    (tmp_path / "page").write_text(PAGE)  # a name that says nothing and an HTML start: the row's page
    source = _jsonl(tmp_path / "pages.jsonl", {"id": "w", "file": name}, {"id": "p", "file": "page"})
    pages = list(iter_pages(source, bad_rows="report"))
    assert [(p.id, p.html) for p in pages] == [("w", b""), ("p", PAGE.encode())]
    assert pages[0].error_code == ErrorCode.VALIDATION
    assert pages[0].error == (
        f"{source}: line 1 names {tmp_path / name}, {said}, not a page: a row's file is one HTML page; "
        f"pass the {said.split()[1]} file as the input itself"
    )


# Pages whose start looks like a page source's and is not: a row naming one reads it. (The rule had been
# a start of `{` or `WARC/`, as for a single file named as the input.)
PAGES_LIKE_SOURCES = {
    "template": b"{{ header }}\n<html><body><p>A template's page.</p></body></html>",
    "prose": b"WARC/ is a format. <p>A page about it.</p>",
    "no line end": b"WARC/1.0 is the first version. <p>A page about it.</p>",
    "json then html": b'{"a": 1}<html><body><p>A page after a JSON object.</p></body></html>',
    "json array": b"[1, 2]\n<p>A page after a JSON array.</p>",
}


@pytest.mark.parametrize("content", list(PAGES_LIKE_SOURCES.values()), ids=list(PAGES_LIKE_SOURCES))
def test_a_row_naming_a_page_that_starts_like_a_source_reads_it(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "page").write_bytes(content)
    source = _jsonl(tmp_path / "pages.jsonl", {"id": "p", "file": "page"})
    assert [(p.id, p.html, p.error) for p in iter_pages(source, bad_rows="report")] == [("p", content, None)]


@pytest.mark.parametrize(
    "content",
    [
        b"WARC/1.0\r\nWARC-Type: warcinfo\r\n\r\n",
        b"WARC/1.1\nWARC-Type: warcinfo\n\n",
        b'\xef\xbb\xbf\n \r\n{"html": "<p>x</p>"}\n{"html": "<p>y</p>"}\n',
        b'{"a": 1}\n<p>A page after a JSON object on its line.</p>',
    ],
    ids=["warc/1.0", "warc/1.1 lf", "jsonl after a bom and blank lines", "json object line"],
)
def test_a_row_naming_a_file_that_starts_as_a_source_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "page").write_bytes(content)
    source = _jsonl(tmp_path / "pages.jsonl", {"id": "p", "file": "page"})
    [page] = iter_pages(source, bad_rows="report")
    assert page.error is not None and "not a page" in page.error and "(by its content)" in page.error


def _compressed(kind: str, data: bytes) -> bytes:
    if kind == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    if kind == "bzip2":
        return bz2.compress(data)
    if kind == "xz":
        return lzma.compress(data)
    return gzip.compress(zstandard.ZstdCompressor().compress(data), mtime=0)  # zstd in gzip


@pytest.mark.parametrize("kind", ["zstd", "bzip2", "xz", "gzipped zstd"], ids=lambda kind: kind)
def test_a_jsonl_file_compressed_under_a_plain_name_is_refused_whole(tmp_path: Path, kind: str) -> None:
    rows = "".join(json.dumps({"id": f"p{i}", "html": PAGE}) + "\n" for i in range(200)).encode()
    source = tmp_path / ("pages.jsonl.gz" if kind.startswith("gzipped") else "pages.jsonl")
    source.write_bytes(_compressed(kind, rows))
    named = kind.removeprefix("gzipped ")
    with pytest.raises(PageCompressedError, match=f"is compressed with {named} \\(by its first bytes"):
        next(iter_pages(source, bad_rows="report"))  # where each 0x0A had made one garbage row


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("pages.jsonl.zst", "it is a JSONL file compressed with zstd (by its name)"),
        ("pages.jsonl.bz2", "it is a JSONL file compressed with bzip2 (by its name)"),
        ("page.html.xz", "it is an HTML file compressed with xz (by its name)"),
    ],
    ids=["jsonl.zst", "jsonl.bz2", "html.xz"],
)
def test_a_compressed_single_file_is_refused_for_its_compression(
    tmp_path: Path, name: str, said: str
) -> None:
    source = tmp_path / name
    source.write_bytes(_compressed(said.split()[-4], b'{"html": "<p>x</p>"}\n'))
    with pytest.raises(PageSourceError) as raised:
        source_kind(source)
    assert str(raised.value).startswith(f"cannot read {source}: {said}, which is not read here: ")
    assert "no known suffix" not in str(raised.value)  # .zst is a known suffix, a WARC's


def _corpus(directory: Path) -> Path:
    (directory / "pages").mkdir(parents=True)
    for i in range(2):
        (directory / "pages" / f"{i}.html").write_text(PAGE)
    return directory


def _manifest_rows() -> bytes:
    rows = [{"id": f"doc-{i}", "url": f"https://site/{i}", "file": f"pages/{i}.html"} for i in range(2)]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_a_dangling_manifest_refuses_the_corpus(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus")
    os.symlink(tmp_path / "not-mounted" / "manifest.jsonl", corpus / "manifest.jsonl")
    with pytest.raises(
        PageUnreadableError, match=r"its manifest .*manifest\.jsonl is a symlink to .*, which is gone"
    ):
        source_kind(corpus)
    with pytest.raises(PageUnreadableError):
        next(iter_pages(corpus, bad_rows="report"))  # not its page files, named by their paths


def test_a_manifest_that_is_no_file_refuses_the_corpus(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "manifest.jsonl").mkdir()
    with pytest.raises(PageSourceError, match=r"its manifest .*manifest\.jsonl is no file"):
        source_kind(corpus)


def test_a_gzipped_manifest_is_the_manifest(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "manifest.jsonl.gz").write_bytes(gzip.compress(_manifest_rows()))
    assert source_kind(corpus) == ("jsonl", corpus / "manifest.jsonl.gz")
    pages = list(iter_pages(corpus))
    assert [(p.id, p.url, p.html) for p in pages] == [
        (f"doc-{i}", f"https://site/{i}", PAGE.encode()) for i in range(2)
    ]
    (corpus / "manifest.jsonl").write_bytes(_manifest_rows()[: len(_manifest_rows()) // 2])
    assert source_kind(corpus) == ("jsonl", corpus / "manifest.jsonl")  # the plain one first


def test_other_names_of_a_manifest_are_named_as_unused(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus")
    for name in (
        "MANIFEST.jsonl",
        "manifest.ndjson",
        "Manifest.jsonl.zst",
        "manifest.json",
        "manifests.jsonl",
    ):
        (corpus / name).write_bytes(_manifest_rows())
    assert source_kind(corpus) == ("directory", corpus)
    # A web app's manifest.json is no corpus manifest.
    assert unused_manifests(corpus) == ["MANIFEST.jsonl", "Manifest.jsonl.zst", "manifest.ndjson"]


def _ladder(top: Path, levels: int) -> Path:
    """Level k holds a page and two links to level k+1: 2**levels paths to the last level."""
    for level in range(levels + 1):
        (top / f"L{level}").mkdir(parents=True)
        (top / f"L{level}" / "p.html").write_text(PAGE)
        if level < levels:
            os.symlink(f"../L{level + 1}", top / f"L{level}" / "a")
            os.symlink(f"../L{level + 1}", top / f"L{level}" / "b")
    return top / "L0"


def test_a_ladder_of_symlinks_is_walked_once_per_directory(tmp_path: Path) -> None:
    passed_over: list[Path] = []
    listed = list_directory(_ladder(tmp_path, 12), passed_over=passed_over)
    assert [str(entry.path.relative_to(tmp_path / "L0")) for entry in listed][-3:] == [
        "a/a/p.html",
        "a/p.html",
        "p.html",
    ]
    assert len(listed) == 13  # where 2**13 - 1 paths had been listed
    assert [str(link.relative_to(tmp_path / "L0")) for link in passed_over][-3:] == ["a/a/b", "a/b", "b"]
    assert len(passed_over) == 12


def test_a_directory_is_read_once_whatever_links_lead_to_it(tmp_path: Path) -> None:
    """Its own path first, then the links' by their order as paths, not the file system's."""
    top = tmp_path / "site"
    (top / "real").mkdir(parents=True)
    (top / "real" / "p.html").write_text(PAGE)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "q.html").write_text(PAGE)
    os.symlink("real", top / "0-link-to-real")  # sorts before `real`, which is walked all the same
    os.symlink(tmp_path / "outside", top / "z2")
    os.symlink(tmp_path / "outside", top / "z1")
    assert [p.id for p in iter_pages(top)] == ["real/p.html", "z1/q.html"]


def test_links_back_up_are_cycles_not_directories_read_twice(tmp_path: Path) -> None:
    """A link to a directory it is in (`real/up -> ..`, `here -> .`) is a cycle, skipped without a word as
    before; only a second way to a directory walked elsewhere (`mirror -> real`) is counted. Every link
    had been counted, and the summary of a site with a link back up told of it on every run."""
    top = tmp_path / "site"
    (top / "real").mkdir(parents=True)
    (top / "real" / "p.html").write_text(PAGE)
    os.symlink("..", top / "real" / "up")
    os.symlink(".", top / "here")
    os.symlink("../real", top / "real" / "self")
    passed_over: list[Path] = []
    assert [entry.path for entry in list_directory(top, passed_over=passed_over)] == [top / "real" / "p.html"]
    assert passed_over == []
    os.symlink("real", top / "mirror")
    os.symlink("../real", top / "real" / "up" / "real" / "self-again")  # (in `real` itself: a cycle)
    assert [entry.path for entry in list_directory(top, passed_over=passed_over)] == [top / "real" / "p.html"]
    assert passed_over == [top / "mirror"]


def test_hidden_files_and_mac_resource_forks_are_no_pages(tmp_path: Path) -> None:
    top = tmp_path / "site"
    for name in (
        "a.html",
        "._a.html",
        "__MACOSX/._a.html",
        "__MACOSX/b.html",
        ".git/c.html",
        ".d.html",
        "sub/._e.htm",
    ):
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_bytes(
            b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " if "._" in name else PAGE.encode()
        )
    assert [p.id for p in iter_pages(top)] == ["a.html"]
    assert [entry.path.name for entry in list_directory(top)] == ["a.html"]
