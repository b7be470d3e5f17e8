"""What every test must leave as it found it in the test process itself."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the tests, however the suite was started.

    A command started in the background by a shell without job control (`make test &`, `nohup ... &`,
    a CI step run that way) inherits SIGINT ignored, and Python then leaves it ignored (it installs its
    KeyboardInterrupt handler only over the default disposition): the tests that stand for a user's
    Ctrl-C (`htmllm embed`'s, the Engine's) raised SIGINT into nothing and saw the run finish (status 0,
    every document written), in such runs only (sessions 26 and 28; never in a foreground run).
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


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


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The garbage collector off, then back as it was: for tests that a failed request's page is freed
    by reference counting alone (a serving process all but never runs a full collection)."""
    gc.collect()  # what earlier tests left, so that only this test's garbage is in question
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
