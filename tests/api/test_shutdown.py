"""SIGTERM (or SIGHUP) during load: the server stops accepting, and every request it accepted is answered;
a forced quit (a second Ctrl-C) says what it dropped and exits 130."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.live import ServerProcess, server_process
from tests.api.pages import page
from tests.api.test_server import metric

pytestmark = pytest.mark.slow
HTML = {"content-type": "text/html"}


def server_env(checkpoint: Path, **settings: str) -> dict[str, str]:
    env = {
        "HTMLLM_MODEL_PATH": str(checkpoint),
        "HTMLLM_PREPROCESS_WORKERS": "1",
        "HTMLLM_EXTRACT_WORKERS": "1",
    }
    env.update({f"HTMLLM_{name.upper()}": value for name, value in settings.items()})
    return env


async def hold_requests(
    client: httpx.AsyncClient, server: ServerProcess, requests: int
) -> tuple[list[dict[str, Any]], list[asyncio.Task[httpx.Response]]]:
    """Send `requests` embeds of two documents each and return once the server holds all of them."""
    bodies: list[dict[str, Any]] = [
        {"documents": [{"id": f"{i}-{j}", "html": page(i * 2 + j)} for j in range(2)]}
        for i in range(requests)
    ]
    in_flight = [asyncio.create_task(client.post("/v1/embed", json=body)) for body in bodies]
    deadline = time.monotonic() + 30
    while True:
        text = (await client.get("/metrics")).text
        if metric(text, "htmllm_requests_in_progress", route="/v1/embed") == requests:
            return bodies, in_flight
        assert time.monotonic() < deadline, "the requests never reached the server"
        assert not any(t.done() for t in in_flight), "a request finished before the signal was sent"
        await asyncio.sleep(0.02)


async def stopped_accepting(client: httpx.AsyncClient, server: ServerProcess) -> None:
    """Return once a new connection is refused: the server has taken its stop signal (uvicorn closed its
    listening socket). A second signal sent before that could be handled first (Python runs the handlers
    of pending signals in the order of their numbers: SIGINT before SIGTERM)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.get("/health")
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            # But for ConnectError: the probe's connection was accepted just before the signal, and
            # uvicorn's shutdown closed (or reset) it before reading its request, as it does only once
            # stopping.
            return
        assert time.monotonic() < deadline, f"the server still accepts connections\n{server.output()}"
        await asyncio.sleep(0.05)


async def load_then_signal(
    server: ServerProcess, requests: int, sig: signal.Signals = signal.SIGTERM
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Send `requests` embeds, `sig` once the server holds all of them, and collect every outcome."""
    # One connection per request (no keep-alive), so "accepted" is unambiguous.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        bodies, in_flight = await hold_requests(client, server, requests)
        server.proc.send_signal(sig)
        await stopped_accepting(client, server)  # no longer accepting (a fixed 0.5 s was short under load)
        responses = await asyncio.gather(*in_flight, return_exceptions=True)
    lost = [r for r in responses if isinstance(r, BaseException)]
    assert not lost, f"accepted requests without an answer: {lost}\n{server.output()}"
    return bodies, responses


@pytest.mark.parametrize("inference_process", ["false", "true"])
async def test_sigterm_drains_accepted_requests(tiny_checkpoint: Path, inference_process: str) -> None:
    # The in-flight documents (48) never fill a batch (64), so the batcher holds them for max_wait_ms:
    # SIGTERM lands while every request is certainly still waiting for its answer. With the model in a
    # child process, the child must outlive the signal until the drain has used it.
    env = server_env(
        tiny_checkpoint, max_wait_ms="2000", drain_timeout_s="30", inference_process=inference_process
    )
    with server_process(env) as server:
        bodies, responses = await load_then_signal(server, 24)
        exit_code = server.proc.wait(timeout=60)
    for body, response in zip(bodies, responses, strict=True):
        assert response.status_code == 200, response.text
        assert [d["id"] for d in response.json()["data"]] == [d["id"] for d in body["documents"]]
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown: into the server's handler, so
    # a complete drain exits 0 (it died of the signal, -15, except as a container's PID 1).
    assert exit_code == 0, server.output()


async def test_sigterm_past_the_drain_budget_answers_with_typed_errors(tiny_checkpoint: Path) -> None:
    # The batcher would hold the documents for 20 s, far past the 2 s drain budget: shortly before the
    # budget ends, what is still queued is failed with 503 shutting_down instead of being dropped.
    env = server_env(tiny_checkpoint, max_wait_ms="20000", drain_timeout_s="2")
    with server_process(env) as server:
        started = time.monotonic()
        _, responses = await load_then_signal(server, 8)
        answered_s = time.monotonic() - started
        exit_code = server.proc.wait(timeout=60)
    for response in responses:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "shutting_down"
    assert answered_s < 15
    assert exit_code == 1  # the drain was cut short: what was left got 503


async def test_an_upload_still_coming_at_the_end_of_the_drain_is_answered_503(tiny_checkpoint: Path) -> None:
    """A client uploading slowly at SIGTERM (its body timeout longer than the drain) was cancelled by
    uvicorn's graceful timeout with a bare plain-text 500; now it gets the typed 503 and a closed
    connection before the drain budget ends, and can send the page elsewhere."""
    env = server_env(tiny_checkpoint, drain_timeout_s="2", body_timeout_s="60")
    with server_process(env) as server:
        host, port = server.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = page(1).encode()
        writer.write(
            b"POST /v1/embed HTTP/1.1\r\nhost: x\r\ncontent-type: text/html\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        await writer.drain()
        await asyncio.sleep(0.3)
        server.proc.send_signal(signal.SIGTERM)
        answer = await asyncio.wait_for(reader.read(), timeout=20)  # until the server closes
        writer.close()
        exit_code = server.proc.wait(timeout=60)
        output = server.output()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer[:300]
    assert b"connection: close" in head.lower() and b"retry-after" in head.lower()
    assert b'"code":"shutting_down"' in payload
    assert exit_code == 1  # an upload cut off by the end of the drain: not a complete drain
    # Logged with its request id, as the exception handler's 503s are (this one is answered before it).
    rid = next(line for line in head.decode().splitlines() if line.lower().startswith("x-request-id:"))
    said = f"POST /v1/embed answered 503 shutting_down (request {rid.split(':', 1)[1].strip()})"
    assert said in output, output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_clean_stop_exits_0_without_a_traceback(tiny_checkpoint: Path, sig: signal.Signals) -> None:
    """uvicorn raises the signal that stopped it again once it has shut down, for the handler it found:
    a drained server died of SIGTERM (-15) or ended in a KeyboardInterrupt traceback after Ctrl-C."""
    with server_process(server_env(tiny_checkpoint, drain_timeout_s="5")) as server:
        assert (
            httpx.post(server.url + "/v1/embed", content=page(0), headers=HTML, timeout=30).status_code == 200
        )
        server.proc.send_signal(sig)
        exit_code = server.proc.wait(timeout=60)
        output = server.output()
    assert exit_code == 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output


async def test_sighup_drains_accepted_requests_as_sigterm_does(tiny_checkpoint: Path) -> None:
    """The terminal or SSH session of `make serve` / `htmllm serve` closed, or a supervisor's hang-up:
    SIGHUP's default action had ended the server on the spot (status 129, no line), each accepted request
    dropped. It drains as SIGTERM does now, says which signal stopped it, and exits 0."""
    env = server_env(tiny_checkpoint, max_wait_ms="2000", drain_timeout_s="30", log_level="info")
    with server_process(env) as server:
        bodies, responses = await load_then_signal(server, 8, signal.SIGHUP)
        exit_code = server.proc.wait(timeout=60)
        output = server.output()
    for body, response in zip(bodies, responses, strict=True):
        assert response.status_code == 200, response.text
        assert [d["id"] for d in response.json()["data"]] == [d["id"] for d in body["documents"]]
    assert exit_code == 0, output
    assert "SIGHUP (the terminal or session hung up): shutting down gracefully" in output, output
    assert "Traceback" not in output, output


def test_an_ignored_sighup_stays_ignored_while_serving(tiny_checkpoint: Path) -> None:
    """`nohup htmllm serve`: the server goes on serving after a hang-up, and SIGTERM still drains it."""
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "from service.api import main\n"
        "sys.exit(main.main())\n"
    )
    with server_process(server_env(tiny_checkpoint, log_level="info"), script=script) as server:
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGHUP - 1)), status  # the kernel discards it: nothing can run
        server.proc.send_signal(signal.SIGHUP)
        assert (
            httpx.post(server.url + "/v1/embed", content=page(0), headers=HTML, timeout=30).status_code == 200
        )
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(timeout=60)
        output = server.output()
    assert exit_code == 0, output
    assert "SIGHUP" not in output and "SIGTERM: shutting down gracefully" in output, output


async def forced_quit(
    server: ServerProcess, requests: int, first: signal.Signals
) -> tuple[list[Any], int, str]:
    """`first`, then a Ctrl-C once the server has taken it, with `requests` embeds held: what each request
    got, the exit status and the server's output."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        _, in_flight = await hold_requests(client, server, requests)
        server.proc.send_signal(first)
        await stopped_accepting(client, server)
        server.proc.send_signal(signal.SIGINT)
        responses = await asyncio.gather(*in_flight, return_exceptions=True)
    exit_code = await asyncio.to_thread(server.proc.wait, 60)
    return responses, exit_code, server.output()


@pytest.mark.parametrize(
    ("first", "said_first"),
    [(signal.SIGINT, "again"), (signal.SIGTERM, "after SIGTERM"), (signal.SIGHUP, "after SIGHUP")],
    ids=["ctrl-c-twice", "sigterm-then-ctrl-c", "sighup-then-ctrl-c"],
)
async def test_a_forced_quit_says_what_it_dropped_and_exits_130(
    tiny_checkpoint: Path, first: signal.Signals, said_first: str
) -> None:
    """A second Ctrl-C is uvicorn's force quit: it stops waiting for the requests in flight and skips the
    engine's drain. That had exited 0 without a word, the status that says every accepted request was
    answered; now a warning names both signals (it had said "again" after a SIGTERM or a hang-up too),
    counts what was dropped, and the status is 130."""
    # The batcher holds the documents for 20 s: both signals land while every request waits.
    env = server_env(tiny_checkpoint, max_wait_ms="20000", drain_timeout_s="30", log_level="info")
    with server_process(env) as server:
        responses, exit_code, output = await forced_quit(server, 4, first)
    assert all(isinstance(r, httpx.TransportError) for r in responses), (responses, output)
    assert exit_code == 130, output
    said = (
        f"SIGINT (Ctrl-C) {said_first}: forced quit before the drain was done: 4 requests in flight are "
        "dropped without an answer (8 documents not yet embedded, 0 extraction jobs not yet done) and the "
        "engine is not drained; exiting with status 130"
    )
    assert said in output, output


# `python -m service.api` whose forward passes announce themselves in the file PASS_BEGAN, then take
# PASS_S seconds: a pass that no drain budget can wait for, as a large checkpoint's on CPU.
SLOW_PASS = """
import os, sys, time
from service.api import main
from service.engine.runners import torch as torch_runner

real_run = torch_runner.TorchRunner.run

def run(self, prepared):
    with open(os.environ["PASS_BEGAN"], "a") as began:
        began.write("pass\\n")
    time.sleep(float(os.environ["PASS_S"]))
    return real_run(self, prepared)

torch_runner.TorchRunner.run = run
sys.exit(main.main())
"""


def _children(pid: int) -> set[int]:
    """The processes `pid` started and that still run (its preprocessing workers, their forkserver)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return "?"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by the init it was handed to, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_drain_cut_short_ends_the_process_without_waiting_for_the_pass_in_flight(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The drain budget (2 s) ends with a forward pass of 120 s in flight: its documents are answered 503
    then, and the process exits at once with status 1, its logs flushed and its preprocessing processes
    ended. It had waited for the pass (the inference thread, which nothing can stop, joined at exit: in a
    pod, the kubelet's SIGKILL once the grace period ran out)."""
    began = tmp_path / "began"
    env = server_env(
        tiny_checkpoint, drain_timeout_s="2", warmup="false", preprocess_pool="process", log_level="info"
    )
    env.update({"PASS_BEGAN": str(began), "PASS_S": "120"})
    with server_process(env, script=SLOW_PASS) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            answer = asyncio.ensure_future(client.post("/v1/embed", content=page(0), headers=HTML))
            deadline = time.monotonic() + 30
            while not began.exists():
                assert time.monotonic() < deadline and not answer.done(), server.output()
                await asyncio.sleep(0.02)
            children = _children(server.proc.pid)
            assert children, "no preprocessing processes to check"
            server.proc.send_signal(signal.SIGTERM)
            response = await answer
        # Well within the pass's 120 s: the drain's 2 s and the exit.
        exit_code = await asyncio.to_thread(server.proc.wait, 30)
        output = server.output()
    assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down", output
    assert exit_code == 1, output
    assert "Finished server process" in output  # the logs were flushed before the exit
    # The forkserver and multiprocessing's resource tracker end on their own once their pipe to the
    # server closes, a moment after it exited; the workers are killed before it exits.
    deadline = time.monotonic() + 10
    while (left := {child: _command(child) for child in children if _alive(child)}) and (
        time.monotonic() < deadline
    ):
        await asyncio.sleep(0.05)
    assert not left, f"{left}\n{output}"
