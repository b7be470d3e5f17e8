"""/health once the model's child process (HTMLLM_INFERENCE_PROCESS=true) can never be started again.

A review served a copy of a checkpoint, added a head to it (`htmllm heads train --checkpoint <dir>`, the
documented way), and killed the child: every restart was refused ("changed since the engine started"),
/v1/embed answered 500 and /ready 503, and /health 200 for `HTMLLM_UNHEALTHY_AFTER_S` (300 s) as for a
fault that may pass, each probe meanwhile spawning a child that loaded the whole model to be refused.
No wait cures that; a restart does (it loads the new checkpoint). Now /health answers 503 `unhealthy`
as soon as a restart is refused for it, so the liveness probe restarts the pod. A checkpoint that is
gone is still retried, and /health waits `HTMLLM_UNHEALTHY_AFTER_S` for it as before.

Real child processes on a copy of the tiny checkpoint; the clock is moved on rather than waited for.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app
from service.core.checkpoint import read_meta, save_heads
from service.core.modeling import HeadSpec, TaskHead
from service.engine.runners.process import ProcessRunner
from tests.api.conftest import serving, tiny_settings
from tests.api.pages import page
from tests.factories.waiting import ready_until, until_async


def _restart_failed(runner: ProcessRunner) -> Callable[[], bool]:
    return lambda: (outage := runner.outage()) is not None and not outage.loading


def runner_failures(app: Any) -> int:
    """The engine's count of failed passes in a row."""
    failures: int = app.state.runtime.engine.health.failures
    return failures


def _kill(runner: ProcessRunner) -> None:
    process = runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)


async def test_a_checkpoint_changed_under_a_dead_child_makes_health_503_at_once(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    app = create_app(tiny_settings(served, inference_process=True, intra_op_threads=1))  # 300 s default
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        runner = app.state.runtime.engine._runner
        assert isinstance(runner, ProcessRunner)
        spawned: list[object] = []
        real = runner._context.Process

        def counted(*args: Any, **kwargs: Any) -> Any:
            spawned.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(runner._context, "Process", counted)

        meta = read_meta(served)
        spec = HeadSpec(name="tld", kind="classification", labels=["com", "org"], hidden=16)
        save_heads(served, {spec.name: (spec, TaskHead(spec, meta.embedding_dim))})
        _kill(runner)
        await until_async(_restart_failed(runner), "the restart refused")

        health = await client.get("/health")
        assert health.status_code == 503, health.text
        error = health.json()["error"]
        assert error["code"] == "unhealthy" and "Retry-After" not in health.headers
        assert "changed since the engine started (heads [page_type" in error["message"]
        assert "restart the server to serve the new model" in error["message"]
        ready = await client.get("/ready")
        assert ready.status_code == 503 and "changed since the engine started" in ready.text

        # Nothing is wrong with the request, and the pod waits for its restart: a retryable 503 (it had
        # been a 500 `backend_failed`, counted as a failed pass).
        failed = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "not_ready", failed.text
        assert "restart the server" in failed.json()["error"]["message"] and "Retry-After" in failed.headers
        assert runner_failures(app) == 0
        assert spawned == []  # every restart (the watcher's, the probes', the batch's) refused by the parent
        assert (await client.get("/health")).status_code == 503  # and stays so: no retry cures it

        # The checkpoint it started on, back: a probe's restart serves it, and the server is well again.
        shutil.rmtree(served)
        shutil.copytree(tiny_checkpoint, served)
        await ready_until(client, 200, "once the checkpoint is back")
        assert (await client.get("/health")).status_code == 200
        assert runner.outage() is None


async def test_a_checkpoint_gone_under_a_dead_child_is_retried_before_health_gives_up(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    app = create_app(tiny_settings(served, inference_process=True, intra_op_threads=1, unhealthy_after_s=300))
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        runtime = app.state.runtime
        runner = runtime.engine._runner
        assert isinstance(runner, ProcessRunner)

        served.rename(tmp_path / "gone")  # a volume unmounted: it may come back
        _kill(runner)
        await until_async(_restart_failed(runner), "the restart refused")
        assert (await client.get("/ready")).status_code == 503  # starts a probe, whose pass fails
        await until_async(lambda: runtime.engine.health.failures > 0, "a failed probe")
        health = await client.get("/health")
        assert health.status_code == 200, health.text  # not for long enough yet

        monkeypatch.setattr(runtime, "clock", lambda: time.monotonic() + 300)
        health = await client.get("/health")
        assert health.status_code == 503 and "every forward pass has failed" in health.text, health.text
        assert "does not exist" in health.text
        monkeypatch.setattr(runtime, "clock", time.monotonic)

        (tmp_path / "gone").rename(served)
        await ready_until(client, 200, "once the checkpoint is back")
        assert (await client.get("/health")).status_code == 200 and runner.outage() is None


async def test_a_scrape_starts_no_check_pass_while_the_child_cannot_be_started(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check pass is for a backend that serves after a failure; during an outage a pass starts the child
    again. A review's scrapes alone restarted a child that could not start every 5 s, each logged as a
    failed check (/ready's probes retry an outage, at their pace, as documented)."""
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    app = create_app(tiny_settings(served, inference_process=True, intra_op_threads=1))
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        runtime = app.state.runtime
        runner = runtime.engine._runner
        assert isinstance(runner, ProcessRunner)
        meta = read_meta(served)
        spec = HeadSpec(name="tld", kind="classification", labels=["com", "org"], hidden=16)
        save_heads(served, {spec.name: (spec, TaskHead(spec, meta.embedding_dim))})
        _kill(runner)
        await until_async(_restart_failed(runner), "the restart refused")
        # The child died in a pass: one failed pass, below /ready's threshold.
        runtime.engine._batcher._pass_failed("the inference process exited (exit code -9)")
        checks: list[bool] = []
        start_probe = runtime._start_probe

        def spied(*, check: bool = False) -> None:
            checks.append(check)
            start_probe(check=check)

        monkeypatch.setattr(runtime, "_start_probe", spied)
        for _ in range(3):
            assert (await client.get("/metrics")).status_code == 200
        assert True not in checks, checks
