"""Starting and stopping the two processes of a load test: the server on 127.0.0.1, and headless locust.

The driver only ever serves on, and sends load to, `HOST`: the load test measures a server it started
itself, with the settings it was given, and cannot be aimed at someone else's. Locust runs in its own
process because importing it monkey-patches the standard library with gevent.
"""

from __future__ import annotations

import argparse
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
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # the only host this script serves on or sends load to


def free_port() -> int:
    """A port on `HOST` that nothing listens on now (the OS picks it), for the server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def server_environment(args: argparse.Namespace, port: int) -> dict[str, str]:
    """The server's environment: this process's, `--server-env`, `--model`, and the host and port."""
    env = dict(os.environ)
    for item in args.server_env:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("HTMLLM_"):
            raise SystemExit(f"--server-env takes HTMLLM_NAME=VALUE, not {item!r}")
        if name in ("HTMLLM_HOST", "HTMLLM_PORT"):
            raise SystemExit(f"{name} is chosen by this script (127.0.0.1 only)")
        env[name] = value
    env["HTMLLM_HOST"] = HOST
    env["HTMLLM_PORT"] = str(port)
    if args.model is not None:
        env["HTMLLM_MODEL_PATH"] = str(args.model.resolve())
    return env


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


def wait_ready(base: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    """Until /ready answers 200; fail as soon as the server process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=2) as response:
                if response.status == 200:
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


def stop_server(server: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM (the server drains its queue), then SIGKILL if it outlives `grace` seconds."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return server.returncode


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
    ]
    if args.corpus:
        command += ["--corpus", str(Path(args.corpus).resolve())]
    return command


def run_locust(
    args: argparse.Namespace, base: str, out: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    """Locust headless against `base` until its run time is over (see `locust_command`)."""
    return subprocess.run(locust_command(args, base, out), cwd=ROOT, env=env, check=False)
