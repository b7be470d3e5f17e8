"""The runner in a child process: what the in-process runner gives, and it outlives its child."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.core.checkpoint import load_checkpoint, read_meta, save_heads
from service.core.errors import CheckpointError, ErrorCode, HtmllmError
from service.core.modeling import HeadSpec, TaskHead
from service.engine.engine import Engine
from service.engine.loading import build_runner
from service.engine.runners import process as process_module
from service.engine.runners.process import (
    InferenceConfigurationError,
    InferenceProcessError,
    ProcessRunner,
    load_failure_code,
)
from service.engine.runners.torch import TorchRunner
from service.engine.types import EngineConfig, ShuttingDownError
from tests.factories.cli import ROOT, cli_env
from tests.factories.pages import make_pages


def _docs(vocab: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(0)
    return [[2, *(rng.randrange(5, vocab) for _ in range(n - 2)), 3] for n in lengths]


def _pass_on_a_thread(
    runner: ProcessRunner, docs: list[list[int]]
) -> tuple[threading.Thread, list[BaseException]]:
    """Start one pass of `docs` on a thread (so the test can act while it waits); the list gets the
    InferenceProcessError it ends with, if any."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(runner.prepare(docs))
        except InferenceProcessError as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


@pytest.fixture(scope="module")
def process_runner(tiny_checkpoint: Path) -> Iterator[ProcessRunner]:
    runner = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    yield runner
    runner.close()


def test_it_gives_what_the_runner_in_this_process_gives(
    process_runner: ProcessRunner, tiny_checkpoint: Path
) -> None:
    local = TorchRunner(load_checkpoint(tiny_checkpoint).model, intra_op_threads=1)
    described = (process_runner.backend, process_runner.attention, process_runner.packed)
    assert described == ("torch", "sdpa", False)
    assert (process_runner.device, process_runner.dtype, process_runner.threads) == ("cpu", "float32", 1)
    docs = _docs(local.model.config.vocab_size, [3, 40, 17, 9])
    prepared = process_runner.prepare(docs, pad_to=48)
    assert (prepared.documents, prepared.tokens, prepared.padded_tokens) == (4, 69, 4 * 48)
    assert process_runner.cost([3, 10, 4]) == local.cost([3, 10, 4]) == 30
    ours, theirs = process_runner.run(prepared), local.run(local.prepare(docs, pad_to=48))
    np.testing.assert_allclose(ours.embeddings, theirs.embeddings, atol=1e-6, rtol=0)
    for head, values in theirs.scores.items():
        np.testing.assert_allclose(ours.scores[head], values, atol=1e-6, rtol=0)


def test_a_child_dead_while_idle_is_replaced_before_the_next_batch(process_runner: ProcessRunner) -> None:
    docs = _docs(100, [5, 8])
    before = process_runner.run(process_runner.prepare(docs)).embeddings
    restarts = process_runner.restarts
    process = process_runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    after = process_runner.run(process_runner.prepare(docs)).embeddings  # nothing was sent: no failure
    assert process_runner.restarts == restarts + 1
    np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)


def test_a_hung_child_is_aborted_its_batch_fails_and_the_next_gets_a_new_one(
    process_runner: ProcessRunner,
) -> None:
    """A stopped child (SIGSTOP: as a driver fault hangs one) held the pass, and the server's shutdown
    with it, forever: `abort` (the batcher's, at the drain deadline) kills it without the pass's lock."""
    docs = _docs(100, [5, 8])
    before = process_runner.run(process_runner.prepare(docs)).embeddings
    restarts = process_runner.restarts
    process = process_runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    thread, failures = _pass_on_a_thread(process_runner, docs)
    thread.join(0.5)
    assert thread.is_alive()  # waiting on the stopped child
    process_runner.abort()
    thread.join(30)
    assert not thread.is_alive() and len(failures) == 1 and "died" in str(failures[0])
    assert "exit code -9" in str(failures[0])  # read after the join: it had said "exit code None"
    after = process_runner.run(process_runner.prepare(docs)).embeddings
    assert process_runner.restarts == restarts + 1
    np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)


def test_abort_kills_a_child_the_pass_is_still_starting(process_runner: ProcessRunner) -> None:
    """The child died while idle and the next pass starts a new one, which hangs while it loads: the
    child was recorded only once it answered, so `abort` (the shutdown's) found nothing to kill and the
    stop waited for START_TIMEOUT_S (900 s)."""
    docs = _docs(100, [5, 8])
    before = process_runner.run(process_runner.prepare(docs)).embeddings
    old = process_runner._process
    assert old is not None
    known = {child.pid for child in multiprocessing.active_children()}
    os.kill(old.pid, signal.SIGKILL)
    old.join(10)
    thread, failures = _pass_on_a_thread(process_runner, docs)
    new: int | None = None
    for _ in range(3000):  # a bound: the new child appears within milliseconds
        fresh = {child.pid for child in multiprocessing.active_children()} - known - {old.pid}
        if fresh:
            new = fresh.pop()
            break
        time.sleep(0.01)
    assert new is not None
    os.kill(new, signal.SIGSTOP)  # hung while loading (a driver fault, a stuck file system)
    try:
        process_runner.abort()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        if thread.is_alive():  # before the fix: let the test end
            os.kill(new, signal.SIGKILL)
            thread.join(30)
    assert len(failures) == 1 and "aborted" in str(failures[0])
    after = process_runner.run(process_runner.prepare(docs)).embeddings  # the abort ended with its pass
    np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)


def test_an_abort_after_its_pass_ended_leaves_the_next_pass_and_the_child_alone(
    process_runner: ProcessRunner,
) -> None:
    """The batcher decides a pass is in flight, then aborts: a pass that ended meanwhile had left the
    abort standing, which killed the idle child and failed the next pass at once (an engine started
    again on the runner). An abort fails only the batches prepared before it."""
    docs = _docs(100, [5, 8])
    before = process_runner.run(process_runner.prepare(docs)).embeddings
    process, restarts = process_runner._process, process_runner.restarts
    assert process is not None
    process_runner.abort()  # late: its pass has ended
    after = process_runner.run(process_runner.prepare(docs)).embeddings
    assert process_runner._process is process and process.is_alive() and process_runner.restarts == restarts
    np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)
    queued = process_runner.prepare(docs)  # a pass asked for before the abort, not yet at the child
    process_runner.abort()
    with pytest.raises(InferenceProcessError, match="aborted"):
        process_runner.run(queued)
    assert process_runner.run(process_runner.prepare(docs)).embeddings.shape[0] == 2
    assert process_runner._process is process and process_runner.restarts == restarts


def test_signals_to_the_process_group_leave_the_child_to_the_parent(process_runner: ProcessRunner) -> None:
    """Ctrl-C (SIGINT) or a SIGTERM to the group must not kill the model before the drain closes it."""
    process = process_runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGINT)
    os.kill(process.pid, signal.SIGTERM)
    assert process_runner.run(process_runner.prepare(_docs(100, [6]))).embeddings.shape[0] == 1
    assert process.is_alive()


def test_a_parent_that_exits_without_closing_stops_its_child(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A Ctrl-C through `htmllm embed` ends the interpreter with the runner never closed: the child,
    which ignores SIGTERM, must still go, and the parent must not wait for it without end (it did:
    multiprocessing's exit handler SIGTERMs daemonic children and joins them with no timeout)."""
    script = tmp_path / "leave.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from service.engine.runners.process import ProcessRunner\n"
        "from service.engine.types import EngineConfig\n"
        "if __name__ == '__main__':  # the child is spawned: it imports this file\n"
        "    runner = ProcessRunner(Path(sys.argv[1]), EngineConfig(intra_op_threads=1))\n"
        "    runner.run(runner.prepare([[2, 7, 3]]))\n"
        "    print(runner._process.pid, flush=True)\n"
        "    sys.exit(0)  # no close()\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_checkpoint)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    child = int(done.stdout.split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_a_checkpoint_the_child_cannot_load_is_a_clear_error(tiny_checkpoint: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InferenceProcessError, match="could not load the model") as caught:
        ProcessRunner(broken, EngineConfig())
    # Typed as the in-process load's failure is, so `htmllm serve` reports it in one line.
    assert isinstance(caught.value, HtmllmError) and caught.value.code is ErrorCode.CHECKPOINT_INVALID


async def test_the_engine_serves_through_it_as_it_does_in_process(tiny_checkpoint: Path) -> None:
    pages = make_pages(12)
    config = EngineConfig(inference_process=True, max_batch_requests=4, intra_op_threads=1)
    runner, _, _ = build_runner(tiny_checkpoint, config)
    assert isinstance(runner, ProcessRunner)
    runner.close()
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        await engine.warmup()
        separate = await engine.embed(pages)
        assert engine.info.attention == "sdpa" and engine.info.backend == "torch"
        child = engine._runner
        assert isinstance(child, ProcessRunner) and child._process is not None
        process = child._process
    engine.close()  # what the server does after its drain
    assert child._process is None and process.exitcode == 0  # asked to stop, not killed
    async with Engine.from_checkpoint(tiny_checkpoint, EngineConfig(max_batch_requests=4)) as engine:
        await engine.warmup()
        here = await engine.embed(pages)
    for a, b in zip(separate, here, strict=True):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-6, rtol=0)
        assert a.tokens == b.tokens and a.scores.keys() == b.scores.keys()


async def test_a_batch_lost_with_the_child_is_a_backend_error_and_the_engine_keeps_serving(
    tiny_checkpoint: Path,
) -> None:
    config = EngineConfig(inference_process=True, intra_op_threads=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        await engine.warmup()
        runner = engine._runner
        assert isinstance(runner, ProcessRunner) and runner._process is not None
        pid = runner._process.pid
        os.kill(pid, signal.SIGSTOP)  # the next batch goes to it and waits
        pending = asyncio.create_task(engine.embed(make_pages(2)))
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)  # dies holding the batch
        with pytest.raises(HtmllmError) as failure:
            await pending
        assert failure.value.code == ErrorCode.BACKEND_FAILED
        results = await engine.embed(make_pages(3))
        assert len(results) == 3 and runner.restarts == 1


async def test_stopping_at_the_deadline_does_not_wait_for_a_hung_child(tiny_checkpoint: Path) -> None:
    """The server's drain deadline (`stop(drain=False)`) with the child hung mid-pass: the pass is
    aborted, its documents get `shutting_down`, and the stop returns (it had waited forever)."""
    config = EngineConfig(inference_process=True, intra_op_threads=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        await engine.warmup()
        runner = engine._runner
        assert isinstance(runner, ProcessRunner) and runner._process is not None
        os.kill(runner._process.pid, signal.SIGSTOP)
        pending = asyncio.create_task(engine.embed(make_pages(2)))
        await asyncio.sleep(0.5)
        await asyncio.wait_for(engine.stop(drain=False), 30)
        with pytest.raises(HtmllmError) as failure:
            await pending
        assert failure.value.code == ErrorCode.SHUTTING_DOWN


def test_a_restart_onto_a_checkpoint_changed_since_is_refused_until_it_is_back(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """A head retrained into the serving checkpoint (`save_heads`), then the child dies: the restarted
    child had loaded the new head, and the parent served its rows under the labels it read at start
    (or failed untyped when their count changed). The restart is refused, typed, while the checkpoint
    differs, and taken again once it is the one the runner started on."""
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    meta = read_meta(served)
    (old,) = [spec for spec in meta.heads if spec.kind == "classification"]
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    try:
        docs = _docs(100, [5, 8])
        before = runner.run(runner.prepare(docs)).embeddings
        wider = HeadSpec(name=old.name, kind="classification", labels=[*old.labels, "forum"], hidden=16)
        save_heads(served, {old.name: (wider, TaskHead(wider, meta.embedding_dim))})
        _kill_child(runner)
        with pytest.raises(
            InferenceProcessError, match=r"changed since the engine started \(heads .*forum"
        ) as caught:
            runner.run(runner.prepare(docs))
        # A retryable `not_ready`: no pass ran, and the server waits for its restart.
        assert caught.value.code is ErrorCode.NOT_READY and runner._process is None
        shutil.rmtree(served)
        shutil.copytree(tiny_checkpoint, served)  # the checkpoint the runner started on, back
        after = runner.run(runner.prepare(docs)).embeddings
        np.testing.assert_allclose(after, before, atol=1e-6, rtol=0)
    finally:
        runner.close()


def _kill_child(runner: ProcessRunner) -> None:
    process = runner._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)


class _Interrupted(BaseException):
    """What a signal handler raises in the main thread while the runner waits for its child to load."""


def test_a_start_interrupted_while_the_child_loads_kills_the_child(tiny_checkpoint: Path) -> None:
    # The server's SIGTERM handler during start-up raises SystemExit in the main thread, which waits here
    # for the child; the child ignores SIGTERM, and multiprocessing's exit handler waited for it to load.
    known = {child.pid for child in multiprocessing.active_children()}

    def interrupt(signum: int, frame: object) -> None:
        loading = [c for c in multiprocessing.active_children() if c.pid not in known]
        if not loading:  # not started yet: look again shortly
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        with pytest.raises(_Interrupted):
            ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert [c for c in multiprocessing.active_children() if c.pid not in known] == []


def test_a_first_child_that_loaded_other_heads_than_this_process_read_is_refused(
    tiny_checkpoint: Path,
) -> None:
    # The checkpoint replaced between this process's read of its metadata and the child's load: the
    # Engine would answer the child's rows under the heads it read.
    import dataclasses

    meta = read_meta(tiny_checkpoint)
    same = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1), expected=meta)
    same.close()
    first = meta.heads[0]
    other = dataclasses.replace(first, labels=[*first.labels, "extra"]) if first.labels else first
    read = dataclasses.replace(meta, heads=[other, *meta.heads[1:]], embedding_dim=meta.embedding_dim + 1)
    known = {child.pid for child in multiprocessing.active_children()}
    with pytest.raises(InferenceProcessError, match="another model than this process read") as refused:
        ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1), expected=read)
    assert refused.value.code is ErrorCode.BACKEND_FAILED
    assert [c for c in multiprocessing.active_children() if c.pid not in known] == []


def _new_children(known: set[int | None]) -> list[multiprocessing.process.BaseProcess]:
    return [child for child in multiprocessing.active_children() if child.pid not in known]


def test_a_closed_runner_refuses_passes_and_starts_no_child(tiny_checkpoint: Path) -> None:
    """The next pass after `close` had started the child again ("restart 1"): a model process that
    nobody closed until the interpreter exited."""
    known = {child.pid for child in multiprocessing.active_children()}
    runner = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    docs = _docs(100, [5, 8])
    runner.run(runner.prepare(docs))
    runner.close()
    with pytest.raises(ShuttingDownError, match="closed") as refused:
        runner.run(runner.prepare(docs))
    assert refused.value.code is ErrorCode.SHUTTING_DOWN
    assert runner.restarts == 0 and runner._process is None and _new_children(known) == []
    runner.close()  # again: nothing to do


async def test_closing_a_running_engine_leaves_no_model_process(tiny_checkpoint: Path) -> None:
    """close() with calls in flight, then probe: the child was killed at the close, and the probe (or
    the next batch) started a new one, alive after stop() and a second close()."""
    known = {child.pid for child in multiprocessing.active_children()}
    config = EngineConfig(inference_process=True, intra_op_threads=1, preprocess_workers=1)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await engine.start()
    await engine.embed(make_pages(1))
    calls = [asyncio.ensure_future(engine.embed(make_pages(2, seed=seed))) for seed in range(6)]
    await asyncio.sleep(0)
    engine.close()
    with pytest.raises(ShuttingDownError):
        await engine.probe()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
    assert all(isinstance(o, list | ShuttingDownError) for o in outcomes), outcomes
    await asyncio.wait_for(engine.stop(), 60)
    runner = engine._runner
    assert isinstance(runner, ProcessRunner) and runner.restarts == 0
    assert engine.health.failures == 0 and _new_children(known) == []


def test_what_this_machine_cannot_run_is_refused_before_any_child(tiny_checkpoint: Path) -> None:
    """The same ValueError as in process, at once: the child had refused it seconds later, as a
    `checkpoint_invalid` it could not load."""
    known = {child.pid for child in multiprocessing.active_children()}
    with pytest.raises(ValueError, match="flash_attention_2 needs CUDA") as refused:
        ProcessRunner(tiny_checkpoint, EngineConfig(attn_implementation="flash_attention_2"))
    assert type(refused.value) is ValueError and _new_children(known) == []


def test_a_value_error_in_the_child_is_a_configuration_error(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the parent's check does not foresee (here: the check skipped) and the child's runner refuses
    with a ValueError: a ValueError as in process, typed `validation_error`, not `checkpoint_invalid`."""
    monkeypatch.setattr(process_module, "check_device", lambda config: None)
    with pytest.raises(InferenceConfigurationError, match="flash_attention_2 needs CUDA") as refused:
        ProcessRunner(tiny_checkpoint, EngineConfig(attn_implementation="flash_attention_2"))
    assert isinstance(refused.value, ValueError) and refused.value.code is ErrorCode.VALIDATION


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (CheckpointError("bad weights"), ErrorCode.CHECKPOINT_INVALID),
        (ValueError("an attention this device cannot run"), ErrorCode.VALIDATION),
        (RuntimeError("CUDA error: out of memory"), ErrorCode.BACKEND_FAILED),
        (OSError("Input/output error"), ErrorCode.BACKEND_FAILED),
    ],
)
def test_a_failed_load_in_the_child_keeps_what_kind_of_failure_it_was(
    error: BaseException, code: ErrorCode
) -> None:
    assert load_failure_code(error) is code
