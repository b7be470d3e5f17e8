"""Stop signals as a terminal or a supervisor sends them: to the whole process group (a hang-up, a
group's SIGTERM), twice (a second Ctrl-C with nothing to force), or once more while the process exits.

A terminal or SSH session that closes sends SIGHUP to every process of the foreground group: the server,
its preprocessing processes, the forkserver they are forked from, multiprocessing's resource tracker and
the model's process. The server drains on it; the others had died of it at once, so each accepted
request that still needed one of them failed (422 "crashed its preprocessing process", 500) while the
server exited 0, with a raw resource tracker warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.api.live import ServerProcess, server_process
from tests.api.pages import page
from tests.api.test_server import metric
from tests.api.test_shutdown import hold_requests, server_env, stopped_accepting

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; forkserver workers"),
]
ROOT = Path(__file__).resolve().parents[2]
HTML = {"content-type": "text/html"}

# `python -m service.api` as the leader of a process group of its own, as a shell starts a foreground
# job: a signal sent to the group reaches it and every process it starts, and nothing else.
GROUP_LEADER = """
import os, sys
os.setsid()
from service.api import main
sys.exit(main.main())
"""


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def forked_workers(server: ServerProcess) -> list[int]:
    """The worker processes the server's forkserver forked: its preprocessing processes before any
    extraction, its extractor processes with preprocessing on threads."""
    forkservers = [
        child for child in _children(server.proc.pid) if "multiprocessing.forkserver" in _command(child)
    ]
    assert len(forkservers) == 1, {child: _command(child) for child in _children(server.proc.pid)}
    workers = _children(forkservers[0])
    assert workers, "no worker process to hold"
    return workers


def _signal_each(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # died of the group's signal
            os.kill(pid, sig)


@pytest.mark.parametrize(
    ("sig", "inference_process"),
    [(signal.SIGHUP, "false"), (signal.SIGHUP, "true"), (signal.SIGTERM, "true")],
    ids=["hang-up", "hang-up-model-process", "group-sigterm-model-process"],
)
async def test_a_signal_to_the_whole_group_drains_every_accepted_request(
    tiny_checkpoint: Path, sig: signal.Signals, inference_process: str
) -> None:
    """Every page of the requests in flight still needs the preprocessing process (stopped with SIGSTOP
    until the signal is sent, so none got through before it), then the model: each request is answered
    200 after the group's signal, and the server exits 0 having lost no process on the way. A worker a
    group's SIGTERM kills is one it kills itself (SIGTERM keeps its default there); its page runs again in
    a fresh one, from the forkserver that outlived it."""
    env = server_env(
        tiny_checkpoint,
        preprocess_pool="process",
        inference_process=inference_process,
        drain_timeout_s="60",
        request_timeout_s="60",
        log_level="info",
    )
    with server_process(env, script=GROUP_LEADER) as server:
        assert os.getpgid(server.proc.pid) == server.proc.pid
        workers = forked_workers(server)
        _signal_each(workers, signal.SIGSTOP)
        try:
            limits = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
                bodies, in_flight = await hold_requests(client, server, 4)
                os.killpg(server.proc.pid, sig)
                await stopped_accepting(client, server)
                _signal_each(workers, signal.SIGCONT)
                responses = await asyncio.gather(*in_flight, return_exceptions=True)
        finally:
            _signal_each(workers, signal.SIGCONT)
        exit_code = await asyncio.to_thread(server.proc.wait, 120)
        output = server.output()
    for body, response in zip(bodies, responses, strict=True):
        assert isinstance(response, httpx.Response), (response, output)
        assert response.status_code == 200, (response.text, output)
        assert [d["id"] for d in response.json()["data"]] == [d["id"] for d in body["documents"]]
    assert exit_code == 0, output
    assert "resource_tracker" not in output and "Traceback" not in output, output
    assert "inference process exited" not in output, output
    if sig == signal.SIGHUP:
        assert "died" not in output, output


# `python -m service.api` that records each stop signal its handlers take, and holds uvicorn's shutdown
# ("Shutting down": no new connections; then it waits for the requests in flight, then the lifespan's
# shutdown drains the engine) until it has taken two, so that the test's second signal lands there.
SECOND_SIGNAL_WHILE_SHUTTING_DOWN = """
import asyncio, os, sys
import uvicorn
from service.api import main

taken = []

def recording(handler):
    def record(self, sig, frame):
        taken.append(sig)
        handler(self, sig, frame)
    return record

main._GracefulStop.signalled = recording(main._GracefulStop.signalled)
main._GracefulStop.uvicorn_signal = recording(main._GracefulStop.uvicorn_signal)
wait_for_requests = uvicorn.Server._wait_tasks_to_complete

async def held(self):
    open(os.environ["SHUTTING_DOWN"], "w").close()
    while len(taken) < 2:
        await asyncio.sleep(0.01)
    await wait_for_requests(self)

uvicorn.Server._wait_tasks_to_complete = held
sys.exit(main.main())
"""


@pytest.mark.parametrize(
    "first", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c-twice", "sigterm", "sighup"]
)
async def test_a_second_ctrl_c_with_every_request_answered_changes_nothing(
    tiny_checkpoint: Path, tmp_path: Path, first: signal.Signals
) -> None:
    """Two Ctrl-C a moment apart on a server whose requests are all answered (or an idle one): the
    second had forced the quit all the same, status 130 and a warning that "0 requests" were dropped,
    skipping the lifespan's shutdown (the engine never closed). Nothing is in flight to force: the clean
    stop goes on and exits 0."""
    shutting_down = tmp_path / "shutting-down"
    env = server_env(tiny_checkpoint, drain_timeout_s="30", log_level="info")
    env["SHUTTING_DOWN"] = str(shutting_down)
    with server_process(env, script=SECOND_SIGNAL_WHILE_SHUTTING_DOWN) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            answered = await client.post("/v1/embed", content=page(0), headers=HTML)
        assert answered.status_code == 200, answered.text
        server.proc.send_signal(first)
        while not shutting_down.exists():
            assert server.proc.poll() is None, server.output()
            await asyncio.sleep(0.02)
        server.proc.send_signal(signal.SIGINT)
        exit_code = await asyncio.to_thread(server.proc.wait, 60)
        output = server.output()
    assert exit_code == 0, output
    assert "forced quit" not in output, output
    assert "Application shutdown complete" in output, output  # the engine drained and closed
    assert "Traceback" not in output, output


# The start of `python -m service.api`, ended by a SIGTERM the moment it first imports pydantic; the
# process then takes the signal SECOND while it exits (an exit handler sends it).
SIGNAL_WHILE_EXITING = """
import atexit, os, runpy, signal, sys

def at_import(event, args):
    global sent
    if event == "import" and args[0] == "pydantic" and not sent:
        sent = True
        os.kill(os.getpid(), signal.SIGTERM)

def signal_again():
    os.kill(os.getpid(), signal.Signals[os.environ["SECOND"]])

sent = False
atexit.register(signal_again)
sys.addaudithook(at_import)
sys.argv = ["python -m service.api"]
runpy.run_module("service.api", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("second", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_second_signal_while_a_stopped_start_exits_keeps_its_status(
    tiny_checkpoint: Path, second: str
) -> None:
    """After "SIGTERM before the server started serving: exiting (status 143)" the interpreter's exit
    took most of a second, with the handlers given back: a second signal then ended the process by its
    default action (-15, -1; a KeyboardInterrupt traceback for Ctrl-C) instead of 143."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
            "HTMLLM_HOST": "127.0.0.1",
            "HTMLLM_PORT": "0",
            "HTMLLM_LOG_LEVEL": "warning",
            "SECOND": second,
        }
    )
    args = [sys.executable, "-c", SIGNAL_WHILE_EXITING]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 143, output
    lines = output.splitlines()
    assert len(lines) == 1 and "SIGTERM before the server started serving: exiting (status 143)" in lines[0]


async def test_a_forced_quit_counts_the_extractions_it_dropped(tiny_checkpoint: Path) -> None:
    """The forced quit's warning counted only the embedding engine's documents: /v1/extract requests in
    flight were said to leave "0 documents" behind. Their extraction jobs (a page and an extractor each)
    are counted too; the extractor process is held with SIGSTOP so that they are all still to do."""
    env = server_env(tiny_checkpoint, preprocess_pool="thread", drain_timeout_s="30", log_level="info")
    with server_process(env) as server:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            started = await client.post("/v1/extract", content=page(100), headers=HTML)  # starts the pool
            assert started.status_code == 200, started.text
            extractors = forked_workers(server)  # the forkserver's only workers: no process pool
            _signal_each(extractors, signal.SIGSTOP)
            try:
                in_flight = [
                    asyncio.create_task(client.post("/v1/extract", content=page(i), headers=HTML))
                    for i in range(3)
                ]
                while metric((await client.get("/metrics")).text, "htmllm_requests_in_progress",
                             route="/v1/extract") < 3:  # fmt: skip
                    assert not any(task.done() for task in in_flight), server.output()
                    await asyncio.sleep(0.02)
                server.proc.send_signal(signal.SIGTERM)
                await stopped_accepting(client, server)
                server.proc.send_signal(signal.SIGINT)
                responses = await asyncio.gather(*in_flight, return_exceptions=True)
            finally:
                _signal_each(extractors, signal.SIGCONT)
        exit_code = await asyncio.to_thread(server.proc.wait, 60)
        output = server.output()
    assert all(isinstance(r, httpx.TransportError) for r in responses), (responses, output)
    assert exit_code == 130, output
    said = (
        "SIGINT (Ctrl-C) after SIGTERM: forced quit before the drain was done: 3 requests in flight are "
        "dropped without an answer (0 documents not yet embedded, 3 extraction jobs not yet done)"
    )
    assert said in output, output
