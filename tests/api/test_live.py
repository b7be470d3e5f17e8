"""The test servers themselves: a child whose port another process took is started again elsewhere."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api import live


@pytest.mark.slow
def test_a_child_whose_port_was_taken_meanwhile_is_started_on_another(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # what another process does between free_port() and the child's bind
        ports: Iterator[int] = iter([taken.getsockname()[1], live.free_port()])
        monkeypatch.setattr(live, "free_port", lambda: next(ports))
        env = {"HTMLLM_MODEL_PATH": str(tiny_checkpoint), "HTMLLM_PREPROCESS_WORKERS": "1"}
        with live.server_process(env | {"HTMLLM_EXTRACT_WORKERS": "1"}) as server:
            assert not server.url.endswith(f":{taken.getsockname()[1]}")
            assert httpx.get(server.url + "/health").status_code == 200
