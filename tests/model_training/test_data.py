"""Shards: domains, held-out split, the samplers, and `prepare_shards` end to end on generated pages."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from model_training.data import (
    EMPTY_PAGE,
    HELDOUT,
    MANIFEST_FILE,
    NO_EXTRACTION,
    TOKENIZER_FILE,
    TRAIN,
    DataError,
    Document,
    SamplingConfig,
    cluster_entropy,
    domain_of,
    holdout_split,
    length_uniform_sample,
    prepare_shards,
    read_manifest,
    read_shard,
    sample_documents,
)
from model_training.sites import site_of
from service.core.errors import HtmllmError
from service.core.prune import prune_html
from service.core.tokenizer import HtmlTokenizer
from tests.factories.tokenizer import build_tiny_tokenizer

WORDS = ("market", "weather", "Praha", "report", "music", "price", "today", "city", "model", "data")


def _doc(i: int, *, domain: str, length: int, cluster: str | None = None) -> Document:
    return Document(
        id=f"d{i}",
        url=f"https://{domain}/{i}" if domain else None,
        domain=domain,
        cluster=cluster,
        input_ids=[2, 3],
        length=2,
        full_length=2,
        truncated=False,
        text_length=length,
    )


def _raw_page(rng: random.Random, i: int) -> str:
    paragraphs = "".join(
        f'<p class="c{k}">{" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))}</p>'
        for k in range(rng.randint(1, 8))
    )
    return (
        f"<!doctype html><html><head><title>Page {i}</title><script>var x = {i};</script>"
        f'<style>p {{ color: red }}</style></head><body><nav><a href="/">Home</a></nav>'
        f"<article><h1>Story {i}</h1>{paragraphs}</article><footer>(c) site</footer></body></html>"
    )


def _write_corpus(root: Path, n: int, *, bad: int = 0) -> Path:
    rng = random.Random(3)
    corpus = root / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as handle:
        for i in range(n):
            row = {"id": f"p{i}", "url": f"https://www.site{i % 4}.example/{i}", "html": _raw_page(rng, i)}
            handle.write(json.dumps(row) + "\n")
        for j in range(bad):  # nesting far past the pruner's cap: refused, must be skipped
            handle.write(json.dumps({"id": f"bad{j}", "html": "<div>" * 10_000}) + "\n")
    return corpus


def _tokenizer_file(root: Path) -> Path:
    path = root / "tok.json"
    build_tiny_tokenizer().save(path)
    return path


def test_domain_of_strips_www_and_handles_missing_urls() -> None:
    assert domain_of("https://www.Example.com/a?b=1") == "example.com"
    assert domain_of(None) == ""
    assert domain_of("not a url") == ""


def test_domain_of_is_the_site_evaluation_groups_by() -> None:
    # Subdomains of one site are one domain: the held-out split keyed on the host put a site's
    # templates on both sides (de.creativecommons.org vs creativecommons.org).
    assert domain_of("http://news.site.cz:8080/x") == "site.cz"
    assert domain_of("https://de.creativecommons.org/a") == domain_of("https://creativecommons.org/b")
    assert domain_of("https://news.bbc.co.uk/1") == "bbc.co.uk"
    # Blogs on a shared host belong to different owners.
    assert domain_of("https://alice.wordpress.com/x") == "alice.wordpress.com"
    assert domain_of("https://alice.wordpress.com/x") != domain_of("https://bob.wordpress.com/y")
    # web.archive.org captures are the sites they archive, not one huge domain.
    assert domain_of("https://web.archive.org/web/2019id_/https://www.spiegel.de/a") == "spiegel.de"
    assert domain_of("http://web.archive.org/web/2020/http://blog.example.org/p") == "example.org"
    assert domain_of("http://10.0.0.1:8080/x") == "10.0.0.1"
    for url in ("https://www.a.example/", "https://x.a.example/", "https://web.archive.org/web/1/a.example"):
        assert domain_of(url) == site_of(url)  # one implementation for pretraining and evaluation
    sides = {
        holdout_split(domain_of(f"https://{p}.creativecommons.org/"), p, 0.5) for p in ("de", "fr", "www")
    }
    assert len(sides) == 1


def test_per_domain_cap_counts_archive_captures_by_the_site_they_archive() -> None:
    urls = [f"https://web.archive.org/web/2019/https://site{i}.example/page" for i in range(12)]
    docs = [_doc(i, domain=domain_of(url), length=10 + i) for i, url in enumerate(urls)]
    assert len(sample_documents(docs, SamplingConfig(per_domain=2))) == 12  # twelve sites, one page each


def test_holdout_split_is_stable_and_close_to_the_fraction() -> None:
    splits = [holdout_split(f"site{i}.example", f"id{i}", 0.2) for i in range(2000)]
    assert splits == [holdout_split(f"site{i}.example", f"id{i}", 0.2) for i in range(2000)]
    assert splits.count(HELDOUT) / len(splits) == pytest.approx(0.2, abs=0.03)
    # One domain is never split across both sides.
    assert len({holdout_split("same.example", f"id{i}", 0.5) for i in range(50)}) == 1


def test_length_uniform_sample_balances_short_and_long_documents() -> None:
    lengths = [10] * 90 + [1000] * 10
    chosen = length_uniform_sample(list(range(100)), lengths, 20, random.Random(0), bins=4)
    assert len(chosen) == 20
    assert sum(lengths[i] == 1000 for i in chosen) == 10  # every long page: there are only ten
    assert chosen == sorted(set(chosen))
    # A plain random sample of 20 would keep about two long pages.


def test_per_domain_cap_and_pages_without_domain() -> None:
    docs = [_doc(i, domain="big.example", length=10 + i) for i in range(50)]
    docs += [_doc(50 + i, domain="small.example", length=5) for i in range(3)]
    docs += [_doc(60 + i, domain="", length=5) for i in range(7)]
    kept = sample_documents(docs, SamplingConfig(per_domain=5))
    domains = [docs[i].domain for i in kept]
    assert domains.count("big.example") == 5
    assert domains.count("small.example") == 3
    assert domains.count("") == 7  # no URL: not one site, so no cap among them
    kept_lengths = sorted(docs[i].text_length for i in kept if docs[i].domain == "big.example")
    assert kept_lengths[-1] - kept_lengths[0] > 25  # spread over the length range, not the first five


def test_global_cap_is_uniform_over_length() -> None:
    docs = [_doc(i, domain=f"s{i}.example", length=20) for i in range(80)]
    docs += [_doc(80 + i, domain=f"t{i}.example", length=5000) for i in range(20)]
    kept = sample_documents(docs, SamplingConfig(max_documents=30, length_bins=2))
    assert len(kept) == 30
    assert sum(docs[i].text_length == 5000 for i in kept) == 15


def test_cluster_entropy_and_prioritisation() -> None:
    diverse = [_doc(i, domain=f"site{i}.example", length=10, cluster="topic") for i in range(8)]
    template = [_doc(10 + i, domain="one.example", length=10, cluster="template") for i in range(8)]
    docs = template + diverse
    entropy = cluster_entropy(docs)
    assert entropy["template"] == 0.0
    assert entropy["topic"] == pytest.approx(math.log(8))
    kept = sample_documents(docs, SamplingConfig(max_documents=8, prioritise_clusters=True))
    assert {docs[i].cluster for i in kept} == {"topic"}
    unprioritised = sample_documents(docs, SamplingConfig(max_documents=8, seed=1))
    assert {docs[i].cluster for i in unprioritised} == {"topic", "template"}


def test_sampling_config_rejects_bad_values() -> None:
    with pytest.raises(DataError):
        SamplingConfig(per_domain=0)
    with pytest.raises(DataError):
        SamplingConfig(holdout_fraction=1.0)


def test_prepare_shards_writes_pruned_tokenized_rows(tmp_path: Path) -> None:
    corpus = _write_corpus(tmp_path, 24, bad=1)
    out = tmp_path / "shards"
    stats = prepare_shards(
        corpus,
        out,
        _tokenizer_file(tmp_path),
        max_length=64,
        sampling=SamplingConfig(per_domain=5, holdout_fraction=0.3),
        extractor=NO_EXTRACTION,
        workers=2,
        shard_size=7,
        progress=False,
    )
    assert stats.pages == 25 and stats.processed == 24
    assert stats.skipped == {"prune:preprocess_failed": 1}
    assert stats.written == 20  # four domains, at most five each
    assert stats.train + stats.heldout == 20 and stats.shards == 3

    manifest = read_manifest(out)
    tokenizer = HtmlTokenizer.from_file(out / TOKENIZER_FILE)
    assert manifest["tokenizer_sha256"] == tokenizer.sha256 == build_tiny_tokenizer().sha256
    assert (out / MANIFEST_FILE).is_file()
    rows = [row for entry in manifest["shards"] for row in read_shard(out, entry).to_pylist()]
    assert len(rows) == 20
    pages = {json.loads(line)["id"]: json.loads(line)["html"] for line in corpus.read_text().splitlines()}
    for row in rows:
        pruned = prune_html(pages[row["id"]])
        assert row["pruned"] == pruned
        assert "<script" not in pruned and "class=" not in pruned
        encoding = tokenizer.encode(pruned, max_length=64)
        assert row["input_ids"] == encoding.ids
        assert row["length"] == len(encoding.ids) <= 64
        assert row["truncated"] == encoding.truncated
        assert row["domain"].startswith("site") and row["split"] in (TRAIN, HELDOUT)
        assert row["extractor"] == NO_EXTRACTION and row["text"] == ""
    # Domains never straddle the split.
    by_domain: dict[str, set[str]] = {}
    for row in rows:
        by_domain.setdefault(row["domain"], set()).add(row["split"])
    assert all(len(splits) == 1 for splits in by_domain.values())
    assert (
        pq.read_schema(out / manifest["shards"][0]["file"]).field("input_ids").type.value_type.bit_width == 32
    )


def test_text_length_is_the_whole_pages_so_long_pages_spread_over_the_length_bins(tmp_path: Path) -> None:
    """It was counted after the cut to max_length: every page longer than the window got about the same
    length, and all of them fell into the top bin of the length-uniform sampler."""
    corpus = tmp_path / "corpus.jsonl"
    words = {"short": 3, "long": 200, "longer": 2000}
    with corpus.open("w", encoding="utf-8") as handle:
        for name, n in words.items():
            html = f"<html><body><p>{' '.join(WORDS[i % len(WORDS)] for i in range(n))}</p></body></html>"
            handle.write(json.dumps({"id": name, "url": f"https://{name}.example/", "html": html}) + "\n")
    out = tmp_path / "shards"
    prepare_shards(
        corpus, out, _tokenizer_file(tmp_path), max_length=32, extractor=NO_EXTRACTION, workers=1,
        progress=False,
    )  # fmt: skip
    tokenizer = HtmlTokenizer.from_file(out / TOKENIZER_FILE)
    tags = set(tokenizer.tag_token_ids.values()) | set(vars(tokenizer.special_ids).values())
    manifest = read_manifest(out)
    rows = {r["id"]: r for e in manifest["shards"] for r in read_shard(out, e).to_pylist()}
    for name, row in rows.items():
        whole = tokenizer.encode(row["pruned"])
        assert row["text_length"] == sum(t not in tags for t in whole.ids), name
        bounded = tokenizer.encode(row["pruned"], max_length=32)  # one tokenization, the same cut
        assert (row["input_ids"], row["truncated"], row["full_length"]) == (
            bounded.ids,
            bounded.truncated,
            bounded.full_length,
        ), name
    assert rows["short"]["text_length"] < 30 < rows["long"]["text_length"] < rows["longer"]["text_length"]
    assert rows["long"]["truncated"] and rows["longer"]["truncated"] and not rows["short"]["truncated"]
    # Both are cut to the same window, yet ten times the text puts the longer page in a bin of its own.
    assert rows["longer"]["text_length"] > 5 * rows["long"]["text_length"]


@pytest.mark.slow
def test_prepare_shards_extracts_the_teachers_text(tmp_path: Path) -> None:
    corpus = _write_corpus(tmp_path, 4)
    out = tmp_path / "shards"
    prepare_shards(
        corpus,
        out,
        _tokenizer_file(tmp_path),
        max_length=64,
        extractor="resiliparse",
        workers=1,
        progress=False,
    )
    manifest = read_manifest(out)
    rows = read_shard(out, manifest["shards"][0]).to_pylist()
    assert all(row["extractor"] == "resiliparse" for row in rows)
    assert all("Story" in row["text"] and "var x" not in row["text"] for row in rows)


def test_prepare_shards_fails_cleanly_when_nothing_survives(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(json.dumps({"id": "x", "html": "<div>" * 10_000}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="no page"):
        prepare_shards(
            corpus, tmp_path / "out", _tokenizer_file(tmp_path), extractor=NO_EXTRACTION, progress=False
        )
    with pytest.raises(DataError, match="manifest"):
        read_manifest(tmp_path / "nowhere")


def test_prepare_shards_skips_pages_that_prune_to_nothing(tmp_path: Path) -> None:
    # Blank pages and empty 200 responses are common in a crawl; they used to become [CLS][SEP] rows
    # with an empty text for the teacher to embed.
    corpus = _write_corpus(tmp_path, 4)
    with corpus.open("a", encoding="utf-8") as handle:
        for j, html in enumerate(("", "<html><body> </body></html>", "<script>var a;</script><!-- x -->")):
            handle.write(
                json.dumps({"id": f"empty{j}", "url": f"https://e{j}.example/", "html": html}) + "\n"
            )
    out = tmp_path / "shards"
    stats = prepare_shards(
        corpus, out, _tokenizer_file(tmp_path), max_length=64, extractor=NO_EXTRACTION, workers=1,
        progress=False,
    )  # fmt: skip
    assert stats.pages == 7 and stats.processed == stats.written == 4
    assert stats.skipped == {EMPTY_PAGE: 3}
    manifest = read_manifest(out)
    rows = [row for entry in manifest["shards"] for row in read_shard(out, entry).to_pylist()]
    assert sorted(row["id"] for row in rows) == ["p0", "p1", "p2", "p3"]
    assert manifest["stats"]["skipped"] == {EMPTY_PAGE: 3}


def test_prepare_shards_checks_options_and_output_before_reading_pages(tmp_path: Path) -> None:
    corpus = _write_corpus(tmp_path, 2)
    tok = _tokenizer_file(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("x", encoding="utf-8")
    bad: list[tuple[dict[str, object], str]] = [
        ({"workers": 0}, "workers"),  # used to be multiprocessing's ValueError traceback
        ({"shard_size": 0}, "shard_size"),  # used to be range()'s ValueError, after all the work
        ({"limit": -3}, "limit"),
        ({"out": a_file}, "is an existing file"),  # used to be FileExistsError after all the work
        ({"source": tmp_path / "missing.jsonl"}, "does not exist"),
    ]
    for options, message in bad:
        kwargs: dict[str, object] = {"workers": 1, "extractor": NO_EXTRACTION, "progress": False}
        kwargs.update(options)
        source = kwargs.pop("source", corpus)
        out = kwargs.pop("out", tmp_path / "out")
        with pytest.raises(HtmllmError, match=message):
            prepare_shards(source, out, tok, **kwargs)  # type: ignore[arg-type]


def test_corrupt_manifest_and_shard_are_data_errors(tmp_path: Path) -> None:
    out = tmp_path / "shards"
    prepare_shards(
        _write_corpus(tmp_path, 3), out, _tokenizer_file(tmp_path), extractor=NO_EXTRACTION, workers=1,
        progress=False,
    )  # fmt: skip
    manifest = read_manifest(out)
    shard = out / manifest["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:40])  # a copy cut short
    with pytest.raises(DataError, match="cannot be read"):
        read_shard(out, manifest["shards"][0])
    (out / MANIFEST_FILE).write_text('{"format_version": 1, "sha', encoding="utf-8")
    with pytest.raises(DataError, match="cannot be read"):
        read_manifest(out)


def test_data_prepare_command_reports_user_errors_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    corpus = _write_corpus(tmp_path, 2)
    common = ["data", "prepare", "--corpus", str(corpus), "--tokenizer", str(_tokenizer_file(tmp_path))]
    assert main([*common, "--out", str(tmp_path / "o"), "--workers", "0", "--no-progress"]) == 1
    assert "workers must be at least 1" in capsys.readouterr().err
    assert main([*common, "--out", str(corpus), "--extractor", "none", "--no-progress"]) == 1
    assert "is an existing file" in capsys.readouterr().err


def test_preparing_again_into_the_same_directory_leaves_no_stale_shards(tmp_path: Path) -> None:
    tok = _tokenizer_file(tmp_path)
    out = tmp_path / "shards"
    options: dict[str, object] = {"extractor": NO_EXTRACTION, "workers": 1, "progress": False}
    prepare_shards(_write_corpus(tmp_path, 24), out, tok, shard_size=7, **options)  # type: ignore[arg-type]
    assert len(list(out.glob("shard-*.parquet"))) == 4
    small = tmp_path / "small"
    small.mkdir()
    prepare_shards(_write_corpus(small, 5), out, tok, shard_size=7, **options)  # type: ignore[arg-type]
    manifest = read_manifest(out)
    assert sorted(p.name for p in out.glob("shard-*.parquet")) == [e["file"] for e in manifest["shards"]]
    assert [e["rows"] for e in manifest["shards"]] == [5]


def test_a_page_file_still_compressed_is_counted_and_passed_over(tmp_path: Path) -> None:
    """A page file holding zstd (or gzip twice) is the reader's `unsupported_media_type` row: it would have
    stopped the whole run, as any error row the reader gives but the page cap's; it had been trained on
    as binary noise before the reader told it."""
    import zstandard

    corpus = _write_corpus(tmp_path, 6)
    page = b"<html><body><p>" + b"compressed words that read like a page " * 40 + b"</p></body></html>"
    (tmp_path / "noise.html").write_bytes(zstandard.ZstdCompressor().compress(page))
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "zstd", "url": "https://z.example/", "file": "noise.html"}) + "\n")
    stats = prepare_shards(
        corpus, tmp_path / "shards", _tokenizer_file(tmp_path), max_length=64, extractor=NO_EXTRACTION,
        workers=1, progress=False,
    )  # fmt: skip
    assert stats.pages == 7 and stats.written == 6
    assert stats.skipped == {"prune:unsupported_media_type": 1}


def test_a_page_over_the_page_cap_is_counted_like_a_pruner_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One page over the pruner's byte cap used to stop the whole run (payload_too_large, exit 1), while
    a page the pruner refuses for its nesting was counted and passed over."""
    from service.core import pages

    corpus = _write_corpus(tmp_path, 6, bad=1)
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write(
            json.dumps({"id": "huge", "url": "https://huge.example/", "html": "<p>x</p>" * 10_000}) + "\n"
        )
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 60_000)  # over the deep page's 50 kB, under 80 kB
    stats = prepare_shards(
        corpus, tmp_path / "shards", _tokenizer_file(tmp_path), max_length=64, extractor=NO_EXTRACTION,
        workers=1, progress=False,
    )  # fmt: skip
    assert stats.pages == 8 and stats.written == 6
    assert stats.skipped == {"prune:payload_too_large": 1, "prune:preprocess_failed": 1}
    # A row that cannot be read at all still stops the run, naming it.
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    with pytest.raises(HtmllmError, match="line 9 is not JSON"):
        prepare_shards(
            corpus, tmp_path / "shards", _tokenizer_file(tmp_path), extractor=NO_EXTRACTION, workers=1,
            progress=False,
        )  # fmt: skip
