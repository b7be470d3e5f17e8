"""The server's start reads the API keys once: a key file holding no key is one warning, not two.

The command line's start reads them before the model loads (a bad key file fails in a moment, not after
the load), and the app it then built read them again: each reading logged what it found, so a pod
restarted mid-rotation (the file emptied, `HTMLLM_API_KEY` still set) said "holds no key" twice. The
start is the real one, up to the point where uvicorn would take over (`_start`).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest

from service.api import main as api_main
from service.api.runtime import Runtime
from tests.api.conftest import tiny_settings


def test_a_key_file_holding_no_key_is_said_once_at_start(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# every file key revoked; HTMLLM_API_KEY still opens the model routes\n")
    settings = tiny_settings(tiny_checkpoint, api_key="fixed-key", api_key_file=key_file, log_level="warning")
    caplog.set_level(logging.INFO, logger="service.api.api_keys")
    with contextlib.ExitStack() as unserved:  # what the start built is released here (the engine, the port)
        started = api_main._start(lambda: settings, unserved)
        assert not isinstance(started, int), started
        _, runtime, _ = started
        assert isinstance(runtime, Runtime)
        assert runtime.api_keys.enabled and runtime.api_keys.accepts("fixed-key")
    said = [r for r in caplog.records if "holds no key" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, said
    assert "only HTMLLM_API_KEY is accepted" in said[0].getMessage()
