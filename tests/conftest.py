"""What every test must leave as it found it in the test process itself."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _sigint_left_to_python() -> Iterator[None]:
    """A test that leaves Ctrl-C ignored or caught in this process fails itself, by name.

    `asyncio.run` takes Ctrl-C over only from Python's default handler: after such a test, a later
    test's Ctrl-C did nothing (`htmllm embed` ran to the end), far from the cause.
    """
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    assert after is before, f"the test left SIGINT's handler {before!r} as {after!r}"
