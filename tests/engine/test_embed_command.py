"""`htmllm embed`: a Parquet file with every document exactly once, even after kill -9 and a restart."""

from __future__ import annotations

import asyncio
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
