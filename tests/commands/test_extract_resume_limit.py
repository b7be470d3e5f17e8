"""`htmllm extract`: a larger --limit (or none) goes on from an interrupted run of a smaller one, by the
rule `htmllm embed` follows (`resume_state.pin_settings(limit_may_grow=True)`), where it was refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.commands import extract as extract_command
from tests.factories.cli import stop_before_merge


def _error_rows(path: Path, n: int) -> Path:
    """Rows that become error rows without an extractor: the runs need no worker process."""
    path.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(n)))
    return path


def _args(source: Path, output: Path, *options: str) -> list[str]:
    return ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            "--part-size", "1", *options]  # fmt: skip


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The indices of the pages extracted from now on."""
    process, indices = extract_command._process, []

    def counted(index: int, *args: Any) -> dict[str, Any]:
        indices.append(index)
        return process(index, *args)

    monkeypatch.setattr(extract_command, "_process", counted)
    return indices


def test_an_interrupted_run_of_a_smaller_limit_goes_on_under_a_larger_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Try 3 pages, then all" was refused ("other settings (limit 3 -> 5)") and had to start over; a
    smaller limit is still refused (its rows past the limit would stay)."""
    source = _error_rows(tmp_path / "pages.jsonl", 8)
    output = tmp_path / "texts.jsonl"
    parts = tmp_path / "texts.jsonl.parts"
    args = _args(source, output)
    stop_before_merge(monkeypatch, [*args, "--limit", "3"], "extract")
    extracted = _counting(monkeypatch)
    stop_before_merge(monkeypatch, [*args, "--limit", "5"], "extract")
    assert extracted == [3, 4]
    capsys.readouterr()
    assert main([*args, "--limit", "4"]) == 1
    assert capsys.readouterr().err == (
        f"htmllm extract: validation_error: {parts} holds a run with other settings (limit 5 -> 4); delete "
        "it, or pass --overwrite, to start over\n"
    )
    assert main(args) == 0
    assert extracted == [3, 4, 5, 6, 7]
    assert capsys.readouterr().err.endswith("; 5 of them done by the interrupted run\n")
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [(row["index"], row["id"]) for row in rows] == [(i, f"r{i}") for i in range(8)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.jsonl", "texts.jsonl"]


def test_a_larger_limit_over_a_changed_input_is_refused_for_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _error_rows(tmp_path / "pages.jsonl", 8)
    output = tmp_path / "texts.jsonl"
    args = _args(source, output)
    stop_before_merge(monkeypatch, [*args, "--limit", "3"], "extract")
    with source.open("a", encoding="utf-8") as pages:
        pages.write(json.dumps({"id": "late"}) + "\n")
    capsys.readouterr()
    assert main([*args, "--limit", "5"]) == 1
    err = capsys.readouterr().err
    assert "input changed since the interrupted run (it was 1 file(s)" in err and "limit 3 -> 5" not in err
    assert not output.exists()
