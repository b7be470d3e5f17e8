"""The runner in a child process: a dead child is replaced at once, in the background, and says so;
its log records reach this process's logging.

Real children on the tiny checkpoint. A child is held "loading" by stopping it (SIGSTOP) while it
loads, so that no assertion depends on how long a load takes; waits are bounded polls.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.api.logs import JsonFormatter
from service.core.errors import ErrorCode
from service.engine.runners.process import InferenceProcessError, ProcessRunner
from service.engine.types import EngineConfig
from tests.factories.waiting import WAIT_S, until

DOCS = [[2, 7, 9, 3], [2, 11, 5, 8, 3]]


def _kill(runner: ProcessRunner) -> Any:
    process = runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    return process


def test_a_child_dead_while_idle_is_replaced_at_once_and_says_so_while_it_loads(
    tiny_checkpoint: Path,
) -> None:
    """The restart was lazy, inside the next batch's pass (17 to 35 s in a server), with nothing to say
    that no child served: /ready stayed 200. Now the watcher starts a new child as soon as the old one
    exits, no pass asked, and `outage` says why no pass can run until it has loaded."""
    runner = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    try:
        before = runner.run(runner.prepare(DOCS)).embeddings
        assert runner.outage() is None
        old = _kill(runner)
        loading = until(lambda: runner._starting, "a new child started without a pass")
        os.kill(loading.pid, signal.SIGSTOP)  # held while it loads
        try:
            outage = runner.outage()
            assert outage is not None and outage.loading
            assert (
                "exited (exit code -9)" in outage.reason and "loading the model (restart 1)" in outage.reason
            )
        finally:
            os.kill(loading.pid, signal.SIGCONT)
        until(lambda: runner.outage() is None, "the new child serves")
        assert runner._process is loading and runner._process is not old and runner.restarts == 1
        after = runner.run(runner.prepare(DOCS)).embeddings
        np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)
        assert runner.restarts == 1  # the pass found it serving: no second start
    finally:
        runner.close()


def test_a_restart_onto_a_missing_checkpoint_is_refused_before_any_child(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint moved away under a server whose child then died: every restart spawned a child that
    imported torch for 6 to 8 s before it said "does not exist". The parent says it first."""
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    try:
        runner.run(runner.prepare(DOCS))
        context = runner._context
        spawned: list[object] = []
        real = context.Process

        def counted(*args: Any, **kwargs: Any) -> Any:
            spawned.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(context, "Process", counted)
        served.rename(tmp_path / "gone")
        _kill(runner)
        outage = until(lambda: (o := runner.outage()) is not None and not o.loading and o, "a failed restart")
        assert (
            "restart 1 failed" in outage.reason
            and f"checkpoint directory {served} does not exist" in outage.reason
        )
        with pytest.raises(InferenceProcessError, match="does not exist") as refused:
            runner.run(runner.prepare(DOCS))  # the next pass tries again, and is refused as quickly
        assert refused.value.code is ErrorCode.CHECKPOINT_INVALID
        assert spawned == [] and runner.restarts == 2
        (tmp_path / "gone").rename(served)
        assert runner.run(runner.prepare(DOCS)).embeddings.shape[0] == 2
        assert len(spawned) == 1 and runner.outage() is None
    finally:
        runner.close()


def test_closing_while_a_new_child_loads_leaves_no_child(tiny_checkpoint: Path) -> None:
    """A child restarted in the background is the runner's too: a close kills it while it loads."""
    known = {child.pid for child in multiprocessing.active_children()}
    runner = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    _kill(runner)
    loading = until(lambda: runner._starting, "a new child started")
    os.kill(loading.pid, signal.SIGSTOP)  # hung while it loads: only a kill ends it
    runner.close()
    assert [child for child in multiprocessing.active_children() if child.pid not in known] == []
    assert runner.outage() is None  # closed: nothing to report


def test_the_childs_log_records_reach_this_process_logging_once(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """The child's root logger had no handler: its warnings came through Python's bare fallback (no
    time, no level, never JSON) and its info lines were lost. Each record now reaches this process's
    handlers, in their format, once."""
    caplog.set_level(logging.INFO)
    lines = io.StringIO()
    json_handler = logging.StreamHandler(lines)
    json_handler.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(json_handler)
    try:
        others = set(threading.enumerate())
        runner = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
        child = runner._process
        assert child is not None
        relays = [t for t in set(threading.enumerate()) - others if t.name == "htmllm-inference-logs"]
        runner.close()
        for relay in relays:  # each ends when its child's end of the pipe closes: every record is in
            relay.join(WAIT_S)
            assert not relay.is_alive()
    finally:
        logging.getLogger().removeHandler(json_handler)
    threads = [
        record
        for record in caplog.records
        if record.name == "service.engine.runners.torch" and "intra-op threads" in record.getMessage()
    ]
    assert len(threads) == 1 and threads[0].process == child.pid and threads[0].levelno == logging.INFO
    entries = [json.loads(line) for line in lines.getvalue().splitlines()]
    ours = [entry for entry in entries if entry["logger"] == "service.engine.runners.torch"]
    assert (
        len(ours) == 1
        and ours[0]["level"] == "info"
        and "torch runs 1 intra-op threads" in ours[0]["message"]
    )
    assert "intra-op threads" not in capfd.readouterr().err  # not written by the child itself
