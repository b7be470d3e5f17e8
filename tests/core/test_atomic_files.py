"""Files written whole or not at all: the target is complete or as it was, with the mode asked for."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from service.core.atomic_files import current_umask, replaced_atomically


def test_the_target_appears_only_when_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with replaced_atomically(target, suffix=".tmp", durable=True) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old" and tmp.name.startswith(".out.txt.") and tmp.suffix == ".tmp"
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~current_umask()  # not mkstemp's 0600


def test_a_failed_block_leaves_the_target_as_it_was_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), replaced_atomically(target, mode=0o640) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with replaced_atomically(target, mode=0o640) as tmp:
        tmp.write_text("whole")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_the_umask_is_read_without_being_changed() -> None:
    previous = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # still what it was set to
    finally:
        os.umask(previous)
