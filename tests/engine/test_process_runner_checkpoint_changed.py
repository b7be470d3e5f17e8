"""A model process that cannot be started again because its checkpoint changed says so, as permanent.

A head trained into the served checkpoint (`htmllm heads train --checkpoint <dir>`, `save_heads`), then
the child dies: each restart spawned a child that imported torch and loaded the whole model only to be
refused ("changed since the engine started"), again at every probe and every batch, and nothing told
that apart from a restart that may succeed later. Now the parent compares the fingerprint first, no child
is spawned, and `outage().permanent` says no retry cures it (the server's /health turns 503 on it,
tests/api/test_health_checkpoint_changed.py). A checkpoint gone or unreadable is still a fault that may
pass (a volume remounted): retried, and not permanent.

Real children on a copy of the tiny checkpoint; waits are bounded polls.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.core.checkpoint import read_meta, save_heads
from service.core.errors import ErrorCode
from service.core.modeling import HeadSpec, TaskHead
from service.engine.runners.process import (
    CheckpointChangedError,
    InferenceProcessError,
    Outage,
    ProcessRunner,
)
from service.engine.types import EngineConfig
from tests.factories.disk import closed_directory
from tests.factories.waiting import until

DOCS = [[2, 7, 9, 3], [2, 11, 5, 8, 3]]


def _failed_restart(runner: ProcessRunner) -> Outage:
    """The outage once a restart has ended without a child (none loading)."""
    found: Outage = until(
        lambda: (o := runner.outage()) is not None and not o.loading and o, "a restart that failed"
    )
    return found


def _kill(runner: ProcessRunner) -> None:
    process = runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)


def _add_head(checkpoint: Path) -> None:
    """What `htmllm heads train --checkpoint` does to it: a new head, saved beside the others."""
    meta = read_meta(checkpoint)
    spec = HeadSpec(name="tld", kind="classification", labels=["com", "org"], hidden=16)
    save_heads(checkpoint, {spec.name: (spec, TaskHead(spec, meta.embedding_dim))})


@pytest.fixture
def served(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, copy)
    return copy


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Callable[[ProcessRunner], list[object]]:
    """Count the children a runner spawns from now on: `spawned(runner)` starts counting, returns the list."""

    def count(runner: ProcessRunner) -> list[object]:
        children: list[object] = []
        context = runner._context
        real = context.Process

        def counted(*args: Any, **kwargs: Any) -> Any:
            children.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(context, "Process", counted)
        return children

    return count


def test_a_restart_onto_a_changed_checkpoint_is_refused_before_any_child_and_is_permanent(
    served: Path, tiny_checkpoint: Path, spawned: Callable[[ProcessRunner], list[object]]
) -> None:
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    try:
        before = runner.run(runner.prepare(DOCS)).embeddings
        children = spawned(runner)
        _add_head(served)
        _kill(runner)
        outage = _failed_restart(runner)
        assert outage.permanent, outage
        assert "changed since the engine started (heads [page_type" in outage.reason
        assert "tld['com', 'org']" in outage.reason
        assert "restart the server to serve the new model" in outage.reason
        assert children == []  # refused by the parent: no model loaded to be thrown away

        with pytest.raises(CheckpointChangedError, match="restart the server") as refused:
            runner.run(runner.prepare(DOCS))  # a batch tries again, and is refused as quickly
        assert refused.value.code is ErrorCode.NOT_READY  # a retryable 503: no pass ran, none failed
        assert children == [] and runner.restarts == 2
        again = runner.outage()
        assert again is not None and again.permanent

        # The checkpoint it started on, back: the next restart serves it, and nothing is wrong any more.
        shutil.rmtree(served)
        shutil.copytree(tiny_checkpoint, served)
        after = runner.run(runner.prepare(DOCS)).embeddings
        np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)
        assert len(children) == 1 and runner.outage() is None
    finally:
        runner.close()


def test_a_change_only_the_child_finds_is_permanent_too(
    served: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head saved after the parent's look and before the child's: the child's fingerprint refuses it."""
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    try:
        runner.run(runner.prepare(DOCS))
        monkeypatch.setattr(runner, "_check_checkpoint", lambda: None)  # the parent looked before the save
        _add_head(served)
        _kill(runner)
        outage = _failed_restart(runner)
        assert outage.permanent and "changed since the engine started" in outage.reason, outage
    finally:
        runner.close()


def test_a_checkpoint_gone_or_unreadable_is_retried_and_not_permanent(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faults that may pass (a volume unmounted, a permission fixed): not the change's verdict, even
    right after one (what was found changed is no longer why the restart fails)."""
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    try:
        runner.run(runner.prepare(DOCS))
        _add_head(served)
        _kill(runner)
        assert _failed_restart(runner).permanent

        served.rename(tmp_path / "gone")
        with pytest.raises(InferenceProcessError, match="does not exist") as gone:
            runner.run(runner.prepare(DOCS))
        assert not isinstance(gone.value, CheckpointChangedError)
        outage = runner.outage()
        assert outage is not None and not outage.permanent and "does not exist" in outage.reason
        assert "the next forward pass tries again" in outage.reason

        (tmp_path / "gone").rename(served)
        with monkeypatch.context() as patch:
            closed_directory(patch, served)  # every file under it refused (EACCES)
            with pytest.raises(InferenceProcessError) as unreadable:
                runner.run(runner.prepare(DOCS))
        assert not isinstance(unreadable.value, CheckpointChangedError), unreadable.value
        assert "Permission denied" in str(unreadable.value) or "EACCES" in str(unreadable.value)
        outage = runner.outage()
        assert outage is not None and not outage.permanent
    finally:
        runner.close()
