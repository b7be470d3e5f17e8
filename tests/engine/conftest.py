"""Shared engine fixtures: one tiny checkpoint per session and documents of many lengths."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.core.checkpoint import load_checkpoint
from service.core.preparation import Prepared
from service.engine.engine import Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.torch import TorchRunner
from service.engine.types import Document
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.factories.pages import make_pages


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("engine") / "tiny")


@pytest.fixture
def pages() -> list[str]:
    return make_pages(24)


class SlowTorchRunner(TorchRunner):
    """The real torch runner, slowed and instrumented, to observe queueing and overlap."""

    def __init__(self, *args: object, delay_s: float = 0.2, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.delay_s = delay_s
        self.events: list[tuple[str, float, int]] = []  # (what, monotonic time, batch size)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        self.events.append(("prepare", time.monotonic(), len(batch)))
        return super().prepare(batch, pad_to=pad_to)

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.events.append(("run_start", time.monotonic(), prepared.documents))
        time.sleep(self.delay_s)
        out = super().run(prepared)
        self.events.append(("run_end", time.monotonic(), prepared.documents))
        return out


def slow_runner(checkpoint: Path, delay_s: float = 0.2) -> tuple[SlowTorchRunner, object]:
    ckpt = load_checkpoint(checkpoint)
    return SlowTorchRunner(ckpt.model, delay_s=delay_s), ckpt


# How long a held prepare waits for `release` at most: longer than any wait of the tests, which let it go.
HOLD_S = 300


@dataclass
class HeldPrepare:
    """What `hold_first_prepare` gives a test: `started` once the first page is held, `release` to let it
    go, and `calls`, the prepares so far (the held one included)."""

    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    calls: int = 0


def hold_first_prepare(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> HeldPrepare:
    """Hold the engine's first page on its preprocessing thread until `release` (a parse stuck in C code
    looks like this; copies of the page wait behind it), then prepare it as usual; count every prepare."""
    held = HeldPrepare()
    real = engine._preprocessing._prepare

    lock = threading.Lock()  # (prepares run on several threads)

    def prepare(doc: Document, truncate: bool) -> Prepared:
        with lock:
            held.calls += 1
            first = held.calls == 1
        if first:
            held.started.set()
            held.release.wait(HOLD_S)
        return real(doc, truncate)

    monkeypatch.setattr(engine._preprocessing, "_prepare", prepare)
    return held
