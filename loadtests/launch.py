"""Starting and stopping the two processes of a load test: the server on 127.0.0.1, and headless locust.

The driver only ever serves on, and sends load to, `HOST`: the load test measures a server it started
itself, with the settings it was given, and cannot be aimed at someone else's. That is checked, not
assumed: a port something already listens on is refused before the start (`port_in_use`), and /ready
counts only once the listening socket is the started server's own (`port_holder`), since any server on
the port answers 200 there. Locust runs in its own process because importing it monkey-patches the
standard library with gevent; `watch_run` ends it when the server exits under it.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

from loadtests.procfs import listening_sockets, process_tree, socket_inodes

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # the only host this script serves on or sends load to


def free_port() -> int:
    """A port on `HOST` that nothing listens on now (the OS picks it), for the server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def server_setting(text: str) -> str:
    """`--server-env`: an HTMLLM_NAME=VALUE the driver does not choose itself (a usage error, exit 2,
    otherwise: it had been a SystemExit with a message, exit 1, after the options were accepted)."""
    name, sep, _ = text.partition("=")
    if not sep or not name.startswith("HTMLLM_") or name == "HTMLLM_":
        raise argparse.ArgumentTypeError(f"takes HTMLLM_NAME=VALUE, not {text!r}")
    if name in ("HTMLLM_HOST", "HTMLLM_PORT"):
        raise argparse.ArgumentTypeError(f"{name} is chosen by this script (127.0.0.1 only; --port)")
    return text


def server_environment(args: argparse.Namespace, port: int) -> dict[str, str]:
    """The server's environment: this process's, `--server-env` (checked by `server_setting`), `--model`,
    and the host and port."""
    env = dict(os.environ)
    for item in args.server_env:
        name, _, value = server_setting(item).partition("=")
        env[name] = value
    env["HTMLLM_HOST"] = HOST
    env["HTMLLM_PORT"] = str(port)
    if args.model is not None:
        env["HTMLLM_MODEL_PATH"] = str(args.model.resolve())
    return env


def port_in_use(port: int) -> str | None:
    """Why the server could not bind `HOST:port`, or None. Binds as uvicorn does (SO_REUSEADDR), so a
    port with connections in TIME_WAIT is free and one something listens on (on `HOST` or on every
    address) is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{HOST}:{port} is already in use (another server listens there)"
            return f"cannot bind {HOST}:{port}: {exc.strerror or exc}"
    return None


PortHolder = Literal["ours", "other", "none"]


def port_holder(port: int, pid: int) -> PortHolder | None:
    """Who listens on `HOST:port`: the process `pid` or one of its descendants ("ours"), a process
    outside that tree ("other"), nobody yet ("none"); None where /proc cannot tell (not Linux).

    A listener on every address (0.0.0.0) answers `HOST` too, and while one is there the server cannot
    bind `HOST` itself: it counts as another's unless it is ours."""
    listeners = listening_sockets(port)
    if listeners is None:
        return None
    answering = {inode for inode, address in listeners.items() if address in (HOST, "0.0.0.0")}
    if not answering:
        return "none"
    ours = answering & socket_inodes(process_tree(pid))
    return "ours" if ours and ours == answering else "other"


def locust_environment(server_env: dict[str, str]) -> dict[str, str]:
    """Locust's environment: this process's, the repository on PYTHONPATH, and the server's API key.

    The locustfile sends `HTMLLM_API_KEY` as its bearer token. A key given as `--server-env
    HTMLLM_API_KEY=...` is in the server's environment only; unless it is passed on, every request of
    the run gets 401.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if "HTMLLM_API_KEY" in server_env:
        env["HTMLLM_API_KEY"] = server_env["HTMLLM_API_KEY"]
    return env


def get_json(url: str, timeout: float = 5.0) -> Any:
    """The JSON body of a GET (the server's /info, read once it is ready)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_ready(base: str, port: int, server: subprocess.Popen[bytes], timeout: float) -> None:
    """Until the server this run started answers /ready with 200; fail as soon as it exits, or as soon as
    another process listens on its port.

    /ready is asked only once the listening socket is the server's own (`port_holder`): another server
    on the port (the port given as --port, or one taken between `free_port` and the bind) had answered
    200 within a second, the run had loaded that one and passed, and this run's server had been stopped
    while it still loaded its model."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode} before it was ready")
        holder = port_holder(port, server.pid)
        if holder == "other":
            raise SystemExit(
                f"another process listens on {HOST}:{port}, not the server this run started: it would "
                "have been the one loaded (rerun; with --port, choose a free port)"
            )
        if holder != "none":  # ours, or /proc cannot tell (not Linux): ask
            try:
                with urllib.request.urlopen(f"{base}/ready", timeout=2) as response:
                    if response.status == 200 and server.poll() is None:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
        time.sleep(0.5)  # the server is loading and warming its model; nothing to wait on but the port
    raise SystemExit(f"the server was not ready after {timeout:.0f} s")


def start_server(env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`python -m service.api` from the repository, with `env` (see `server_environment`), output to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "service.api"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def _terminate(process: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM, then SIGKILL if it outlives `grace` seconds; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def stop_server(server: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM (the server drains its queue), then SIGKILL if it outlives `grace` seconds."""
    return _terminate(server, grace)


def locust_command(args: argparse.Namespace, base: str, out: Path) -> list[str]:
    """Locust headless against `base`, bounded by the driver's options, its reports written under `out`."""
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "loadtests" / "locustfile.py"),
        "--headless",
        "--users",
        str(args.users),
        "--spawn-rate",
        str(args.spawn_rate),
        "--run-time",
        f"{args.run_time}s",
        "--host",
        base,
        "--csv",
        str(out / "locust"),
        "--csv-full-history",  # per-entry rows in locust_stats_history.csv, not only "Aggregated"
        "--html",
        str(out / "report.html"),
        "--only-summary",
        "--stop-timeout",
        "30",
        "--loglevel",
        "WARNING",
        "--page-pool",
        str(args.page_pool),
        "--docs-per-request",
        str(args.docs_per_request),
        "--raw-share",
        str(args.raw_share),
        "--final-csv",
        str(out / "summary.csv"),
        "--failures-csv",
        str(out / "failures.csv"),
    ]
    if args.corpus:
        command += ["--corpus", str(Path(args.corpus).resolve())]
    return command


def start_locust(
    args: argparse.Namespace, base: str, out: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Locust headless against `base` (see `locust_command`), started; `watch_run` waits for it."""
    return subprocess.Popen(locust_command(args, base, out), cwd=ROOT, env=env)


class ServerExit(NamedTuple):
    """A server that exited while the load ran: its status and when, in seconds into the run."""

    status: int
    seconds: float


def watch_run(
    locust: subprocess.Popen[bytes],
    server: subprocess.Popen[bytes],
    started: float,
    *,
    poll_s: float = 0.5,
    locust_grace: float = 60.0,
) -> ServerExit | None:
    """Until locust ends; None if the server lived through it. A server that exits first ends locust
    (SIGTERM: it quits and writes its reports) and is returned: locust had gone on posting to a closed
    port for the rest of the run, each post a failure of 1 ms, and the report had shown a fast server."""
    while True:
        try:
            locust.wait(timeout=poll_s)
            return None
        except subprocess.TimeoutExpired:
            pass
        if server.poll() is not None:
            exited = ServerExit(server.returncode, round(time.monotonic() - started, 1))
            stop_locust(locust, locust_grace)
            return exited


def stop_locust(locust: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM (locust quits and writes its reports and the final CSVs), then SIGKILL after `grace`."""
    _terminate(locust, grace)
