"""`service.core.made_directories`: what a write makes, and what of it a failure takes away again."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.made_directories import directories_to_make, missing_before_parent_step, remove_empty


def test_what_a_write_makes_is_known_before_and_only_the_empty_part_goes(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "runs" / "new" / "a"
    made = directories_to_make(out)
    assert made == [out, out.parent, out.parent.parent]
    out.mkdir(parents=True)
    (out.parent / "b").mkdir()
    (out.parent / "b" / "file").write_bytes(b"another writer's")
    remove_empty(made)  # `a` goes; `new` holds `b`, so it and `runs` stay; `kept` was never the write's
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "kept", "kept/runs", "kept/runs/new", "kept/runs/new/b", "kept/runs/new/b/file"
    ]  # fmt: skip


def test_a_step_up_after_a_directory_to_make_is_found(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    assert missing_before_parent_step(tmp_path / "new" / ".." / "kept") == tmp_path / "new"
    assert missing_before_parent_step(tmp_path / "old" / ".." / "kept") is None
    assert missing_before_parent_step(Path("relative/../x")) == Path("relative")


def test_a_directory_named_two_ways_goes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    remove_empty([tmp_path / "a", Path("a/b")])  # the absolute `a` would go first, and stay (holds b)
    assert list(tmp_path.iterdir()) == []
