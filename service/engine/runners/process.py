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
(`service.engine.loading.build_runner`); the parent keeps only the tokenizer and the metadata the child
loaded (`meta`). Batches go over a pipe as one flat id array with lengths (a few hundred KB at most) and
come back as `RunnerOutput`'s arrays. Its signals are ignored, so a Ctrl-C, a hang-up or a SIGTERM to the
process group leaves it to the parent's drain, which closes it last. A parent that exits without closing
it (a Ctrl-C through `htmllm embed`) closes the pipe at exit, which stops it.

A child that dies (out of memory, a driver fault, a kill) fails the batch it held with an error, and a
new one is started at once, in the background: a thread watches each child's exit, so one that dies
while idle is replaced before traffic finds it. Until the new one has loaded, `outage` says why no pass
can run (the server's /ready answers 503 with it) and a pass that comes meanwhile waits for it. The
restart had been lazy, inside the next batch's pass: 17 to 35 s (torch's import, an ONNX re-export)
during which /ready said 200 and requests queued into 504s. Such a wait is counted in `load_wait_s`,
which the batcher's drain rate leaves out: read as one slow pass, it had refused requests with 429 for
a while after the restart ("52.9 s of work ... at 0.1 a second"). The new child runs a three-token
forward pass before it serves, so that a restart that succeeds has shown the backend works again: the
batcher's count of failed passes (/ready's, `htmllm_backend_consecutive_failures`) ends there
(`recovered_at`), not only at the next batch's pass, which an idle pod may not see for hours.

A restart loads the model the first child loaded, or none: one onto a checkpoint changed since (a head
trained into it) is refused before any child is spawned, and `outage` says that is permanent (no probe's
retry cures it), which the server's /health turns into 503 `unhealthy` at once, so that the liveness
probe restarts it on the new checkpoint. It had kept /health 200 for `HTMLLM_UNHEALTHY_AFTER_S` (300 s),
as for a fault that may pass, and every probe and batch spawned a child that loaded the whole model only
to be refused. A checkpoint gone or unreadable (a volume unmounted) is such a fault: it is retried.

The child's log records travel over a pipe of their own to this process's logging (`log_relay`), so
they come out once, in the server's format and at its level.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np

from service.core.checkpoint import CheckpointMeta, checkpoint_fingerprint, read_meta
from service.core.errors import CheckpointError, ErrorCode, HtmllmError
from service.core.processes import GROUP_SIGNALS, group_signals_held, ignore_group_signals
from service.engine.collector import prepare_for_serving
from service.engine.loading import check_device
from service.engine.runners import PreparedBatch, RunnerOutput, batch_cost
from service.engine.runners.log_relay import relay_logs, send_logs
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
    meta: CheckpointMeta  # htmllm.json as the child's load read it: what the parent names the model by


@dataclass(frozen=True)
class Outage:
    """Why no forward pass can run now although none failed: the child is gone. `loading`: a new one is
    loading the model (a pass waits for it); else the last start failed, or `abort` killed the child,
    and the next pass starts one. `permanent`: a restart was refused because the checkpoint changed
    since the engine started (`CheckpointChangedError`): no wait cures that, only a new engine (a server
    restart) or the old checkpoint back, so the server's liveness fails at once (`Runtime.unhealthy`)."""

    reason: str
    loading: bool
    permanent: bool = False


def _watch(runner: weakref.ref[ProcessRunner], process: Any) -> None:
    """A child's watcher, on a thread of its own: when the child exits, for whatever reason, its runner
    (unless collected meanwhile) is told, and acts on an exit nobody asked for (`ProcessRunner._lost`).
    A weak reference: a runner dropped unclosed is still collected, which stops its child."""
    multiprocessing.connection.wait([process.sentinel])
    owner = runner()
    if owner is not None:
        owner._lost(process, in_pass=False)


def _exited(process: Any) -> bool:
    """Whether `process` has exited, from its sentinel: no `waitpid`, which would race its watcher's join
    (the loser reads no exit code)."""
    return bool(multiprocessing.connection.wait([process.sentinel], 0))


def _serve(
    conn: Connection, logs: Connection, level: int, path: str, config: EngineConfig, check: bool = False
) -> None:
    """The child: build the runner, answer ("run", ids, lengths, pad_to) until ("close",) or EOF; its log
    records go over `logs` (`log_relay.send_logs`). `check`: run a three-token pass (the server's probe)
    before it says it serves, which a load that fails does not get past (a restart's)."""
    ignore_group_signals(GROUP_SIGNALS)  # the parent's drain ends it (`_stop`), last
    send_logs(logs, level)  # first: what the imports and the load log must reach the parent
    from service.engine.loading import build_runner

    try:
        # Before the load: a head saved between the two then shows in the specs the load read.
        fingerprint = checkpoint_fingerprint(path)
        runner, meta, tokenizer = build_runner(Path(path), replace(config, inference_process=False))
    except BaseException as error:  # every failure goes back to the parent, as text and its code
        conn.send(("error", (f"{type(error).__name__}: {error}", load_failure_code(error).value)))
        return
    if check:
        try:
            runner.run(runner.prepare([tokenizer.special_ids.filler(3)]))  # the server's probe
        except Exception as error:  # the backend's failure, as a batch's would be
            failed = f"its first forward pass failed: {type(error).__name__}: {error}"
            conn.send(("error", (failed, ErrorCode.BACKEND_FAILED.value)))
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
        meta,
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


class CheckpointChangedError(InferenceProcessError):
    """A restart refused: the checkpoint is not the one the engine started on (a head trained into it,
    its files replaced). The parent answers with the heads and tokenizer it read at start, so a child
    on the new files would serve rows under the wrong labels; only a new engine serves them.

    `not_ready` (503 with Retry-After), not `backend_failed`: no pass ran, nothing is wrong with the
    request, and the pod waits for its restart (/ready 503, /health 503 `unhealthy`), so a client is
    to retry on another pod. A 500 had told it the request failed on the server's fault, and counted as
    a failed pass; the batcher passes a runner's `not_ready` through uncounted (`Batcher._refused`)."""

    code = ErrorCode.NOT_READY


def _load_error(message: str, code: ErrorCode) -> InferenceProcessError:
    """The parent's error for a child whose load failed with `code` (`load_failure_code`)."""
    if code is ErrorCode.VALIDATION:
        return InferenceConfigurationError(message)
    return InferenceProcessError(message, code=code)


class ProcessRunner:
    """The configured runner (`EngineConfig.backend`), run in a child process; the `Runner` protocol."""

    def __init__(self, path: Path, config: EngineConfig, *, expected: CheckpointMeta | None = None) -> None:
        """`expected`: the metadata this process read of the checkpoint (its tokenizer was checked
        against it); a first child that loaded other heads, another tokenizer or another width (the
        checkpoint replaced between the two reads) is refused as a restart would be. What the child
        loaded is `meta`, which the Engine answers with.

        ValueError at once, before any child, for what this machine cannot run (`check_device`: CUDA
        where there is none, flash_attention_2 on a CPU), as the runner in this process raises it: the
        child had refused it seconds later, as a checkpoint it could not load."""
        check_device(config)
        self._path = path
        self._config = config
        self._context = multiprocessing.get_context("spawn")
        # One batch over the pipe at a time (the batcher runs one anyway); only its holder uses a pipe.
        self._lock = threading.Lock()
        # `abort` runs beside a pass that holds `_lock`; under this one it reads which children to kill,
        # and a start records its child, so that a child still loading can be killed too. It also guards
        # which child serves, which the watchers, the restarts and the passes all change.
        self._abort_lock = threading.Lock()
        self._reap_lock = threading.Lock()  # one join at a time: a second, racing, read no exit code
        self._starting: Any = None  # a child started and not yet answering (loading the model)
        # Batches are numbered as they are prepared; an `abort` fails every batch prepared before it (the
        # pass in flight, one queued behind it) and none prepared after it. A flag cleared when a pass ended
        # had outlived its pass when the abort came after that pass: the next one, after a restart of the
        # engine, failed at once.
        self._prepared = 0  # the number of the last batch prepared
        self._aborted_through = 0  # every batch numbered up to this one is aborted
        self._aborts = 0  # `abort` calls so far: a restart begun before the latest one is cancelled
        self._killed: Any = None  # the child `abort` killed in its pass: not restarted in the background
        self._process: Any = None
        self._conn: Connection | None = None
        self._stopper: multiprocessing.util.Finalize | None = None
        # Stoppers of children lost while a pass held `_lock`: their pipes are closed by that pass (a
        # pipe closed under a pass that reads it could have its descriptor reused by another file).
        self._dead_pipes: list[multiprocessing.util.Finalize] = []
        self._down: str | None = None  # why no child serves since the last one exited
        self._restart: concurrent.futures.Future[None] | None = None  # the latest restart
        self._restart_error: str | None = None  # why the latest restart failed
        # What differs in the checkpoint since the first child loaded it, as the latest restart found it
        # (`CheckpointChangedError`); until a child serves again: `outage` says it is permanent.
        self._changed: str | None = None
        self._identity: _Identity | None = None  # the first child's model, which every restart must load
        self._closed = False  # `close` is final: no pass after it, and no child started again
        self.restarts = 0
        self._load_wait_s = 0.0  # `load_wait_s`; changed only under `_lock`
        self._recovered_at: float | None = None  # `recovered_at`
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
        # What the server names its answers with (/info, `x-checkpoint-sha256`): the files the child
        # loaded, fingerprinted by it before its load. The server had fingerprinted them itself, before
        # or after the child's load, and served a checkpoint replaced meanwhile under the other's sha.
        # Every restart loads the same (`_Identity`), so these hold for the runner's life.
        self.fingerprint = description.identity.fingerprint
        # Likewise the metadata: the name, the prune version, the maximum length the child loaded, not
        # `expected`, which this process read before the child's load (`build_runner` answers with this).
        # A htmllm.json replaced in between (a new name, another prune version, same heads) had been
        # served under the old name beside the new files' fingerprint.
        self.meta = description.meta
        self.training_run_id = description.meta.training_run_id
        self.backend = description.backend
        self.device = description.device
        self.dtype = description.dtype
        self.threads = description.threads
        self.attention = description.attention
        self.packed = description.packed

    def _check_checkpoint(self) -> None:
        """The child's first checks of the checkpoint, here, before any child: a checkpoint gone (moved,
        unmounted) or without its metadata is refused as the child would say it, and on a restart one
        whose fingerprint is not the first child's (`CheckpointChangedError`). Each such restart had
        spawned a child that imported torch and loaded the whole model (6 to 8 s for the tiny one, and
        on a GPU its memory) only to be refused, again at every probe and every batch. The fingerprint
        costs a read of the checkpoint (25 ms for the bundled model), small beside the child's load,
        which reads it too. Any other fault is still the child's to find."""
        try:
            if not self._path.is_dir():
                checkpoint_fingerprint(self._path)  # raises what the child raises first ("does not exist")
            if self._identity is None:  # the first start: nothing to compare with yet
                read_meta(self._path)
                return
            # In the child's order (fingerprint, then metadata): a head saved between the two shows.
            fingerprint = checkpoint_fingerprint(self._path)
            now = _Identity.of(fingerprint, read_meta(self._path))
        except CheckpointError as error:
            message = f"the inference process could not load the model: {type(error).__name__}: {error}"
            raise _load_error(message, load_failure_code(error)) from error
        if now != self._identity:
            raise self._changed_error(self._identity.changes(now))

    def _changed_error(self, changed: str) -> CheckpointChangedError:
        """The refusal of a restart onto a checkpoint changed since the first child loaded it; `outage`
        says so, as permanent, until a child serves again."""
        with self._abort_lock:
            self._changed = changed
        return CheckpointChangedError(
            f"the checkpoint {self._path} changed since the engine started ({changed}); the inference "
            "process was not restarted on it: restart the server to serve the new model"
        )

    def _cancelled(self, aborts: int | None) -> bool:
        """Whether a start begun when `_aborts` was `aborts` is to stop: an `abort` or a `close` came since
        (never for the first start, `aborts` None); under `_abort_lock`."""
        return aborts is not None and (aborts != self._aborts or self._closed)

    def _start(self, aborts: int | None = None) -> _Description:
        """Start a child and wait until it serves; `aborts` as `_cancelled` takes it (None: the first).
        A restart's child (`aborts` given) runs a forward pass before it serves (`recovered_at`); the
        first child's is the warm-up's."""
        self._check_checkpoint()
        parent, child = self._context.Pipe()
        logs, child_logs = self._context.Pipe(duplex=False)
        level = logging.getLogger().getEffectiveLevel()
        process = self._context.Process(
            target=_serve,
            args=(child, child_logs, level, str(self._path), self._config, aborts is not None),
            name="htmllm-inference",
            daemon=True,
        )
        try:
            with group_signals_held():  # until `_serve` ignores them: a hang-up while it starts too
                process.start()
        except BaseException:
            if process.pid is not None:
                # Started, and a signal held meanwhile raised as it came through (SystemExit from the
                # server's SIGTERM handler during start-up, Ctrl-C): the child would load the model
                # for nobody, and multiprocessing's exit handler would wait for it (it ignores SIGTERM).
                process.kill()
                self._reap(process)
            for end in (parent, logs):
                end.close()
            raise
        finally:
            child.close()
            child_logs.close()
        threading.Thread(target=relay_logs, args=(logs,), name="htmllm-inference-logs", daemon=True).start()
        with self._abort_lock:
            self._starting = process  # from here `abort` kills it (a restart hung while loading)
            cancelled = self._cancelled(aborts)
        changed: str | None = None  # what a restarted child loaded differently
        stopper: multiprocessing.util.Finalize | None = None
        try:
            if cancelled:
                raise InferenceProcessError("the inference process was aborted while it started")
            if not parent.poll(START_TIMEOUT_S):
                raise InferenceProcessError(f"the inference process did not start in {START_TIMEOUT_S:.0f} s")
            status, value = parent.recv()
            if status == "ok" and self._identity is not None and value.identity != self._identity:
                changed = self._identity.changes(value.identity)
            if status == "ok" and changed is None:
                # Runs once: from `_lost` or `close`, when the runner is collected, or at exit before
                # multiprocessing terminates daemonic children (a positive exit priority runs first).
                stopper = multiprocessing.util.Finalize(
                    self, _stop, args=(process, parent, STOP_TIMEOUT_S), exitpriority=10
                )
                with self._abort_lock:  # `abort` sees it in one of the two places, never in neither
                    cancelled = self._cancelled(aborts)
                    if not cancelled:
                        self._process, self._conn, self._stopper = process, parent, stopper
                        self._down, self._restart_error, self._changed = None, None, None
                        if aborts is not None:  # with the child, so that a pass it runs comes after
                            self._recovered_at = time.monotonic()
        except (EOFError, OSError) as error:
            self._reap(process)  # the pipe ends before the exit is reaped: wait for its code
            with self._abort_lock:
                why = "was aborted" if self._cancelled(aborts) else "exited"
            raise InferenceProcessError(
                f"the inference process {why} while loading the model (exit code {process.exitcode})"
            ) from error
        except InferenceProcessError:
            process.kill()
            self._reap(process)
            raise
        except BaseException:
            # Interrupted while it loads (SystemExit from the server's SIGTERM handler during start-up,
            # Ctrl-C): the child ignores SIGTERM, and multiprocessing's exit handler would wait for it to
            # finish loading before the process could exit.
            process.kill()
            self._reap(process)
            raise
        finally:
            with self._abort_lock:
                self._starting = None
        if status != "ok":
            self._reap(process, CLOSE_TIMEOUT_S)
            message, code = value
            raise _load_error(f"the inference process could not load the model: {message}", ErrorCode(code))
        if changed is not None:
            # The parent answers with the heads and tokenizer it read at start: rows of another model
            # would be served under them (new labels zipped against old ones, or a 500 when their count
            # changed). Refused for every batch until the checkpoint is back, or the server restarts.
            # Found here only when it changed after `_check_checkpoint` read it.
            _stop(process, parent, STOP_TIMEOUT_S)
            raise self._changed_error(changed)
        if cancelled:  # loaded, but an abort or a close came meanwhile: nobody is to use it
            assert stopper is not None
            stopper()
            if self._closed:
                raise ShuttingDownError("the inference process has been closed")
            raise InferenceProcessError("the inference process was aborted while it started")
        watcher = threading.Thread(
            target=_watch, args=(weakref.ref(self), process), name="htmllm-inference-watch", daemon=True
        )
        watcher.start()
        logger.info("inference process %d serves %s on %s", process.pid, self._path, value.device)
        return value  # type: ignore[no-any-return]

    def _reap(self, process: Any, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Join `process` (at most `timeout_s`), one thread at a time: of two racing joins one reaps the
        child and the other reads no exit code, which its message then said ("exit code None")."""
        with self._reap_lock:
            process.join(timeout_s)

    def _lost(self, process: Any, *, in_pass: bool) -> None:
        """`process` exited without being asked (killed, out of memory, crashed): it serves no more, and,
        unless `abort` killed it (the shutdown's) or the runner is closed, a new child starts at once in
        the background. Called by the child's watcher and by a pass that lost it; the first does it.
        `in_pass`: the caller holds `_lock`, so it may close the child's pipe."""
        self._reap(process)  # it has exited (its sentinel or its pipe said so): reaped, its code is known
        with self._abort_lock:
            if self._closed or self._process is not process or multiprocessing.util.is_exiting():
                return  # done by the other caller, or stopped on purpose (a close, the interpreter's exit)
            stopper = self._stopper
            self._process, self._conn, self._stopper = None, None, None
            self._down = f"the inference process exited (exit code {process.exitcode})"
            killed = process is self._killed
            self._killed = None
            if not killed:
                self._begin_restart()
        if killed:
            logger.warning("%s after the shutdown's abort killed it", self._down)
        else:
            logger.warning("%s: starting a new one now (restart %d)", self._down, self.restarts)
        if stopper is None:
            return
        if in_pass or self._lock.acquire(blocking=False):
            try:
                stopper()
            finally:
                if not in_pass:
                    self._lock.release()
        else:
            with self._abort_lock:
                self._dead_pipes.append(stopper)

    def _begin_restart(self) -> concurrent.futures.Future[None]:
        """Start a child in the background (under `_abort_lock`); the future ends when it serves, or with
        the start's error. An `abort` or `close` meanwhile kills it."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._restart, self._restart_error = future, None
        self.restarts += 1
        threading.Thread(
            target=self._restart_now,
            args=(future, self._aborts, self.restarts),
            name="htmllm-inference-restart",
            daemon=True,
        ).start()
        return future

    def _restart_now(self, future: concurrent.futures.Future[None], aborts: int, number: int) -> None:
        """A restart's thread: `_start`, its outcome in `future` (and `outage`)."""
        try:
            self._start(aborts)
        except Exception as error:
            with self._abort_lock:
                self._restart_error = str(error)
                if not isinstance(error, CheckpointChangedError):  # what the change was is no longer why
                    self._changed = None
                ended = self._cancelled(aborts)
            if ended:
                logger.info("restart %d of the inference process ended by a shutdown: %s", number, error)
            else:
                logger.error("restart %d of the inference process failed: %s", number, error)
            future.set_exception(error)
        else:
            logger.warning("restart %d of the inference process succeeded", number)
            future.set_result(None)

    def outage(self) -> Outage | None:
        """Why no forward pass can run now although none failed (`Outage`), or None: a child serves, or
        the runner is closed. Cheap (attribute reads under a lock): what /ready and every answer's
        connection rule ask."""
        with self._abort_lock:
            if self._closed or self._conn is not None or self._down is None:
                return None
            restart = self._restart
            loading = restart is not None and not restart.done()
            if self._changed is not None:  # until a child serves: a probe's retry is no cure in sight
                return Outage(
                    f"{self._down}, and the checkpoint {self._path} changed since the engine started "
                    f"({self._changed}): the inference process is not restarted on it; restart the "
                    "server to serve the new model",
                    loading,
                    permanent=True,
                )
            if loading:
                return Outage(f"{self._down}; a new one is loading the model (restart {self.restarts})", True)
            if self._restart_error is not None:
                failed = f"restart {self.restarts} failed: {self._restart_error}"
                return Outage(f"{self._down}, and {failed}; the next forward pass tries again", False)
            return Outage(f"{self._down}; the next forward pass starts a new one", False)

    @property
    def recovered_at(self) -> float | None:
        """When (`time.monotonic()`) a child started anew last began to serve, or None before any did.
        Each ran a three-token forward pass first (`_serve`'s check), so the batcher ends a run of
        failed passes that came before it (`Batcher.health`): a child killed in its pass, and replaced
        while no traffic came, had left the failure counted (and `htmllm_backend_consecutive_failures`
        at 1, its alert firing) for as long as the pod stayed idle. A load alone would prove less: a
        child that dies in every pass loads well, and its failures must keep adding up."""
        return self._recovered_at

    @property
    def load_wait_s(self) -> float:
        """Seconds that passes have spent, in all, waiting for a child to load the model (a restart's):
        no forward-pass work, which the batcher's drain rate must not read as a slow pass (`admission`).
        A total, so that a caller on the inference thread takes the difference across one `run`."""
        return self._load_wait_s

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
            try:
                return self._run(*payload)
            finally:
                self._close_dead_pipes()

    def _close_dead_pipes(self) -> None:
        """Close the pipes of children lost while `_lock` was held (`_lost`); under `_lock`."""
        with self._abort_lock:
            stoppers, self._dead_pipes = self._dead_pipes, []
        for stopper in stoppers:
            stopper()

    def _aborted_before(self, serial: int) -> bool:
        """Whether an `abort` came after batch `serial` was prepared; under `_abort_lock`."""
        return serial <= self._aborted_through

    def _run(self, flat: np.ndarray, lengths: np.ndarray, pad_to: int | None, serial: int) -> RunnerOutput:
        """`run` under the pass's lock."""
        if self._closed:  # before anything that would start a child: a closed runner stays closed
            raise ShuttingDownError("the inference process has been closed")
        idle = self._process
        if idle is not None and _exited(idle):
            # It died between batches (out of memory, killed) and its watcher has not told yet: nothing
            # was sent, so this batch need not fail with it; it waits for the new one.
            self._lost(idle, in_pass=True)
        with self._abort_lock:
            if self._aborted_before(serial):  # asked before this pass reached the child: it sends nothing
                raise InferenceProcessError("the forward pass was aborted (shutting down)")
            conn, process = self._conn, self._process
            restart: concurrent.futures.Future[None] | None = None
            if conn is None:  # wait for the restart under way, or begin one (the last one failed)
                restart = self._restart
                if restart is None or restart.done():
                    restart = self._begin_restart()
        if restart is not None:
            waiting = time.monotonic()
            try:
                conn, process = self._await_restart(restart, serial)
            finally:
                self._load_wait_s += time.monotonic() - waiting
        assert conn is not None
        try:
            conn.send(("run", flat, lengths, pad_to))
            status, value = conn.recv()
        except (EOFError, OSError) as error:
            self._lost(process, in_pass=True)
            raise InferenceProcessError(
                f"the inference process died during a forward pass (exit code {process.exitcode})"
            ) from error
        if status != "ok":
            raise InferenceProcessError(value)
        output: RunnerOutput = value
        return output

    def _await_restart(self, restart: concurrent.futures.Future[None], serial: int) -> tuple[Connection, Any]:
        """Wait for `restart` (its `_start` bounds the wait) and give the child it started; its error
        when it failed, unless this pass was aborted (or the runner closed) meanwhile."""
        try:
            restart.result()
        except Exception as error:
            with self._abort_lock:
                aborted = self._aborted_before(serial)
            if self._closed:
                raise ShuttingDownError("the inference process has been closed") from error
            if aborted:
                raise InferenceProcessError("the forward pass was aborted (shutting down)") from error
            raise
        with self._abort_lock:
            aborted = self._aborted_before(serial)
            conn, process = self._conn, self._process
        if aborted:
            raise InferenceProcessError("the forward pass was aborted (shutting down)")
        if conn is None:  # the new child died already (its watcher began the next restart)
            raise InferenceProcessError(f"the inference process exited as soon as it started ({self._down})")
        return conn, process

    def abort(self) -> None:
        """Kill the child now, without the lock a pass in flight holds: that pass then fails at once
        (its documents were failed already) and the next batch starts a new child. For the shutdown
        deadline, where a hung child (a driver fault, a stopped process) had held the server forever.

        A child still loading (a restart after a crash, up to `START_TIMEOUT_S`) is killed too, and a
        pass that has not reached the child yet starts none. Only batches prepared before the abort
        are aborted: one that comes after the pass it was for ended (the batcher decides first, then
        aborts) leaves the idle child alive and the next pass whole (the engine may be started again on
        this runner)."""
        with self._abort_lock:
            self._aborted_through = self._prepared
            self._aborts += 1
            # A pass holds `_lock` from before it reads the abort to the end of its pass: a pass that
            # takes it after this reads the abort and sends nothing, so an idle child is left alone.
            in_pass = self._lock.locked()
            children = [self._process if in_pass else None, self._starting]
            if self._process is not None and self._process in children:
                self._killed = self._process  # its watcher starts no other: the next pass does
        for process in children:
            if process is not None and process.is_alive():
                process.kill()

    def close(self) -> None:
        """Stop the child (after the pass in flight) for good: a later `run` raises ShuttingDownError.
        Without that, the next pass had started a new child ("restart 1") that nobody closed again. A
        child still loading in the background is killed: nobody is to use it."""
        with self._abort_lock:
            self._closed = True  # first: a pass waiting for the lock must not start a child after the close
            starting, restart = self._starting, self._restart
        if starting is not None and starting.is_alive():
            starting.kill()
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send(("close",))
            if self._process is not None:
                self._reap(self._process, CLOSE_TIMEOUT_S)
            with self._abort_lock:
                stopper = self._stopper
                self._conn, self._process, self._stopper = None, None, None
            if stopper is not None:
                stopper()
            if restart is not None:  # its child killed above, or about to find the runner closed
                concurrent.futures.wait([restart], timeout=CLOSE_TIMEOUT_S)
            self._close_dead_pipes()
