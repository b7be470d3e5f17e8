"""`htmllm embed`: a Parquet file with every document exactly once, even after kill -9 and a restart."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.engine import Document, DocumentResult, Engine
from tests.engine.conftest import make_pages
from tests.factories.warc import HttpResponse, response, warc_gz

ROOT = Path(__file__).resolve().parents[2]


def _write_pages(path: Path, n: int) -> list[str]:
    pages = make_pages(n, seed=5, min_words=40, max_words=200)
    with path.open("w", encoding="utf-8") as handle:
        for i, html in enumerate(pages):
            handle.write(json.dumps({"id": f"p{i}", "url": f"https://example.com/{i}", "html": html}) + "\n")
    return pages


async def _embed(checkpoint: Path, pages: list[str]) -> list[DocumentResult]:
    async with Engine.from_checkpoint(checkpoint) as engine:
        return await engine.embed([Document(html=p) for p in pages])


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", "embed", *args]


@pytest.mark.slow  # two CLI processes, each importing torch
def test_kill_minus_nine_then_resume_writes_each_document_once(tiny_checkpoint: Path, tmp_path: Path) -> None:
    n = 160
    pages = _write_pages(tmp_path / "pages.jsonl", n)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    args = _cli(
        "--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "pages.jsonl"), "--output", str(out),
        "--part-size", "8", "--batch-size", "4", "--no-progress",
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(parts.glob("part-*.parquet"))) < 3:
        assert first.poll() is None, first.stderr.read().decode() if first.stderr else ""
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not out.exists(), "the first run finished before it could be killed"
    written_before = sum(pq.read_table(p).num_rows for p in parts.glob("part-*.parquet"))
    assert 0 < written_before < n

    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert not parts.exists()
    table = pq.read_table(out)
    assert table["index"].to_pylist() == list(range(n))
    assert table["id"].to_pylist() == [f"p{i}" for i in range(n)]
    assert table["error"].null_count == n
    labels = json.loads(table.schema.metadata[b"htmllm.head_labels"])
    assert labels == {"page_type": ["article", "listing", "other"]}
    assert set(table["page_type"].to_pylist()) <= set(labels["page_type"])

    embeddings = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    sample = [0, written_before - 1, written_before, n - 1]
    expected = asyncio.run(_embed(tiny_checkpoint, [pages[i] for i in sample]))
    for i, result in zip(sample, expected, strict=True):
        np.testing.assert_allclose(embeddings[i], result.embedding, atol=1e-5)
        assert table["quality"][i].as_py() == pytest.approx(result.scores["quality"], abs=1e-5)

    assert main(args[3:]) == 0  # a finished output is left alone
    assert pq.read_table(out).num_rows == n


def test_resume_with_another_model_is_refused(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.factories.checkpoint import build_tiny_checkpoint

    _write_pages(tmp_path / "pages.jsonl", 3)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"model": "something-else"}), encoding="utf-8")
    other = build_tiny_checkpoint(tmp_path / "other", seed=1)
    args = _cli("--checkpoint", str(other), "--input", str(tmp_path / "pages.jsonl"), "--output", str(out))
    assert main(args[3:]) == 1
    assert "other settings" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_bad_rows_become_error_rows_and_the_run_goes_on(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], pool: str
) -> None:
    """A crawl dump with a broken line, a row without html and a page nested too deep: every position gets
    its row, the good pages their embeddings, the others an error code and message."""
    good = make_pages(2, seed=3, min_words=20, max_words=40)
    lines = [
        json.dumps({"id": "a", "html": good[0]}),
        '{"id": "broken", "html": "<p>cut',
        json.dumps({"id": "no-html"}),
        json.dumps({"id": "deep", "html": "<div>" * 20_000}),
        json.dumps({"id": "b", "html": good[1]}),
    ]
    source = tmp_path / "pages.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--output", str(out)]
    assert main([*args, "--no-progress", "--preprocess-pool", pool]) == 0
    assert "(3 failed this run)" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["id"].to_pylist() == ["a", "1", "no-html", "deep", "b"]
    assert table["error"].to_pylist() == [
        None,
        "validation_error",
        "validation_error",
        "preprocess_failed",
        None,
    ]
    messages = table["error_message"].to_pylist()
    assert messages[0] is None and messages[4] is None
    assert "line 2 is not JSON" in messages[1] and "neither 'html' nor 'file'" in messages[2]
    assert "nests about 20000 elements deep" in messages[3]
    assert table["embedding"][1].as_py() is None and table["tokens"][3].as_py() is None
    expected = asyncio.run(_embed(tiny_checkpoint, good))
    for row, result in zip((0, 4), expected, strict=True):
        np.testing.assert_allclose(np.array(table["embedding"][row].as_py()), result.embedding, atol=1e-5)


def test_parts_of_an_older_row_format_are_not_resumed(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.commands import embed as command

    _write_pages(tmp_path / "pages.jsonl", 2)
    out = tmp_path / "out.parquet"
    pin = tmp_path / "out.parquet.parts" / "run.json"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "pages.jsonl")]
    args += ["--output", str(out), "--no-progress"]

    def crash(*_: object) -> int:
        raise KeyboardInterrupt  # killed after its parts were written, before the merge

    monkeypatch.setattr(command, "_merge", crash)
    with pytest.raises(KeyboardInterrupt):
        main(args)
    monkeypatch.undo()
    # The same run as written by a version whose rows had no error_message: no row_format in run.json.
    settings = json.loads(pin.read_text(encoding="utf-8"))
    assert settings.pop("row_format") == command.ROW_FORMAT
    pin.write_text(json.dumps(settings), encoding="utf-8")
    assert main(args) == 1
    assert "other settings (row_format)" in capsys.readouterr().err
    assert not out.exists()


def test_a_warc_file_is_embedded_like_the_pages_it_holds(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crawler's .warc.gz in, one row per HTML response out: record ids, target URIs, the HTTP charset
    and Content-Encoding honoured, non-HTML records skipped, a cut-off last record an error row."""
    good = make_pages(2, seed=11, min_words=20, max_words=40)
    records = [
        response(
            "one",
            HttpResponse(good[0].encode("cp1250", errors="replace"), "text/html; charset=windows-1250"),
            "https://a.example/",
        ),
        response("png", HttpResponse(b"\x89PNG\r\n\x1a\n", "image/png")),
        response(
            "two",
            HttpResponse(gzip.compress(good[1].encode()), "text/html", headers={"Content-Encoding": "gzip"}),
            "https://b.example/",
        ),
    ]
    cut = warc_gz([response("cut", HttpResponse(b"<p>" + b"lost " * 200 + b"</p>"))])
    source = tmp_path / "crawl.warc.gz"
    source.write_bytes(warc_gz(records) + cut[: len(cut) // 2])
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(source), "--output", str(out)]
    assert main([*args, "--no-progress"]) == 0
    assert "(1 failed this run)" in capsys.readouterr().err
    table = pq.read_table(out)
    assert table["id"].to_pylist()[:2] == ["<urn:uuid:one>", "<urn:uuid:two>"] and table.num_rows == 3
    assert table["url"].to_pylist()[:2] == ["https://a.example/", "https://b.example/"]
    assert table["error"].to_pylist() == [None, None, "validation_error"]
    expected = asyncio.run(
        _embed(tiny_checkpoint, [good[0].encode("cp1250", errors="replace").decode("cp1250"), good[1]])
    )
    for row, result in enumerate(expected):
        np.testing.assert_allclose(np.array(table["embedding"][row].as_py()), result.embedding, atol=1e-5)


@pytest.mark.slow  # spawns the inference process, which imports torch
def test_the_model_in_a_child_process_writes_what_the_engine_gives(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    pages = _write_pages(tmp_path / "pages.jsonl", 12)
    out = tmp_path / "out.parquet"
    args = ["embed", "--checkpoint", str(tiny_checkpoint), "--input", str(tmp_path / "pages.jsonl")]
    assert main([*args, "--output", str(out), "--inference-process", "--no-progress"]) == 0
    table = pq.read_table(out)
    assert table["id"].to_pylist() == [f"p{i}" for i in range(12)] and table["error"].null_count == 12
    expected = asyncio.run(_embed(tiny_checkpoint, pages))
    embeddings = np.array(table["embedding"].to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(embeddings, np.stack([r.embedding for r in expected]), atol=1e-5)
