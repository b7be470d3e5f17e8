"""/ready while the model's child process (HTMLLM_INFERENCE_PROCESS=true) is replaced after it died.

A review killed the child under load: the restart waited for the next batch, took 17 to 35 s inside
its pass, and /ready said 200 throughout (until the pass had run 30 s) while requests queued into
504s. Now the new child starts at once and /ready answers 503 `not_ready`, with the reason, until it has
loaded; a request that comes meanwhile is accepted and waits for it, as during the warm-up.

Real child processes on a copy of the tiny checkpoint; a child is held "loading" by stopping it
(SIGSTOP), so no assertion depends on how long a load takes. Waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app
from service.engine.runners.process import ProcessRunner
from tests.api.conftest import serving, tiny_settings
from tests.api.pages import page
from tests.factories.waiting import POLLS, ready_until, until_async


async def test_ready_is_503_from_the_childs_death_until_a_new_one_serves(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    app = create_app(tiny_settings(served, inference_process=True, intra_op_threads=1))
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        runtime = app.state.runtime
        runner = runtime.engine._runner
        assert isinstance(runner, ProcessRunner)
        dead = runner._process
        assert dead is not None

        # Killed while idle: 503 at once, no request needed, and a request meanwhile waits for the new one.
        os.kill(dead.pid, signal.SIGKILL)
        loading = await until_async(lambda: runner._starting, "a new child started")
        os.kill(loading.pid, signal.SIGSTOP)  # held while it loads
        try:
            refused = await client.get("/ready")
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
            message = refused.json()["error"]["message"]
            assert "the inference process exited (exit code -9)" in message
            assert "a new one is loading the model (restart 1)" in message
            assert refused.headers["connection"] == "close"  # clients reconnect to a ready pod
            metrics = (await client.get("/metrics")).text
            assert "htmllm_ready 0.0" in metrics
            waiting = asyncio.ensure_future(client.post("/v1/embed", json={"documents": [{"html": page(1)}]}))
        finally:
            os.kill(loading.pid, signal.SIGCONT)
        answered = await waiting
        assert answered.status_code == 200, answered.text
        await ready_until(client, 200, "once the new child serves")
        assert runner.restarts == 1

        # A restart that fails (the checkpoint moved away) keeps /ready 503 with why; the probe passes
        # start another until one serves, with no traffic to do it.
        served.rename(tmp_path / "gone")
        os.kill(runner._process.pid, signal.SIGKILL)
        failed = await ready_until(client, 503, "after the child died")
        for _ in range(POLLS):
            if "does not exist" in failed.text:
                break
            await asyncio.sleep(0.005)
            failed = await client.get("/ready")
        assert failed.status_code == 503 and "does not exist" in failed.text, failed.text
        assert "the next forward pass tries again" in failed.text
        (tmp_path / "gone").rename(served)
        await ready_until(client, 200, "once a probe's restart serves")
        assert runner.outage() is None and runner._process is not None
