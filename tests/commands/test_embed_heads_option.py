"""`htmllm embed --heads`: white space around the comma-separated names is no part of them.

`--heads "page_type, quality"`, as people write lists, had been refused: "unknown head(s) ' quality'".
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from service.cli import main
from service.commands import embed as embed_command
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.cli import write_pages


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("embed-heads") / "tiny")


def _args(checkpoint: Path, source: Path, output: Path, heads: str) -> list[str]:
    return ["embed", "--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output),
            "--no-progress", "--preprocess-pool", "thread", "--workers", "1", "--heads", heads]  # fmt: skip


def test_names_are_read_without_the_white_space_around_them(checkpoint: Path, tmp_path: Path) -> None:
    write_pages(tmp_path / "pages.jsonl", 1)
    out = tmp_path / "out.parquet"
    assert main(_args(checkpoint, tmp_path / "pages.jsonl", out, " quality ,\tpage_type ")) == 0
    table = pq.read_table(out)
    assert table.column_names[-3:] == ["page_type", "page_type.probs", "quality"]
    assert table["error"].null_count == 1


def test_only_white_space_asks_for_no_head_as_the_empty_string_does(checkpoint: Path, tmp_path: Path) -> None:
    write_pages(tmp_path / "pages.jsonl", 1)
    out = tmp_path / "out.parquet"
    assert main(_args(checkpoint, tmp_path / "pages.jsonl", out, "  ")) == 0
    table = pq.read_table(out)
    assert table.column_names == list(embed_command.FIXED_COLUMNS)
    assert json.loads(table.schema.metadata[b"htmllm.head_labels"]) == {}


@pytest.mark.parametrize(
    ("heads", "named"),
    [
        ("quality, nope ", "unknown head(s) 'nope';"),  # the name as meant, not as spaced
        ("quality,,page_type", "unknown head(s) '';"),  # an empty name between commas: still a mistake
        ("quality, ", "unknown head(s) '';"),
    ],
)
def test_unknown_and_empty_names_are_still_refused(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], heads: str, named: str
) -> None:
    write_pages(tmp_path / "pages.jsonl", 1)
    out = tmp_path / "out.parquet"
    assert main(_args(checkpoint, tmp_path / "pages.jsonl", out, heads)) == 1
    err = capsys.readouterr().err
    assert named in err and "unknown_head" in err, err
    assert not out.exists()
