"""`CodeStamp`: which code it watches (the `htmllm` distribution's packages this process imported, every
subpackage included) and what a look costs (a `stat` per file and directory: no directory is listed
again unless its own stat changed).

It had watched the `service` package alone, walked the whole tree on each look (every few seconds while
no preprocessing process can start), and named files relative to `service/`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from service.api import code_stamp
from service.api.code_stamp import CodeStamp


def _site(root: Path) -> Path:
    """Two packages with a subpackage each, a folder that is no code of theirs, and a bytecode cache."""
    for package in ("pkg_a", "pkg_b"):
        (root / package / "sub").mkdir(parents=True)
        (root / package / "__init__.py").write_text("", encoding="utf-8")
        (root / package / "sub" / "deep.py").write_text("X = 1\n", encoding="utf-8")
        (root / package / "__pycache__").mkdir()
        (root / package / "__pycache__" / "deep.cpython-311.pyc").write_bytes(b"\0")
    (root / "other").mkdir()
    (root / "other" / "elsewhere.py").write_text("Y = 1\n", encoding="utf-8")
    return root


def _age(root: Path) -> None:
    """Set every folder's mtime well in the past: a listing of one changed within the file system's
    clock granularity is not reused (it might change again unseen), and the test's are all new."""
    for directory, _, _ in os.walk(root):
        os.utime(directory, ns=(1_000_000_000, 1_000_000_000))


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    listed: list[str] = []
    scandir = os.scandir

    def counting(path: Any) -> Any:
        listed.append(str(path))
        return scandir(path)

    monkeypatch.setattr(code_stamp.os, "scandir", counting)
    return listed


def test_the_packages_are_watched_subpackages_included_and_nothing_else(tmp_path: Path) -> None:
    root = _site(tmp_path / "site")
    stamp = CodeStamp(root, ["pkg_a", "pkg_b"])
    assert stamp.files == ["pkg_a/__init__.py", "pkg_a/sub/deep.py", "pkg_b/__init__.py", "pkg_b/sub/deep.py"]
    (root / "other" / "elsewhere.py").write_text("Y = 2\n", encoding="utf-8")  # not theirs
    assert stamp.changed() == []
    replaced = root / "pkg_b" / "sub" / "deep.py.new"
    replaced.write_text("X = 2\n", encoding="utf-8")
    os.replace(replaced, root / "pkg_b" / "sub" / "deep.py")  # what pip does to a module it upgrades
    (root / "pkg_a" / "sub" / "more").mkdir()
    (root / "pkg_a" / "sub" / "more" / "new.py").write_text("Z = 1\n", encoding="utf-8")
    assert stamp.changed() == ["pkg_a/sub/more/new.py", "pkg_b/sub/deep.py"]


def test_a_look_at_unchanged_code_lists_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _site(tmp_path / "site")
    _age(root)
    stamp = CodeStamp(root, ["pkg_a", "pkg_b"])
    listed = _count_listings(monkeypatch)
    assert stamp.changed() == []
    assert listed == []  # a stat per file and folder, no walk

    (root / "pkg_a" / "sub" / "added.py").write_text("A = 1\n", encoding="utf-8")  # its folder's mtime moves
    (root / "pkg_b" / "__init__.py").write_text("B = 1\n", encoding="utf-8")  # in place: the file's own stat
    assert stamp.changed() == ["pkg_a/sub/added.py", "pkg_b/__init__.py"]
    assert listed == [str(root / "pkg_a" / "sub")]  # only the folder that changed is listed again


def test_the_running_stamp_covers_the_distributions_imported_packages() -> None:
    pytest.importorskip("model_training.cli")  # the command line's plug-in, loaded by `htmllm serve`
    stamp = CodeStamp.of_running()
    service_dir = Path(sys.modules["service"].__file__ or "").parent
    assert stamp.root == service_dir.parent
    assert "service/core/workers.py" in stamp.files  # subpackages: what a new worker process imports
    assert "service/engine/runners/process.py" in stamp.files
    assert "model_training/cli.py" in stamp.files
    assert not any(name.endswith(".pyc") or "/assets/" in name for name in stamp.files)
