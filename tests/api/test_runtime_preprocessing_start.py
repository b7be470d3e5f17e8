"""What the server says when no preprocessing process can start (`HTMLLM_PREPROCESS_POOL=process`).

A review upgraded the package in place under a running server: every process it started from then on
imported the new code, and one that could not start refused its page with a retryable 503 `not_ready`,
for ever, while /ready and /health said 200: the pod stayed in rotation and alive, and nothing in the
log said a restart was needed. Now pages refused so (`HTMLLM_UNREADY_AFTER_FAILURES` in a row) turn
/ready 503 with the reason, logged once, and a probe page now and then tells when a process starts
again; /health turns 503 once it has lasted `HTMLLM_UNHEALTHY_AFTER_S`, or at once where the code on
disk changed since the server started (`CodeStamp`), with one error line that says a restart is needed.

The processes are real; one that cannot start is made by killing the pool's worker and giving the next
ones an initializer argument they die on. The code "on disk" is a folder of the test's own
(`Runtime.code`), and ages are moved on through `Runtime.clock`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app
from service.api.runtime import CodeStamp, Runtime
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def _code(root: Path) -> Path:
    """A package of two modules, for `CodeStamp` to watch."""
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n", encoding="utf-8")
    (root / "sub" / "b.py").write_text("B = 1\n", encoding="utf-8")
    return root


def _upgrade(root: Path) -> None:
    """What pip does to a module it upgrades: a new file in its place."""
    new = root / "a.py.new"
    new.write_text("A = 2\n", encoding="utf-8")
    os.replace(new, root / "a.py")


def _no_process_starts(runtime: Runtime) -> tuple[Any, tuple[Any, ...]]:
    """Kill the one preprocessing process and make every new one die while it starts; the pool and the
    arguments that start a process well."""
    assert runtime.engine is not None
    processes = runtime.engine._preprocessing._processes
    assert processes is not None
    (worker,) = processes._idle
    worker.process.kill()
    worker.process.join()
    working = processes._worker_args
    preload, limit, initializer, _ = working
    processes._worker_args = (preload, limit, initializer, ("{not a tokenizer",))
    return processes, working


async def _refused(client: httpx.AsyncClient, seed: int) -> None:
    refused = await client.post("/v1/embed", json={"documents": [{"html": page(seed)}]})
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_ready" and "a preprocessing process could not start" in error["message"]


def test_the_code_stamp_names_what_changed(tmp_path: Path) -> None:
    root = _code(tmp_path / "code")
    stamp = CodeStamp(root)
    assert stamp.changed() == []
    _upgrade(root)
    (root / "sub" / "b.py").unlink()
    (root / "sub" / "c.py").write_text("C = 1\n", encoding="utf-8")
    (root / "notes.txt").write_text("not code\n", encoding="utf-8")
    assert stamp.changed() == ["a.py", "sub/b.py", "sub/c.py"]


async def test_pages_refused_for_want_of_a_process_turn_ready_503_until_one_starts(
    settings_for: SettingsFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(preprocess_pool="process", preprocess_workers=1, unhealthy_after_s=300))
    runtime: Runtime = app.state.runtime
    runtime.code = CodeStamp(_code(tmp_path / "code"))  # unchanged: a fault that may pass
    caplog.set_level(logging.INFO, logger="service.api.runtime")
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})).status_code == 200
        processes, working = _no_process_starts(runtime)
        await _refused(client, 2)
        await _refused(client, 3)
        assert (await client.get("/ready")).status_code == 200  # below the threshold (3): traffic decides
        await _refused(client, 4)

        for _ in range(2):  # each asks; the log says it once
            ready = await client.get("/ready")
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready", ready.text
            message = ready.json()["error"]["message"]
            assert "no preprocessing process could start for the last" in message
            assert "died while starting" in message
        said = [
            r.getMessage() for r in caplog.records if "until a preprocessing process starts" in r.getMessage()
        ]
        assert len(said) == 1 and "if it does not pass, restart the server" in said[0], said
        health = await client.get("/health")
        assert health.status_code == 200, health.text  # not for long enough yet

        later = time.monotonic() + 300
        runtime.clock = lambda: later
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "unhealthy"
        assert "no preprocessing process has started for 30" in health.json()["error"]["message"]
        runtime.clock = time.monotonic

        processes._worker_args = working  # the fault passed: a probe page gets a process again
        await ready_until(client, 200, "a probe page was preprocessed")
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(5)}]})).status_code == 200
        assert any("preprocessing processes start again" in r.getMessage() for r in caplog.records)


async def test_with_the_code_changed_on_disk_health_asks_for_a_restart_at_once(
    settings_for: SettingsFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(preprocess_pool="process", preprocess_workers=1, unhealthy_after_s=300))
    runtime: Runtime = app.state.runtime
    code = _code(tmp_path / "code")
    runtime.code = CodeStamp(code)
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})).status_code == 200
        _upgrade(code)  # under the running server: it still runs the old code, new processes the new
        assert (await client.get("/health")).status_code == 200  # processes start: nothing to cure
        _no_process_starts(runtime)
        for seed in (2, 3, 4):
            await _refused(client, seed)

        ready = await client.get("/ready")
        assert ready.status_code == 503 and "no preprocessing process could start" in ready.text
        for _ in range(2):
            health = await client.get("/health")
            assert health.status_code == 503, health.text
            message = health.json()["error"]["message"]
            assert health.json()["error"]["code"] == "unhealthy"
            assert "the code on disk changed since the server started (1 files under" in message
            assert "a.py" in message and "restart the server" in message
        needed = [r for r in caplog.records if "a restart is needed" in r.getMessage()]
        assert len(needed) == 1 and needed[0].levelno == logging.ERROR, needed
