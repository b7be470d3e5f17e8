"""What every test must leave as it found it in the test process itself."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _sigint_left_to_python() -> Iterator[None]:
    """A test that leaves Ctrl-C (or SIGTERM, which the bulk commands take as Ctrl-C while they run)
    ignored or caught in this process fails itself, by name.

    `asyncio.run` takes Ctrl-C over only from Python's default handler: after such a test, a later
    test's Ctrl-C did nothing (`htmllm embed` ran to the end), far from the cause.
    """
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in before.items():
        after = signal.getsignal(number)
        assert after is handler, f"the test left {number.name}'s handler {handler!r} as {after!r}"
