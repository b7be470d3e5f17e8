"""The model's process and the signals sent to the whole process group (a terminal's Ctrl-C or hang-up,
a group's SIGTERM): it starts with them held back (`group_signals_held`) and ignores them; a signal held
back while it was being started, raised in the parent as soon as the start is done, does not leave it
loading the model for nobody."""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.core.processes import group_signals_held
from service.engine.runners import process as process_module
from service.engine.runners.process import ProcessRunner
from service.engine.types import EngineConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_signal_held_while_the_model_process_started_leaves_no_child_loading(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process whose other threads all block it too, a Ctrl-C (or the server's SIGTERM during its
    start) that comes while the child is spawned is raised as the start's mask is restored, the child
    started: it is killed and reaped then, not left to load the model for nobody while multiprocessing's
    exit handler waits for it (it ignores SIGTERM)."""
    spawned: list[int] = []
    spawn = multiprocessing.util.spawnv_passfds

    def recorded(path: Any, args: Any, passfds: Any) -> int:
        pid = spawn(path, args, passfds)
        if "--multiprocessing-fork" in args:  # the model's process, not the resource tracker
            spawned.append(pid)
        return pid

    @contextlib.contextmanager
    def ctrl_c_as_the_mask_is_restored() -> Iterator[None]:
        with group_signals_held():
            yield
        raise KeyboardInterrupt

    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", recorded)
    monkeypatch.setattr(process_module, "group_signals_held", ctrl_c_as_the_mask_is_restored)
    with pytest.raises(KeyboardInterrupt):
        ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    assert len(spawned) == 1
    assert not os.path.exists(f"/proc/{spawned[0]}")  # exited and reaped (a zombie keeps its entry)
