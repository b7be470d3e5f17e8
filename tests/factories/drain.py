"""A drain rate that records what it was told, for the batcher's and the engine's admission tests."""

from __future__ import annotations

from service.engine.admission import DrainRate


class RecordingDrain(DrainRate):
    """`DrainRate` with `calls`: "busy", "idle" and "finished N" (N documents), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def busy(self, now: float) -> None:
        self.calls.append("busy")
        super().busy(now)

    def idle(self) -> None:
        self.calls.append("idle")
        super().idle()

    def finished(self, now: float, documents: int) -> None:
        self.calls.append(f"finished {documents}")
        super().finished(now, documents)
