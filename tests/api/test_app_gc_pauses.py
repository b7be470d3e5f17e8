"""`htmllm_gc_pause_seconds` times the collections of a serving server, not the one the freeze runs.

`prepare_for_serving` runs one full collection on purpose before it freezes what was loaded (0.1 to
0.25 s in a server: every object of torch and the model). Timed, it was the one slow full collection of
a healthy server, and the documented GC alert (`histogram_quantile(0.99, ...{generation="2"}) > 0.1`,
docs/deployment.md) paged on every pod start until a hundred periodic collections outnumbered it.
"""

from __future__ import annotations

import asyncio
import gc
import re

from prometheus_client import generate_latest

from service.api.app import create_app
from service.api.runtime import Runtime
from tests.api.conftest import SettingsFactory


def _full_collections(runtime: Runtime) -> float:
    text = generate_latest(runtime.metrics.registry).decode()
    found = re.search(r'^htmllm_gc_pause_seconds_count\{generation="2"\} (\S+)$', text, re.MULTILINE)
    assert found is not None, text
    return float(found.group(1))


async def test_the_freezes_full_collection_is_not_timed_and_every_later_one_is(
    settings_for: SettingsFactory,
) -> None:
    app = create_app(settings_for())
    runtime: Runtime = app.state.runtime
    async with app.router.lifespan_context(app):
        for _ in range(12000):  # a bound of a minute: the tiny model warms up in well under a second
            if runtime.ready:
                break
            await asyncio.sleep(0.005)
        assert runtime.ready and runtime.collector is not None  # frozen: the freeze's collection ran
        # Read as soon as it is ready: the periodic full collections begin a second later.
        assert _full_collections(runtime) == 0
        gc.collect()  # a full collection while serving
        assert _full_collections(runtime) == 1
