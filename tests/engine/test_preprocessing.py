"""The Engine's preprocessing pools on their own: what the Engine's lifecycle relies on them for."""

from __future__ import annotations

import pytest

from service.engine.preprocessing import Preprocessing
from service.engine.types import Document, EngineConfig, ShuttingDownError
from tests.factories.tokenizer import build_tiny_tokenizer


def _pools() -> Preprocessing:
    return Preprocessing(build_tiny_tokenizer(), EngineConfig(preprocess_workers=1), max_length=64)


async def test_close_is_idempotent_and_safe_before_start() -> None:
    """A stop finds no pools (never started, or a cancelled stop already closed them) and closes anyway."""
    pools = _pools()
    await pools.close()
    await pools.start()
    assert pools.threads is not None
    await pools.close()
    await pools.close()
    assert pools.threads is None


async def test_a_call_admitted_before_a_stop_is_shutting_down_not_run_on_the_next_start() -> None:
    """A call runs on the threads it was admitted to: after a stop (and a new start) it is answered
    ShuttingDownError, not served by pools that the engine's next start built."""
    pools = _pools()
    await pools.start()
    admitted = pools.threads
    assert admitted is not None
    await pools.close()
    await pools.start()
    try:
        with pytest.raises(ShuttingDownError):
            await pools.prepare(admitted, Document("<p>hello</p>"), truncate=True)
        with pytest.raises(ShuttingDownError):
            await pools.preprocess(admitted, Document("<p>hello</p>"))
        current = pools.threads
        assert current is not None and current is not admitted
        prepared = await pools.prepare(current, Document("<p>hello</p>"), truncate=True)
        assert len(prepared.ids) > 2
    finally:
        await pools.close()


async def test_a_start_that_fails_part_way_closes_what_it_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that cannot start fails the start; the pools it had built are closed then, not left
    for a second start to replace (the first pools, their processes included, leaked)."""
    from service.core import workers

    built: list[workers.WorkerPool] = []
    real_init = workers.WorkerPool.__init__

    def tracked_init(self: workers.WorkerPool, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        built.append(self)

    def cannot_start(self: workers.WorkerPool) -> None:
        raise workers.WorkerStartError("no process today")

    monkeypatch.setattr(workers.WorkerPool, "__init__", tracked_init)
    monkeypatch.setattr(workers.WorkerPool, "prestart", cannot_start)
    pools = Preprocessing(
        build_tiny_tokenizer(), EngineConfig(preprocess_workers=1, preprocess_pool="process"), max_length=64
    )
    with pytest.raises(workers.WorkerStartError):
        await pools.start()
    assert pools.threads is None
    assert len(built) == 1 and built[0]._closed


@pytest.mark.parametrize("timeout_s", [20.0, None])
async def test_processes_under_a_time_limit_leave_the_name_lookup_check_to_it(
    timeout_s: float | None,
) -> None:
    """The pools tell their processes whether a time limit stops them: under one, a page whose names
    share a hash bucket (about 0.4 s to parse here) is pruned; without one it is refused, as threads do."""
    from service.core.prune import TooManyNamesError
    from tests.factories.names import colliding_names

    names = colliding_names(3000, 5)
    page = b"".join(b"<br " + name + b">" for name in names) + (b"<br " + names[-1] + b">x") * 60_000
    config = EngineConfig(preprocess_workers=1, preprocess_pool="process", preprocess_timeout_s=timeout_s)
    pools = Preprocessing(build_tiny_tokenizer(), config, max_length=64)
    await pools.start()
    try:
        threads = pools.threads
        assert threads is not None
        if timeout_s is None:
            with pytest.raises(TooManyNamesError):
                await pools.prepare(threads, Document(page), truncate=True)
        else:
            assert (await pools.prepare(threads, Document(page), truncate=True)).truncated
    finally:
        await pools.close()
