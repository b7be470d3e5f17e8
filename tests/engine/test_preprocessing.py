"""The Engine's preprocessing pools on their own: what the Engine's lifecycle relies on them for."""

from __future__ import annotations

import os
import sys

import pytest

from service.engine.preprocessing import LOST_PROCESS_RETRIES, Preprocessing
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


async def test_a_process_killed_from_outside_under_a_page_is_replaced_and_the_page_prepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The OOM killer's SIGKILL under a page made it `preprocess_failed`: a 422 that called a good page
    bad, and in `htmllm embed` a row no resume redid. It is tried again in a fresh process."""
    from tests.factories.worker_kills import kill_workers_holding

    page = Document("<p>killed under this page</p>")
    config = EngineConfig(preprocess_workers=1, preprocess_pool="process")
    pools = Preprocessing(build_tiny_tokenizer(), config, max_length=64)
    await pools.start()
    try:
        threads = pools.threads
        assert threads is not None
        expected = await pools.prepare(threads, page, truncate=True)
        killed = kill_workers_holding(monkeypatch, b"killed under this page", kills=LOST_PROCESS_RETRIES)
        prepared = await pools.prepare(threads, page, truncate=True)
        assert len(killed) == LOST_PROCESS_RETRIES and prepared.ids == expected.ids
    finally:
        await pools.close()


async def test_a_page_whose_process_is_killed_in_every_try_is_a_retryable_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a 422 `preprocess_failed` (the page is bad): `not_ready`, a 503 with Retry-After, which a
    client retries; the page's copies in the result cache are not told it either."""
    from service.api.errors import RETRYABLE, STATUS
    from service.core.errors import ErrorCode
    from service.engine.failures import PAGE_FAILURES, ProcessLostError, failed_document
    from tests.factories.worker_kills import kill_workers_holding

    page = Document("<p>killed under this page</p>")
    config = EngineConfig(preprocess_workers=1, preprocess_pool="process")
    pools = Preprocessing(build_tiny_tokenizer(), config, max_length=64)
    await pools.start()
    try:
        threads = pools.threads
        assert threads is not None
        tries = LOST_PROCESS_RETRIES + 1
        killed = kill_workers_holding(monkeypatch, b"killed under this page", kills=2 * tries)
        for call in (pools.prepare(threads, page, truncate=True), pools.preprocess(threads, page)):
            with pytest.raises(ProcessLostError) as lost:
                await call
            assert lost.value.code is ErrorCode.NOT_READY and "killed from outside" in lost.value.message
            assert STATUS[lost.value.code] == 503 and lost.value.code in RETRYABLE
            assert lost.value.code not in PAGE_FAILURES and failed_document(lost.value) is None
        assert len(killed) == 2 * tries and len(set(killed)) == len(killed)  # each try in a fresh process
        assert (await pools.prepare(threads, Document("<p>fine</p>"), truncate=True)).ids
    finally:
        await pools.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap on Linux")
async def test_a_page_too_large_for_a_process_to_take_in_names_the_limit_as_set() -> None:
    """Held to 16 MiB over its idle data, a process cannot take in a 64 MiB page: a typed 413 that names
    the limit as a library caller sets it (`EngineConfig`) and as a server's operator does; the message
    had named only the service's environment variable, which does nothing for an Engine."""
    from service.core.prune import InputTooLargeError
    from tests.memory import vm_data_mib

    probe = Preprocessing(
        build_tiny_tokenizer(), EngineConfig(preprocess_workers=1, preprocess_pool="process"), max_length=64
    )
    await probe.start()
    try:
        assert probe._processes is not None
        idle_mib = probe._processes.call(vm_data_mib, (), timeout_s=60)
    finally:
        await probe.close()
    config = EngineConfig(
        preprocess_workers=1, preprocess_pool="process", preprocess_memory_limit_mb=idle_mib + 16
    )
    pools = Preprocessing(build_tiny_tokenizer(), config, max_length=64)
    await pools.start()
    try:
        threads = pools.threads
        assert threads is not None
        with pytest.raises(InputTooLargeError) as refused:
            await pools.prepare(threads, Document(os.urandom(64 * 2**20)), truncate=True)
        assert refused.value.message == (
            "the page needs more memory than a preprocessing process may use "
            f"({idle_mib + 16} MiB, EngineConfig.preprocess_memory_limit_mb, "
            "HTMLLM_PREPROCESS_MEMORY_LIMIT_MB in the service)"
        )
        assert (await pools.prepare(threads, Document("<p>fine</p>"), truncate=True)).ids
    finally:
        await pools.close()
