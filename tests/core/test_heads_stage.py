"""The heads stage: save_heads killed at any write, readers completing or reading through a stage, the
heads lock against a concurrent save, and lock-free loads that a save overtakes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from service.core.checkpoint import (
    CheckpointError,
    checkpoint_fingerprint,
    load_checkpoint,
    read_meta,
    save_heads,
)
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint


class _Killed(BaseException):
    """A kill, as far as the code under test can tell: nothing catches it, nothing after it runs."""


def _kill_after(monkeypatch: pytest.MonkeyPatch, renames: int) -> None:
    """Make the `renames`+1-th file rename (each atomic write ends in one) kill the process."""
    import os

    real = os.replace
    done = [0]

    def replace(src: Any, dst: Any) -> None:
        if done[0] >= renames:
            raise _Killed
        done[0] += 1
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def _heads_state(path: Path) -> tuple[dict[str, list[str]], dict[str, dict[str, torch.Tensor]]]:
    loaded = load_checkpoint(path)
    labels = {spec.name: spec.labels for spec in loaded.meta.heads}
    return labels, {name: head.state_dict() for name, head in loaded.model.heads.items()}


def test_a_save_heads_killed_at_any_write_leaves_the_old_or_the_new_checkpoint(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head files had been written before htmllm.json: killed between, the checkpoint was refused
    (unlisted heads), or a replaced head's new weights loaded under its old labels without a word."""
    dim = read_meta(ckpt).embedding_dim
    torch.manual_seed(7)
    # page_type replaced by a head of the same shape with other labels, topic added.
    page_type = HeadSpec(name="page_type", kind="classification", labels=["x", "y", "z"], hidden=16)
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8)
    new_heads = {"page_type": (page_type, TaskHead(page_type, dim)), "topic": (topic, TaskHead(topic, dim))}
    old = _heads_state(ckpt)
    reference = tmp_path / "reference"
    shutil.copytree(ckpt, reference)
    save_heads(reference, new_heads)
    new = _heads_state(reference)
    assert new[0]["page_type"] == ["x", "y", "z"] and "topic" in new[0]

    outcomes = []
    for renames in range(10):
        work = tmp_path / f"killed-{renames}"
        shutil.copytree(ckpt, work)
        with monkeypatch.context() as patch:
            _kill_after(patch, renames)
            try:
                save_heads(work, new_heads)
                finished = True
            except _Killed:
                finished = False
        labels, states = _heads_state(work)
        expected = new if labels == new[0] else old
        assert labels == expected[0], renames
        assert states.keys() == expected[1].keys()
        for name, state in states.items():
            for key, tensor in state.items():
                assert torch.equal(tensor, expected[1][name][key]), (renames, name, key)
        assert not (work / "heads" / ".pending" / "htmllm.json").exists()  # nothing committed is left
        fingerprint = checkpoint_fingerprint(reference if expected is new else ckpt)
        assert checkpoint_fingerprint(work) == fingerprint  # an uncommitted stage is no part of it
        outcomes.append("new" if expected is new else "old")
        if finished:
            break
    # Killed before the commit point: the old checkpoint; after it: the new one; then no kill at all.
    assert finished and outcomes[0] == "old" and outcomes[-1] == "new" and "old" not in outcomes[3:], outcomes


def test_completing_an_interrupted_save_heads_survives_a_kill(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dim = read_meta(ckpt).embedding_dim
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8)
    staged = 2  # the topic head file and htmllm.json written into heads/.pending/, nothing moved yet
    with monkeypatch.context() as patch:
        _kill_after(patch, staged)
        with pytest.raises(_Killed):
            save_heads(ckpt, {"topic": (topic, TaskHead(topic, dim))})
    assert (ckpt / "heads" / ".pending" / "htmllm.json").is_file()
    with monkeypatch.context() as patch:  # a reader killed while completing it
        _kill_after(patch, 1)
        with pytest.raises(_Killed):
            load_checkpoint(ckpt)
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type", "quality", "topic"]
    assert not (ckpt / "heads" / ".pending").exists()
    assert checkpoint_fingerprint(ckpt) == checkpoint_fingerprint(ckpt)


def _new_heads(dim: int, seed: int, prefix: str) -> dict[str, tuple[HeadSpec, TaskHead]]:
    """page_type replaced by one of the same shape with other labels (a mix loads silently), topic added."""
    torch.manual_seed(seed)
    page_type = HeadSpec(
        name="page_type", kind="classification", labels=[f"{prefix}{c}" for c in "xyz"], hidden=16
    )
    topic = HeadSpec(name="topic", kind="classification", labels=[f"{prefix}a", f"{prefix}b"], hidden=8)
    return {"page_type": (page_type, TaskHead(page_type, dim)), "topic": (topic, TaskHead(topic, dim))}


def _assert_loads(path: Path, heads: dict[str, tuple[HeadSpec, TaskHead]]) -> None:
    """`path` loads exactly `heads` (labels and weights) where they are named."""
    loaded = load_checkpoint(path)
    _assert_holds(loaded.meta.heads, loaded.model.heads, heads)


def _assert_holds(specs: Any, modules: Any, heads: dict[str, tuple[HeadSpec, TaskHead]]) -> None:
    labels = {spec.name: spec.labels for spec in specs}
    for name, (spec, head) in heads.items():
        assert labels[name] == spec.labels, name
        got = modules[name].state_dict()
        for key, tensor in head.state_dict().items():
            assert torch.equal(got[key], tensor), (name, key)


def _committed_stage(
    ckpt: Path, heads: dict[str, tuple[HeadSpec, TaskHead]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save_heads killed right after its commit point: its head files and htmllm.json staged."""
    with monkeypatch.context() as patch:
        _kill_after(patch, len(heads) + 1)
        with pytest.raises(_Killed):
            save_heads(ckpt, heads)
    assert (ckpt / "heads" / ".pending" / "htmllm.json").is_file()


def test_a_read_only_checkpoint_with_a_committed_stage_is_read_through_it(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Helm chart mounts models read-only: refusing a stage it cannot complete crash-looped every
    replica at once. The staged htmllm.json and heads are what its completion gives: load those."""
    import errno
    import os

    heads = _new_heads(read_meta(ckpt).embedding_dim, 7, "v1_")
    finished = tmp_path / "finished"
    shutil.copytree(ckpt, finished)
    save_heads(finished, heads)
    _committed_stage(ckpt, heads, monkeypatch)

    def read_only(src: Any, dst: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as patch, caplog.at_level("WARNING", logger="service.core.heads_stage"):
        patch.setattr(os, "replace", read_only)
        patch.setattr(os, "rename", read_only)
        _assert_loads(ckpt, heads)
        assert [spec.name for spec in read_meta(ckpt).heads] == ["page_type", "quality", "topic"]
        assert checkpoint_fingerprint(ckpt) == checkpoint_fingerprint(finished)
        assert "committed but not finished" in caplog.text
        assert (ckpt / "heads" / ".pending" / "htmllm.json").is_file()  # nothing was moved
        (ckpt / "heads" / ".pending" / "topic.safetensors").unlink()  # a stage that is not whole
        with pytest.raises(CheckpointError, match=r"topic\.safetensors is missing"):
            load_checkpoint(ckpt)
        (ckpt / "heads" / ".pending" / "htmllm.json").write_text("{", encoding="utf-8")
        with pytest.raises(CheckpointError, match=r"pending/htmllm\.json cannot be read"):
            read_meta(ckpt)


def test_a_reader_completing_a_stage_never_moves_or_removes_a_concurrent_save(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader R lists a committed stage and pauses before its first move; writer W (save_heads v2) runs
    meanwhile. R had moved W's uncommitted v2 head under the v1 htmllm.json and deleted W's stage (W
    failed): new weights loaded silently under old labels. Now the two take turns on one lock."""
    import fcntl
    import os
    import threading

    from service.core import checkpoint as checkpoint_module
    from service.core import heads_stage

    dim = read_meta(ckpt).embedding_dim
    v1, v2 = _new_heads(dim, 1, "v1_"), _new_heads(dim, 2, "v2_")
    _committed_stage(ckpt, v1, monkeypatch)
    r_paused, w_waits, r_done = threading.Event(), threading.Event(), threading.Event()
    real_replace, real_flock, real_write = os.replace, fcntl.flock, checkpoint_module._atomic_write_text

    def replace(src: Any, dst: Any) -> None:
        if threading.current_thread().name == "R" and not r_paused.is_set():
            r_paused.set()  # R listed the stage and is about to move its first file: W runs now
            assert w_waits.wait(30), "W never got as far as the lock or its commit"
        real_replace(src, dst)

    def flock(fd: int, operation: int) -> None:
        if threading.current_thread().name == "W":
            w_waits.set()  # W takes (or waits for) the lock R holds
        real_flock(fd, operation)

    def write_text(path: Path, text: str) -> None:
        if threading.current_thread().name == "W" and ".pending" in str(path):
            w_waits.set()  # without a lock: W staged its v2 head and is about to commit
            assert r_done.wait(30), "R never finished"
        real_write(path, text)

    errors: dict[str, BaseException] = {}

    def run(name: str, work: Any) -> None:
        try:
            work()
        except BaseException as exc:  # reported below
            errors[name] = exc
        finally:
            if name == "R":
                r_done.set()

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(checkpoint_module, "_atomic_write_text", write_text)

    def reader() -> None:
        heads_stage.finish_pending_heads(ckpt)

    def writer() -> None:
        assert r_paused.wait(30), "R never started moving"
        save_heads(ckpt, v2)

    threads = [threading.Thread(target=run, args=("R", reader), name="R")]
    threads.append(threading.Thread(target=run, args=("W", writer), name="W"))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.undo()
    assert not errors, errors
    _assert_loads(ckpt, v2)
    assert not (ckpt / "heads" / ".pending").exists()


def test_a_load_that_a_save_heads_overtakes_reads_again(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load without a stage takes no lock: a save_heads finishing between its reading htmllm.json and
    the head files had given the new weights under the old labels. The load notices and reads again."""
    from service.core import checkpoint as checkpoint_module

    heads = _new_heads(read_meta(ckpt).embedding_dim, 3, "v1_")
    real_read_config = checkpoint_module._read_config
    saves: list[Path] = []

    def read_config(root: Path) -> Any:  # after htmllm.json is read, before any head file
        if not saves:
            saves.append(root)
            save_heads(root, heads)
        return real_read_config(root)

    monkeypatch.setattr(checkpoint_module, "_read_config", read_config)
    loaded = load_checkpoint(ckpt)
    assert saves
    _assert_holds(loaded.meta.heads, loaded.model.heads, heads)


def test_readers_of_a_checkpoint_without_a_stage_need_no_lock_nor_write_access(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl
    import os

    def refuse(*args: Any) -> None:
        raise AssertionError(f"a reader wrote or locked: {args}")

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.setattr(os, "open", refuse)
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type", "quality"]
    assert checkpoint_fingerprint(ckpt) and read_meta(ckpt).heads


def test_saving_a_checkpoint_discards_a_stage_of_save_heads(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dim = read_meta(ckpt).embedding_dim
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8)
    with monkeypatch.context() as patch:
        _kill_after(patch, 2)
        with pytest.raises(_Killed):
            save_heads(ckpt, {"topic": (topic, TaskHead(topic, dim))})
    build_tiny_checkpoint(ckpt)  # saved over: the staged head must not be applied over it later
    assert [spec.name for spec in load_checkpoint(ckpt).meta.heads] == ["page_type", "quality"]


def test_a_copy_that_a_save_heads_overtakes_copies_again(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy made file by file without the lock (as `make default-model` bundled a run) took the old
    htmllm.json, then the head files a save_heads had replaced meanwhile: new weights under old labels,
    which loads without a word. The copy notices the save and copies again."""
    from service.core import checkpoint as checkpoint_module

    heads = _new_heads(read_meta(ckpt).embedding_dim, 4, "v1_")
    real_copy = checkpoint_module._copy_file
    saves: list[Path] = []

    def copy_file(source: Path, destination: Path) -> None:
        real_copy(source, destination)
        if destination.name == "htmllm.json" and not saves:  # the old labels copied, no head file yet
            saves.append(source)
            save_heads(ckpt, heads)

    monkeypatch.setattr(checkpoint_module, "_copy_file", copy_file)
    out = tmp_path / "out"
    checkpoint_module.copy_checkpoint(ckpt, out)
    assert saves
    _assert_loads(out, heads)
    assert checkpoint_fingerprint(out) == checkpoint_fingerprint(ckpt)


def test_a_copy_of_a_checkpoint_with_a_committed_stage_is_the_finished_checkpoint(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-only (the stage cannot be completed, nor a lock file created) the copy reads through the
    stage; writable, the stage is completed first. Neither copies the stage or the lock file."""
    import errno
    import os

    from service.core.checkpoint import copy_checkpoint

    heads = _new_heads(read_meta(ckpt).embedding_dim, 5, "v1_")
    finished = tmp_path / "finished"
    shutil.copytree(ckpt, finished)
    save_heads(finished, heads)
    _committed_stage(ckpt, heads, monkeypatch)

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    real_open = os.open

    def open_read_only(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and Path(file).is_relative_to(ckpt):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(file, flags, *args, **kwargs)

    expected = sorted(
        str(file.relative_to(finished)) for file in finished.rglob("*") if ".pending" not in str(file)
    )
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", read_only)
        patch.setattr(os, "open", open_read_only)
        copy_checkpoint(ckpt, tmp_path / "read-only-copy")
    assert (ckpt / "heads" / ".pending" / "htmllm.json").is_file()  # read through, not completed
    copy_checkpoint(ckpt, tmp_path / "copy")
    assert not (ckpt / "heads" / ".pending").exists()  # completed
    for out in (tmp_path / "read-only-copy", tmp_path / "copy"):
        assert sorted(str(file.relative_to(out)) for file in out.rglob("*")) == expected
        assert checkpoint_fingerprint(out) == checkpoint_fingerprint(finished)
        _assert_loads(out, heads)


# A second process for the heads lock: one command a line on stdin ("lock", "release", or "probe": take
# the lock without waiting), one reply a line on stdout. It imports only the heads stage (no torch).
_LOCK_HOLDER = """
import contextlib, fcntl, sys
from pathlib import Path
from service.core.heads_stage import heads_lock

root, held, real_flock = Path(sys.argv[1]), contextlib.ExitStack(), fcntl.flock
for line in sys.stdin:
    command = line.strip()
    if command == "lock":
        held.enter_context(heads_lock(root))
        reply = "held"
    elif command == "release":
        held.close()
        reply = "released"
    else:
        fcntl.flock = lambda fd, operation: real_flock(fd, operation | fcntl.LOCK_NB)
        try:
            with heads_lock(root):
                reply = "free"
        except BlockingIOError:
            reply = "blocked"
        finally:
            fcntl.flock = real_flock
    print(reply, flush=True)
"""


def test_the_heads_lock_excludes_another_process(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above run save and reader as threads of one process; the lock must also hold between
    processes (a trainer's `htmllm heads train` and a service replica), which a lock held in memory, or
    a POSIX record lock, would not. Whether a side waits is asked without waiting (LOCK_NB), so that no
    timing decides the outcome."""
    import fcntl
    import os
    import subprocess
    import sys
    import threading

    from service.core import heads_stage

    heads = _new_heads(read_meta(ckpt).embedding_dim, 6, "v1_")
    _committed_stage(ckpt, heads, monkeypatch)  # a reader completes it, holding the lock
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(ckpt)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo,
        env=env,
    )
    guard = threading.Timer(60, holder.kill)  # a failure guard only: a hung holder fails the test
    guard.start()

    def ask(command: str) -> str:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.write(command + "\n")
        holder.stdin.flush()
        return holder.stdout.readline().strip()

    real_flock = fcntl.flock
    try:
        assert ask("lock") == "held"
        with monkeypatch.context() as patch:  # this process's side asks without waiting
            patch.setattr(fcntl, "flock", lambda fd, operation: real_flock(fd, operation | fcntl.LOCK_NB))
            with pytest.raises(CheckpointError, match="completing it failed") as refused:
                heads_stage.finish_pending_heads(ckpt)
            assert isinstance(refused.value.__cause__, BlockingIOError)
            with pytest.raises(CheckpointError, match="completing it failed"):
                save_heads(ckpt, _new_heads(read_meta(ckpt).embedding_dim, 7, "v2_"))
            assert (ckpt / "heads" / ".pending" / "htmllm.json").is_file()  # nothing moved meanwhile
            assert ask("release") == "released"
            heads_stage.finish_pending_heads(ckpt)
        assert not (ckpt / "heads" / ".pending").exists()
        _assert_loads(ckpt, heads)
        with heads_stage.heads_lock(ckpt):  # and the other way round
            assert ask("probe") == "blocked"
        assert ask("probe") == "free"
    finally:
        guard.cancel()
        if holder.stdin is not None:
            holder.stdin.close()
        assert holder.wait(60) == 0
