"""A runner in a process of its own, so that the forward pass never waits for the server's GIL.

Why: an eager forward pass issues hundreds of small operators from Python, and between two of them the
thread must take the GIL back. Beside a busy event loop (HTTP parsing, JSON, hand-offs to the
preprocessing processes) each take can wait up to the interpreter's switch interval (5 ms): measured
here, a pass of the bundled model over one short document takes 8.6 ms alone and 980 ms beside one
thread looping over `json.loads`. On a GPU, whose kernels take microseconds, that wait is the pass (the
first H200 run: 45 ms per batch in the server against about 8 ms in the engine benchmark). A process
of its own has a GIL of its own; text-embeddings-inference gets the same by keeping Python out of its
router.

The child (spawned: CUDA cannot be forked) loads the checkpoint and builds the configured runner
(`service.engine.loading.build_runner`); the parent keeps only the tokenizer and the checkpoint's
metadata. Batches go over a pipe as one flat id array with lengths (a few hundred KB at most) and come
back as `RunnerOutput`'s arrays. A child that dies (out of memory, a driver fault) fails the batch it
held with an error and is started again for the next one; its signals are ignored, so a Ctrl-C or a
SIGTERM to the process group leaves it to the parent's drain, which closes it last. A parent that exits
without closing it (a Ctrl-C through `htmllm embed`) closes the pipe at exit, which stops it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.util
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np

from service.core.checkpoint import CheckpointMeta
from service.core.errors import ErrorCode, HtmllmError
from service.engine.collector import prepare_for_serving
from service.engine.loading import check_device
from service.engine.runners import PreparedBatch, RunnerOutput, batch_cost
from service.engine.types import EngineConfig, ShuttingDownError

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # loading a large checkpoint onto a GPU, compiling, probing
CLOSE_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0  # a child told to stop by a closed pipe: at most one forward pass to finish


@dataclass(frozen=True)
class _Identity:
    """Which model a child loaded: its checkpoint's fingerprint and what the parent's Engine relies on
    (head specs, tokenizer, embedding width), which a restart must find unchanged."""

    fingerprint: str
    heads: tuple[tuple[str, str, tuple[str, ...]], ...]  # (name, kind, labels) in the checkpoint's order
    tokenizer_sha256: str
    embedding_dim: int

    @classmethod
    def of(cls, fingerprint: str, meta: CheckpointMeta) -> _Identity:
        heads = tuple((spec.name, spec.kind, tuple(spec.labels)) for spec in meta.heads)
        return cls(fingerprint, heads, meta.tokenizer_sha256, meta.embedding_dim)

    def changes(self, now: _Identity) -> str:
        """What differs in `now`, in words."""
        said = []
        if now.heads != self.heads:
            said.append(f"heads {_shown_heads(now.heads)}, were {_shown_heads(self.heads)}")
        if now.tokenizer_sha256 != self.tokenizer_sha256:
            said.append("another tokenizer")
        if now.embedding_dim != self.embedding_dim:
            said.append(f"{now.embedding_dim}-wide embeddings, were {self.embedding_dim}")
        return "; ".join(said) or "other weights or configuration (its fingerprint changed)"


def _shown_heads(heads: tuple[tuple[str, str, tuple[str, ...]], ...]) -> str:
    return "[" + ", ".join(f"{name}{list(labels) if labels else ''}" for name, _, labels in heads) + "]"


@dataclass(frozen=True)
class _Description:
    """What the child's runner is, for the parent's `Runner` attributes, and which model it loaded."""

    backend: str
    device: str
    dtype: str
    threads: int
    attention: str
    packed: bool
    identity: _Identity


def _serve(conn: Connection, path: str, config: EngineConfig) -> None:
    """The child: build the runner, answer ("run", ids, lengths, pad_to) until ("close",) or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from service.core.checkpoint import checkpoint_fingerprint
    from service.engine.loading import build_runner

    try:
        # Before the load: a head saved between the two then shows in the specs the load read.
        fingerprint = checkpoint_fingerprint(path)
        runner, meta, _ = build_runner(Path(path), replace(config, inference_process=False))
    except BaseException as error:  # every failure goes back to the parent, as text and its code
        conn.send(("error", (f"{type(error).__name__}: {error}", load_failure_code(error).value)))
        return
    packed = bool(getattr(runner, "packed", False))  # only the torch runner packs
    description = _Description(
        runner.backend,
        runner.device,
        runner.dtype,
        runner.threads,
        runner.attention,
        packed,
        _Identity.of(fingerprint, meta),
    )
    prepare_for_serving()  # the model is loaded: set the garbage collector for serving
    conn.send(("ok", description))
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the parent is gone, or closed the pipe to stop this process
                return
            if message[0] == "close":
                return
            _, ids, lengths, pad_to = message
            answer: tuple[str, object]
            try:
                bounds = np.cumsum(lengths)[:-1]
                batch = [part.tolist() for part in np.split(ids, bounds)]
                answer = ("ok", runner.run(runner.prepare(batch, pad_to=pad_to)))
            except Exception as error:  # a failed batch is the parent's to report
                answer = ("error", f"{type(error).__name__}: {error}")
            try:
                conn.send(answer)
            except OSError:  # the parent closed the pipe during the pass: nobody waits for it
                return
    finally:
        runner.close()


def load_failure_code(error: BaseException) -> ErrorCode:
    """The code a child's failed load is reported under: a typed error's own (`checkpoint_invalid` for
    the checkpoint), `validation_error` for a ValueError (the configuration: what the runner refuses
    in this process with a ValueError), else `backend_failed` (the backend's own failure: CUDA, a
    missing package). Every untyped failure had read `checkpoint_invalid`, a checkpoint blamed for an
    attention the device cannot run."""
    if isinstance(error, HtmllmError):
        return error.code
    if isinstance(error, ValueError):
        return ErrorCode.VALIDATION
    return ErrorCode.BACKEND_FAILED


def _stop(process: Any, conn: Connection, timeout_s: float) -> None:
    """Close the pipe (the child then returns from `recv`), wait up to `timeout_s`, then kill.

    Also what runs at interpreter exit when the runner was never closed (a Ctrl-C through
    `htmllm embed`): multiprocessing's exit handler would otherwise SIGTERM the daemonic child, which
    ignores SIGTERM, and wait for it without end."""
    with contextlib.suppress(OSError):
        conn.close()
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join(timeout_s)


class InferenceProcessError(HtmllmError):
    """The inference process did not start (the child's code, `load_failure_code`), or died holding a
    batch; typed, so `htmllm serve` reports it as it reports a checkpoint that fails to load in
    process, in one line."""

    code = ErrorCode.BACKEND_FAILED


class InferenceConfigurationError(InferenceProcessError, ValueError):
    """The child's runner refused the configuration with a ValueError that the parent's `check_device`
    did not foresee (an attention kernel that fails its probe on the device): a ValueError, as the
    same configuration raises in process, and typed (`validation_error`) for `htmllm serve`'s line."""

    code = ErrorCode.VALIDATION


def _load_error(message: str, code: ErrorCode) -> InferenceProcessError:
    """The parent's error for a child whose load failed with `code` (`load_failure_code`)."""
    if code is ErrorCode.VALIDATION:
        return InferenceConfigurationError(message)
    return InferenceProcessError(message, code=code)


class ProcessRunner:
    """The configured runner (`EngineConfig.backend`), run in a child process; the `Runner` protocol."""

    def __init__(self, path: Path, config: EngineConfig, *, expected: CheckpointMeta | None = None) -> None:
        """`expected`: the metadata this process read of the checkpoint (its Engine answers with those
        heads and that tokenizer); a first child that loaded other heads, another tokenizer or another
        width (the checkpoint replaced between the two reads) is refused as a restart would be.

        ValueError at once, before any child, for what this machine cannot run (`check_device`: CUDA
        where there is none, flash_attention_2 on a CPU), as the runner in this process raises it: the
        child had refused it seconds later, as a checkpoint it could not load."""
        check_device(config)
        self._path = path
        self._config = config
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # one batch over the pipe at a time (the batcher runs one anyway)
        # `abort` runs beside a pass that holds `_lock`; under this one it reads which children to kill,
        # and a pass starting a child records it, so that a child still loading can be killed too.
        self._abort_lock = threading.Lock()
        self._starting: Any = None  # a child started and not yet answering (loading the model)
        # Batches are numbered as they are prepared; an `abort` fails every batch prepared before it (the
        # pass in flight, one queued behind it) and none prepared after it. A flag cleared when a pass ended
        # had outlived its pass when the abort came after that pass: the next one, after a restart of the
        # engine, failed at once.
        self._prepared = 0  # the number of the last batch prepared
        self._aborted_through = 0  # every batch numbered up to this one is aborted
        self._process: Any = None
        self._conn: Connection | None = None
        self._stopper: multiprocessing.util.Finalize | None = None
        self._identity: _Identity | None = None  # the first child's model, which every restart must load
        self._closed = False  # `close` is final: no pass after it, and no child started again
        description = self._start()
        if expected is not None:
            wanted = _Identity.of(description.identity.fingerprint, expected)
            if wanted != description.identity:
                self.close()
                raise InferenceProcessError(
                    f"the inference process loaded another model than this process read of {path}: "
                    f"{wanted.changes(description.identity)} (the checkpoint changed while the server "
                    "started); start it again"
                )
        self._identity = description.identity
        self.backend = description.backend
        self.device = description.device
        self.dtype = description.dtype
        self.threads = description.threads
        self.attention = description.attention
        self.packed = description.packed
        self.restarts = 0

    def _start(self, serial: int | None = None) -> _Description:
        """Start the child; `serial` is the batch whose pass starts it (None: the first start)."""
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(child, str(self._path), self._config), name="htmllm-inference", daemon=True
        )
        process.start()
        child.close()
        with self._abort_lock:
            self._starting = process  # from here `abort` kills it (a restart hung while loading)
            aborted = self._aborted_before(serial)
        changed: str | None = None  # what a restarted child loaded differently
        try:
            if aborted:
                raise InferenceProcessError("the inference process was aborted while it started")
            if not parent.poll(START_TIMEOUT_S):
                raise InferenceProcessError(f"the inference process did not start in {START_TIMEOUT_S:.0f} s")
            status, value = parent.recv()
            if status == "ok" and self._identity is not None and value.identity != self._identity:
                changed = self._identity.changes(value.identity)
            if status == "ok" and changed is None:
                with self._abort_lock:  # `abort` sees it in one of the two places, never in neither
                    self._process, self._conn = process, parent
        except (EOFError, OSError) as error:
            process.join(STOP_TIMEOUT_S)  # the pipe ends before the exit is reaped: wait for its code
            with self._abort_lock:
                why = "was aborted" if self._aborted_before(serial) else "exited"
            raise InferenceProcessError(
                f"the inference process {why} while loading the model (exit code {process.exitcode})"
            ) from error
        except InferenceProcessError:
            process.kill()
            raise
        except BaseException:
            # Interrupted while it loads (SystemExit from the server's SIGTERM handler during start-up,
            # Ctrl-C): the child ignores SIGTERM, and multiprocessing's exit handler would wait for it to
            # finish loading before the process could exit.
            process.kill()
            process.join(STOP_TIMEOUT_S)
            raise
        finally:
            with self._abort_lock:
                self._starting = None
        if status != "ok":
            process.join(CLOSE_TIMEOUT_S)
            message, code = value
            raise _load_error(f"the inference process could not load the model: {message}", ErrorCode(code))
        if changed is not None:
            # The parent answers with the heads and tokenizer it read at start: rows of another model
            # would be served under them (new labels zipped against old ones, or a 500 when their count
            # changed). Refused for every batch until the checkpoint is back, or the server restarts.
            _stop(process, parent, STOP_TIMEOUT_S)
            raise InferenceProcessError(
                f"the checkpoint {self._path} changed since the engine started ({changed}); the inference "
                "process was not restarted on it: restart the server to serve the new model"
            )
        # Runs once: from `_discard`, when the runner is collected, or at exit before multiprocessing
        # terminates daemonic children (a positive exit priority runs first).
        self._stopper = multiprocessing.util.Finalize(
            self, _stop, args=(process, parent, STOP_TIMEOUT_S), exitpriority=10
        )
        logger.info("inference process %d serves %s on %s", process.pid, self._path, value.device)
        return value  # type: ignore[no-any-return]

    def cost(self, lengths: Sequence[int]) -> int:
        return batch_cost(lengths, packed=self.packed)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        lengths = np.fromiter((len(ids) for ids in batch), dtype=np.int64, count=len(batch))
        tokens = int(lengths.sum())
        flat = np.fromiter((t for ids in batch for t in ids), dtype=np.int64, count=tokens)
        padded = batch_cost(lengths.tolist(), packed=self.packed, pad_to=pad_to)
        with self._abort_lock:
            self._prepared += 1
            serial = self._prepared
        return PreparedBatch(
            payload=(flat, lengths, pad_to, serial), documents=len(batch), tokens=tokens, padded_tokens=padded
        )

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        payload = cast(tuple[np.ndarray, np.ndarray, int | None, int], prepared.payload)
        with self._lock:
            return self._run(*payload)

    def _aborted_before(self, serial: int | None) -> bool:
        """Whether an `abort` came after batch `serial` was prepared (never for the first start); under
        `_abort_lock`."""
        return serial is not None and serial <= self._aborted_through

    def _run(self, flat: np.ndarray, lengths: np.ndarray, pad_to: int | None, serial: int) -> RunnerOutput:
        """`run` under the pass's lock."""
        if self._closed:  # before anything that would start a child: a closed runner stays closed
            raise ShuttingDownError("the inference process has been closed")
        with self._abort_lock:
            aborted = self._aborted_before(serial)
        if aborted:  # asked before this pass reached the child: it starts none and sends nothing
            raise InferenceProcessError("the forward pass was aborted (shutting down)")
        if self._process is not None and not self._process.is_alive():
            # It died between batches (out of memory, killed): nothing was sent, so this batch
            # need not fail with it.
            logger.warning("the inference process exited (code %s) while idle", self._process.exitcode)
            self._discard()
        if self._conn is None:
            self._restart(serial)
        conn = self._conn
        assert conn is not None
        try:
            conn.send(("run", flat, lengths, pad_to))
            status, value = conn.recv()
        except (EOFError, OSError) as error:
            process = self._process
            self._discard()  # joins it: its exit code is known only then
            code = process.exitcode if process is not None else None
            raise InferenceProcessError(
                f"the inference process died during a forward pass (exit code {code}); "
                "it is started again for the next batch"
            ) from error
        if status != "ok":
            raise InferenceProcessError(value)
        output: RunnerOutput = value
        return output

    def abort(self) -> None:
        """Kill the child now, without the lock a pass in flight holds: that pass then fails at once
        (its documents were failed already) and the next batch starts a new child. For the shutdown
        deadline, where a hung child (a driver fault, a stopped process) had held the server forever.

        A child that the pass is still starting (a restart after a crash, loading the model, up to
        `START_TIMEOUT_S`) is killed too, and a pass that has not reached the child yet starts none.
        Only batches prepared before the abort are aborted: one that comes after the pass it was for
        ended (the batcher decides first, then aborts) leaves the idle child alive and the next pass
        whole (the engine may be started again on this runner)."""
        with self._abort_lock:
            self._aborted_through = self._prepared
            # A pass holds `_lock` from before it reads the abort to the end of its pass: a pass that
            # takes it after this reads the abort and sends nothing, so an idle child is left alone.
            in_pass = self._lock.locked()
            children = [self._process if in_pass else None, self._starting]
        for process in children:
            if process is not None and process.is_alive():
                process.kill()

    def _restart(self, serial: int) -> None:
        self.restarts += 1
        logger.warning("starting the inference process again (restart %d)", self.restarts)
        self._start(serial)

    def _discard(self) -> None:
        if self._stopper is not None:
            self._stopper()
        self._conn, self._process, self._stopper = None, None, None

    def close(self) -> None:
        """Stop the child (after the pass in flight) for good: a later `run` raises ShuttingDownError.
        Without that, the next pass had started a new child ("restart 1") that nobody closed again."""
        self._closed = True  # first: a pass waiting for the lock must not start a child after the close
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send(("close",))
            if self._process is not None:
                self._process.join(CLOSE_TIMEOUT_S)
            self._discard()
