"""Bounded waits for a state that another process or thread brings about (a model child restarted, a
probe's answer): the value `condition` returned once true, or an AssertionError naming `what` once the
bound is past. The bounds are far above what any wait needs (a child's load takes seconds); they only
keep a broken test from hanging the suite."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

WAIT_S = 120.0
POLLS = 24000  # 5 ms apart: two minutes of event-loop turns


def until(condition: Callable[[], Any], what: str, *, bound_s: float = WAIT_S) -> Any:
    """Poll `condition` every 5 ms, blocking, until it returns something true; that value."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def until_async(condition: Callable[[], Any], what: str, *, polls: int = POLLS) -> Any:
    """Poll `condition` every 5 ms of the event loop (a count of turns, not a time) until it returns
    something true; that value."""
    for _ in range(polls):
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def ready_until(client: httpx.AsyncClient, status: int, what: str) -> httpx.Response:
    """Ask `/ready` every 5 ms of the event loop (`POLLS` times at most) until it answers `status`."""
    for _ in range(POLLS):
        response = await client.get("/ready")
        if response.status_code == status:
            return response
        await asyncio.sleep(0.005)
    raise AssertionError(f"/ready never answered {status} ({what}); last: {response.text}")
