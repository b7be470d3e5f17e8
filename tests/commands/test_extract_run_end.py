"""`htmllm extract` ended by a full disk: the disk's failure is what the user hears of, whatever comes
while the run stops (`htmllm embed`'s rule, tests/commands/test_embed_run_end.py)."""

from __future__ import annotations

import errno
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.commands import extract as extract_command


def test_ctrl_c_while_a_full_disk_stops_the_run_still_says_the_disk_is_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C pressed while the run tidied up after a part the disk would not take was answered
    "interrupted ... run the same command again", status 130: back into the same full disk."""
    source = tmp_path / "pages.jsonl"  # rows without html: error rows, no extractor process needed
    source.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(6)))
    output = tmp_path / "texts.jsonl"
    fmt, holds_parts = extract_command._JsonlParts, extract_command.holds_parts
    write = fmt.write
    writes = 0
    pressed = False

    def full_from_the_second(self: Any, rows: list[dict[str, Any]], path: Path) -> None:
        nonlocal writes
        writes += 1
        if writes == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, rows, path)

    def ctrl_c_while_tidying(parts: Path) -> bool:
        nonlocal pressed
        if writes == 2 and not pressed:  # (after the failed write: it is asked before the run too)
            pressed = True
            signal.raise_signal(signal.SIGINT)
        return holds_parts(parts)

    monkeypatch.setattr(fmt, "write", full_from_the_second)
    monkeypatch.setattr(extract_command, "holds_parts", ctrl_c_while_tidying)
    args = ["extract", "--input", str(source), "--output", str(output), "--workers", "1", "--no-progress",
            "--part-size", "2"]  # fmt: skip
    assert main(args) == 1
    assert pressed
    assert capsys.readouterr().err == f"htmllm extract: cannot write {output}: No space left on device\n"
    (part,) = (tmp_path / "texts.jsonl.parts").glob("part-*")
    assert [json.loads(line)["index"] for line in part.read_text().splitlines()[1:]] == [0, 1]  # (header)
