"""Serving from the command line: settings from the environment and flags, the model checked, uvicorn run.

`python -m service.api [flags]` and `htmllm serve [flags]` take the same flags (`add_serve_arguments`)
and both end in `run_args`, which starts the server as `serve(settings)` does. The settings and the
checkpoint's files are checked, then the port is bound (`bind_listeners`, handed to uvicorn), then the
checkpoint is loaded, and only then does the port listen: a missing or broken model or a port in use
fails fast with a message saying what is wrong, and the server never starts with something that is not
a model. A SIGTERM, SIGINT (Ctrl-C) or SIGHUP during the start ends the process at once (status 143, 130
or 129, one log line), from before the settings are read (their checks import torch) until the server is
built; from then on each of them stops it gracefully (a second Ctrl-C while requests are in flight forces
the quit: status 130). Heavy imports (uvicorn, pydantic, torch) wait until a server is really started, so
that the `htmllm` CLI stays usable without the serve extra and SIGTERM's handler is in place before them.
Once uvicorn has shut down, or a signal has ended the start, the process ends with its status without
waiting for its threads (`end_process`), the handler still in place: a forward pass still in flight at
the end of the drain budget is no one's any more, and a signal during the exit changes nothing.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from service.api.listeners import bind_listeners, listen, log_listening
from service.api.start_checks import (
    InvalidSettingsError,
    ModelMissingError,
    check_device,
    check_model_location,
    check_model_path,
)
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    import uvicorn
    from pydantic import ValidationError

    from service.api.runtime import Runtime
    from service.api.settings import Settings

logger = logging.getLogger(__name__)

# Flag dest -> Settings field; every flag defaults to None so only flags given override the environment.
_FLAG_FIELDS = (
    "host",
    "port",
    "model_path",
    "backend",
    "device",
    "intra_op_threads",
    "max_batch_tokens",
    "max_batch_requests",
    "max_wait_ms",
    "max_queue_documents",
    "max_documents",
    "request_timeout_s",
    "log_level",
    "log_format",
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's flags; each overrides its `HTMLLM_*` variable."""
    parser.add_argument(
        "--host",
        default=None,
        help="address to bind (HTMLLM_HOST, default 0.0.0.0: IPv4; '::' binds IPv6 only, '' both families)",
    )
    parser.add_argument("--port", type=int, default=None, help="port to bind (HTMLLM_PORT, default 8000)")
    parser.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="checkpoint directory (HTMLLM_MODEL_PATH, default the bundled service/assets/default-model)",
    )
    parser.add_argument(
        "--backend",
        choices=("torch", "onnx"),
        default=None,
        help="model runner (HTMLLM_BACKEND, default torch)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="where the model runs (HTMLLM_DEVICE, default cpu)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=None,
        help="CPU threads per forward pass (HTMLLM_INTRA_OP_THREADS; default OMP_NUM_THREADS, else the "
        "container's CPU limit or the CPUs in the affinity mask)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="padded tokens per forward pass (HTMLLM_MAX_BATCH_TOKENS, default 16384)",
    )
    parser.add_argument(
        "--max-batch-requests",
        type=int,
        default=None,
        help="documents per forward pass; 1 disables batching (HTMLLM_MAX_BATCH_REQUESTS, default 64)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=None,
        help="how long a batch waits to fill (HTMLLM_MAX_WAIT_MS, default 2)",
    )
    parser.add_argument(
        "--max-queue-documents",
        type=int,
        default=None,
        help="queued documents before requests get 429 (HTMLLM_MAX_QUEUE_DOCUMENTS, default 1024)",
    )
    parser.add_argument(
        "--max-documents",
        type=int,
        default=None,
        help="documents per request (HTMLLM_MAX_DOCUMENTS, default 64)",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=None,
        help="per-request timeout in seconds (HTMLLM_REQUEST_TIMEOUT_S, default 30)",
    )
    parser.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        default=None,
        help="log level (HTMLLM_LOG_LEVEL, default info)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="json: one JSON object per log line, for log pipelines (HTMLLM_LOG_FORMAT, default text)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the environment with the given flags on top (raises pydantic's ValidationError)."""
    from service.api.settings import Settings

    overrides: dict[str, Any] = {
        name: getattr(args, name) for name in _FLAG_FIELDS if getattr(args, name, None) is not None
    }
    return Settings(**overrides)


# Settings whose value is never written back, even in an error about it.
_SECRET_SETTINGS = frozenset({"api_key"})


def settings_errors(exc: ValidationError) -> list[str]:
    """One line per refused setting, named as its environment variable, with the value given where it
    is one field's and not a secret. pydantic's own text had quoted a check across fields (`max_inflight_
    bytes` below `max_body_bytes`) with the whole input, the API key among it, into the container's log."""
    lines = []
    for error in exc.errors(include_url=False):
        if error["type"] == "default_factory_not_called":  # a consequence of another error, not one
            continue
        field = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        value = error.get("input")
        shown_value = (
            f" (got {value!r:.60})"
            if field and field not in _SECRET_SETTINGS and isinstance(value, str | int | float | bool)
            else ""
        )
        lines.append(f"HTMLLM_{field.upper()}: {message}{shown_value}" if field else message)
    return lines or [f"{exc.error_count()} error(s)"]


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """uvicorn's settings: SIGTERM stops accepting, waits for in-flight requests, then the lifespan drains.
    uvicorn configures no logging of its own: its records reach the root logger's handler
    (service.api.logs), in JSON or in the one text format with a time and the logger's name (its own
    handler had written text lines without either, those that bracket a drain among them)."""
    import uvicorn

    from service.api.http_protocol import protocol_class

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_class(settings.head_timeout_s, retry_after_s=settings.retry_after_s),
        # uvicorn's own default is 5 s, shorter than any load balancer's idle timeout (Settings).
        timeout_keep_alive=settings.keep_alive_timeout_s,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, math.ceil(settings.drain_timeout_s)),
        # The app writes its own (`HTMLLM_ACCESS_LOG`, service.api.logs): uvicorn's came with debug logs
        # only, named no request id or latency, and wrote each query string, where a client may put a key.
        access_log=False,
        log_config=None,
        # The peer is the client (docs/service.md, the access log's `client`): uvicorn's default trusts
        # X-Forwarded-For from 127.0.0.1, which any process on the host (or a client behind a sidecar)
        # could set, and its `server: uvicorn` header named the stack to every client.
        proxy_headers=False,
        server_header=False,
    )


# The exit statuses of a server stopped by SIGTERM, SIGINT or SIGHUP before it served, as a shell reports a
# process that the signal ended (128 + the signal's number); 130 is also that of a forced quit.
EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_HUNG_UP = 128 + signal.SIGHUP

# What stops the server: SIGTERM (`kill`, Docker, Kubernetes, systemd), SIGINT (Ctrl-C) and SIGHUP (the
# terminal or SSH session of `make serve` / `htmllm serve` closed, a supervisor's hang-up), as the batch
# commands take them (`sigterm_as_ctrl_c`). SIGHUP's default action had ended a serving server on the
# spot (status 129, no log line), each accepted request dropped: uvicorn handles only the other two.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Terminated(BaseException):
    """A stop signal during the start. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on the way (a checkpoint reader's, a runner's) takes it for a load failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """The one handler of the stop signals, from the start's first line until the server has shut down:
    until `serving` is set (the server built) a signal ends the start (`_Terminated`); from then on it
    stops the server gracefully (`_GracefulStop.signalled`). One handler throughout leaves no moment
    between the start's and the server's in which a signal meets its default action (SIGTERM's and
    SIGHUP's end the process without a word, and PID 1 drops SIGTERM). uvicorn replaces it for SIGTERM
    and SIGINT while it serves and gives it back after; SIGHUP stays with it all along."""

    def __init__(self) -> None:
        self.serving: Callable[[int, FrameType | None], None] | None = None
        self.ended = False

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        if self.serving is not None:
            self.serving(sig, frame)
        elif not self.ended:
            self.ended = True  # a second signal while the start ends: its status is being said already
            raise _Terminated(sig)


@contextmanager
def _stop_signals() -> Iterator[_StopSignals]:
    """Within, the stop signals go to the handler yielded; the handlers found are given back on leaving
    (uvicorn, once it has shut down, raises the signal that stopped it again into the handlers it found:
    this one). In a container the server is PID 1, for which the kernel drops every signal without a
    handler: a pod deleted while its model loaded ran on until the kubelet's SIGKILL; Ctrl-C printed a
    KeyboardInterrupt traceback of some 30 lines from wherever the load was. A SIGINT or SIGHUP that is
    ignored (a shell's background job, `nohup`) stays ignored, as it does for the batch commands."""
    stops = _StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stops  # only the main thread may install a handler (uvicorn then installs none either)
        return
    previous = {
        sig: signal.signal(sig, stops)
        for sig in _STOP_SIGNALS
        if sig == signal.SIGTERM or signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield stops
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _GracefulStop:
    """How a serving server takes the stop signals, and what its exit status then is (`status`).

    The first signal, whichever, is uvicorn's graceful shutdown: no new connections, each accepted
    request answered, then the lifespan's drain of the engine, all within `HTMLLM_DRAIN_TIMEOUT_S`
    counted from the signal (so a pod's terminationGracePeriodSeconds, preStop + the drain timeout,
    covers both). A line names the signal: uvicorn's own "Shutting down" did not, and a server stopped
    by a hang-up was not told from one stopped by an operator.

    A second Ctrl-C while requests are in flight is uvicorn's force quit: it stops waiting for them,
    skips the lifespan's shutdown and exits, dropping their connections. That had exited 0, the status
    of a complete drain, without a word; now a warning names both signals, says how many requests were
    dropped and what work of theirs was left, and the status is 130 (`EXIT_INTERRUPTED`). With no request
    in flight (an idle server, or every request answered) a second Ctrl-C changes nothing: it had forced
    the quit all the same (status 130, a warning that "0 requests" were dropped, the engine left
    unclosed), where the clean stop it cut short was a moment from its end. Once the engine's drain has
    begun every request has been answered and uvicorn would ignore it anyway. A second SIGTERM or SIGHUP
    changes nothing (nor does uvicorn's raising of the stopping signal again once it is done)."""

    def __init__(self, server: uvicorn.Server, runtime: Runtime) -> None:
        self._server = server
        self._runtime = runtime
        self._uvicorn_handle_exit = server.handle_exit
        self.engine_drain_began = False  # the lifespan's shutdown has begun: every request was answered
        self.forced = False
        self.stopped_by: int | None = None  # the signal that began the stop

    def signalled(self, sig: int, frame: FrameType | None) -> None:
        """A stop signal outside uvicorn's own handlers (SIGHUP always; SIGTERM and SIGINT before and
        after it serves, a Ctrl-C there never forcing the quit)."""
        if sig == signal.SIGINT and self._server.should_exit:
            return  # uvicorn's raising of the SIGINT that stopped it, or a Ctrl-C with nothing to force
        self._stop(sig, frame)

    def uvicorn_signal(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's handler of SIGTERM and SIGINT while it serves (`server.handle_exit`)."""
        if sig == signal.SIGINT and self._server.should_exit:
            if self.engine_drain_began or self._server.force_exit or not self._server.server_state.tasks:
                return  # nothing left to force: every request is answered, the engine drains (or will)
            self._force(sig, frame)
            return
        self._stop(sig, frame)

    def status(self) -> int:
        """The exit status (`serve`'s): 1 when the server never served or its drain was cut short (what
        was left answered 503), 130 after a forced quit (requests dropped), 0 after a complete drain."""
        if not self._server.started:
            return 1
        if self.forced:
            return EXIT_INTERRUPTED
        return 1 if self._runtime.drain_cut_short else 0

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        first = not self._server.should_exit
        if first:
            self.stopped_by = sig
        self._runtime.begin_shutdown()
        self._uvicorn_handle_exit(sig, frame)
        if first:
            _log_soon(
                logging.INFO,
                "%s: shutting down gracefully: no new connections; the requests in flight are answered "
                "within HTMLLM_DRAIN_TIMEOUT_S (%g s)",
                _signal_name(sig),
                self._runtime.settings.drain_timeout_s,
            )

    def _force(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's request tasks, one per request being answered; what is left of their work: the
        # engine's documents accepted and not answered (queued, being preprocessed or in a forward pass)
        # and the extraction jobs (a page and an extractor each) not done.
        requests = len(self._server.server_state.tasks)
        engine = self._runtime.engine
        documents = engine.queue_size if engine is not None else 0
        extractions = self._runtime.extraction_backlog
        first = self.stopped_by
        again = "again" if first in (None, sig) else f"after {signal.Signals(first).name}"
        self.forced = True
        self._uvicorn_handle_exit(sig, frame)
        _log_soon(
            logging.WARNING,
            "%s %s: forced quit before the drain was done: %d requests in flight are dropped without an "
            "answer (%d documents not yet embedded, %d extraction jobs not yet done) and the engine is not "
            "drained; exiting with status %d",
            _signal_name(sig),
            again,
            requests,
            documents,
            extractions,
            EXIT_INTERRUPTED,
        )


def _signal_name(sig: int) -> str:
    """SIGHUP as the log says it, with why a server gets one."""
    name = signal.Signals(sig).name
    if sig == signal.SIGHUP:
        return f"{name} (the terminal or session hung up)"
    return f"{name} (Ctrl-C)" if sig == signal.SIGINT else name


def _log_soon(level: int, message: str, *args: object) -> None:
    """Log from a signal handler: on the event loop when one runs here, not in the handler. The handler
    may have interrupted the main thread within a write to the same stream, which a second write from
    it would break ('reentrant call inside BufferedWriter', a logging error instead of the line)."""
    import asyncio  # imported already by uvicorn: not among this module's imports, which the CLI loads

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        logger.log(level, message, *args)
        return
    loop.call_soon_threadsafe(lambda: logger.log(level, message, *args))


def serve(settings: Settings) -> int:
    """Run the server until SIGTERM, SIGINT or SIGHUP: 0 once it has drained every request it accepted, 1
    when the drain ran out of time (`HTMLLM_DRAIN_TIMEOUT_S`: what was left was answered 503), the model
    is missing or does not load, 2 when the settings cannot work on this machine or with this checkpoint
    or the port cannot be bound (in use), 130 after a forced quit (a second Ctrl-C while requests are in
    flight: they are dropped), and 143 on SIGTERM, 130 on SIGINT and 129 on SIGHUP before it serves (it never
    started; nothing to drain).

    It returns, for a caller whose process goes on; the command line's server ends its process as soon
    as it has its status instead (`run_args`). After a forced quit it returns once it has dropped the
    connections in flight and stopped and closed the engine (`_end_forced_quit`), with the warning
    alone, as the command line's exit does."""
    return _start_and_serve(lambda: settings, ends_process=False)


def run_args(args: argparse.Namespace) -> int:
    """Parsed flags to a running server (`serve`'s statuses); 2 for invalid settings, 1 for a model path
    that is no checkpoint. A server that served, or a start that a signal ended, ends the process with
    its status (`end_process`) rather than returning: `python -m service.api` and `htmllm serve` have
    nothing left to do.

    SIGTERM ends the process with 143 (SIGINT with 130, SIGHUP with 129) from here on, before the settings
    are read: their checks import torch (`settings.engine_config()`), seconds in which a pod deleted
    during its start, as PID 1 with no handler, had ignored the signal (or, elsewhere, died of it without
    a word)."""
    return _start_and_serve(lambda: _settings_for_serving(args), ends_process=True)


def end_process(status: int) -> NoReturn:
    """Exit with `status` now, without waiting for the threads still running: the exit handlers and
    the flushes that matter first.

    A drain cut short by `HTMLLM_DRAIN_TIMEOUT_S` answers the documents of the forward pass in flight
    503, but nothing stops a pass running in this process (torch's, onnxruntime's): its thread runs on,
    as does a preprocessing thread still pruning a page (threads cannot be killed). asyncio.run's end
    joins the thread waiting for that pass, the interpreter's exit the pass's own thread: the process
    outlived its drain budget by the whole pass (2-9 s with the bundled model on CPU, more for a larger
    one), past the pod's grace period, whose SIGKILL then ended it. Nothing those threads do is owed to
    anyone once the server has its status.

    What is still owed runs first: the `atexit` handlers, among them multiprocessing's, which stops any
    child process still running (an inference process, a worker the lifespan did not already kill:
    none is left orphaned) and logging's, which flushes the handlers; then stdout and stderr."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken stream: nothing more to write
                stream.flush()
        os._exit(status)


def _settings_for_serving(args: argparse.Namespace) -> Settings | int:
    """The settings `args` give, checked before the model loads, or the exit status that refused them
    (the reason written to stderr). Logging is configured as soon as the settings say how."""
    from pydantic import ValidationError

    from service.api.logs import configure_logging

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        sys.stderr.write(
            "".join(f"htmllm serve: invalid settings: {line}\n" for line in settings_errors(exc))
        )
        return 2
    except ValueError as exc:
        sys.stderr.write(f"htmllm serve: invalid settings: {exc}\n")
        return 2
    try:
        check_model_location(settings)  # before engine_config(), whose import of the engine takes seconds
    except ModelMissingError as exc:
        sys.stderr.write(f"htmllm serve: {exc.code}: {exc}\n")
        return 1
    configure_logging(settings.log_level, settings.log_format)  # before the seconds of imports below
    try:
        settings.engine_config()  # combinations the engine refuses (float16 on CPU, onnx in bfloat16...)
    except ValueError as exc:
        sys.stderr.write(f"htmllm serve: invalid settings: {exc}\n")
        return 2
    budget = settings.json_budget_warning()
    if budget is not None:
        logger.warning("%s", budget)
    return settings


def _start_and_serve(settings_for: Callable[[], Settings | int], *, ends_process: bool) -> int:
    """Take the settings (`settings_for`: they or the status that refused them), bind the port, load the
    model and serve, all of the start with a stop signal ending it (`_stop_signals`): from the first
    import of pydantic, torch and uvicorn on, not only from the load; once the server is built the same
    handler stops it gracefully (`_GracefulStop`). With `ends_process`, a server that served ends the
    process with its status (`end_process`) from within uvicorn's event loop: the end of asyncio.run
    would wait for a forward pass still in flight; so does a start that a signal ended, from within
    `_stop_signals`, whose handler then takes any further signal (the handlers found are given back for
    a caller whose process goes on: `serve`, and every other status of the start)."""
    with _stop_signals() as stops:
        try:
            # What the start has built (the sockets, the engine: a model child process), released should
            # the start end (a signal while it is released ends it too); uvicorn's (which closes the
            # sockets) and the lifespan's (which stops the engine) once it serves.
            with contextlib.ExitStack() as unserved:
                started = _start(settings_for, unserved)
                if isinstance(started, int):
                    return started
                server, runtime, listeners = started
                stop = _prepare_server(server, runtime, listeners, ends_process=ends_process)
                stops.serving = stop.signalled  # from here a signal stops the server gracefully
                unserved.pop_all()
        except _Terminated as ended:
            ended_with = 128 + ended.signum
            name = signal.Signals(ended.signum).name
            logger.warning("%s before the server started serving: exiting (status %d)", name, ended_with)
            if ends_process:
                # Now, with the handler still in place: the interpreter's own exit takes most of a
                # second, and a second signal then met the default action once the handlers were given
                # back (the process died of it: -15, -1 or -2, not 143, 129 or 130).
                end_process(ended_with)
            return ended_with
        server.run(sockets=listeners)
        return stop.status()


def _start(
    settings_for: Callable[[], Settings | int], unserved: contextlib.ExitStack
) -> tuple[uvicorn.Server, Runtime, list[socket.socket]] | int:
    """The server, ready to serve on its listening sockets, or the status that ended the start (its
    reason written to stderr); what it builds is released by `unserved` should the start end later."""
    try:
        settings = settings_for()
        if isinstance(settings, int):
            return settings
        import uvicorn

        from service.api.api_keys import ApiKeys
        from service.api.app import create_app, load_engine
        from service.api.logs import configure_logging

        configure_logging(settings.log_level, settings.log_format)
        try:
            # Before the model: a bad key file is quick. Handed to the app, which would read them again
            # and say again what it found (a key file holding no key: a warning twice).
            api_keys = ApiKeys(settings.api_key, settings.api_key_file)
        except HtmllmError as exc:  # a setting that cannot work, as a bad HTMLLM_API_KEY is (it exited 1)
            sys.stderr.write(f"htmllm serve: invalid settings: {exc}\n")
            return 2
        check_device(settings)
        check_model_path(settings)
        # A port in use is said now, not after the load and the lifespan's start (minutes).
        listeners = [unserved.enter_context(s) for s in bind_listeners(settings.host, settings.port)]
        engine = load_engine(settings)
        unserved.callback(engine.close)
        app = create_app(settings, engine, api_keys=api_keys)
        config = uvicorn_config(app, settings)
        server = uvicorn.Server(config)
        listen(listeners, config.backlog, settings.host, settings.port)
    except InvalidSettingsError as exc:
        sys.stderr.write(f"htmllm serve: invalid settings: {exc}\n")
        return 2
    except HtmllmError as exc:
        sys.stderr.write(f"htmllm serve: {exc.code}: {exc}\n")
        return 1
    except OSError as exc:
        # A file the start could not read or write that no typed error names (each known one is a
        # CheckpointError or an OnnxExportError): one line with the file and the cause, not a traceback.
        sys.stderr.write(
            f"htmllm serve: {ErrorCode.BACKEND_FAILED}: cannot start: {type(exc).__name__}: {exc}\n"
        )
        return 1
    runtime: Runtime = app.state.runtime
    return server, runtime, listeners


def _prepare_server(
    server: uvicorn.Server, runtime: Runtime, listeners: list[socket.socket], *, ends_process: bool
) -> _GracefulStop:
    """Hook `server` for serving: its signals (`_GracefulStop`), the end of the process once it has shut
    down (with `ends_process`), the 'Uvicorn running on' line for the sockets bound here, and the start of
    the lifespan's shutdown (after which a Ctrl-C has nothing to force)."""
    stop = _GracefulStop(server, runtime)
    server.handle_exit = stop.uvicorn_signal  # type: ignore[method-assign]
    uvicorn_serve = server.serve

    async def serve_then_end(sockets: list[socket.socket] | None = None) -> None:
        await uvicorn_serve(sockets)
        if ends_process and server.started:  # one that never served (a port taken) returns as before
            end_process(stop.status())
        if stop.forced:
            await _end_forced_quit(server)

    server.serve = serve_then_end  # type: ignore[method-assign]
    uvicorn_startup = server.startup

    async def startup_then_say_where(sockets: list[socket.socket] | None = None) -> None:
        lifespan = server.lifespan  # made by uvicorn just before its startup
        lifespan_shutdown = lifespan.shutdown

        async def note_then_shut_down() -> None:
            stop.engine_drain_began = True
            await lifespan_shutdown()

        lifespan.shutdown = note_then_shut_down  # type: ignore[method-assign]
        await uvicorn_startup(sockets)
        if server.started:
            log_listening(listeners)

    server.startup = startup_then_say_where  # type: ignore[method-assign]
    return stop


async def _end_forced_quit(server: uvicorn.Server) -> None:
    """After a forced quit, in a process that goes on (`serve`): drop what the command line's exit
    (`end_process`) drops, and stop the app as a stop does, so that `serve` returns without a traceback.

    uvicorn's force quit returns with the requests still running and the lifespan never told to shut
    down; `asyncio.run` then cancelled their tasks, and uvicorn logged each cancellation as an ERROR with
    a CancelledError traceback after the forced quit's warning (the lifespan's too), and answered the
    requests 500, where the warning says they are dropped without an answer. Here each connection is
    dropped, so that its request ends as one whose client left (its documents are skipped), then the
    lifespan's shutdown stops the engine, which owes no one anything any more, and closes it and the
    extractor pool, which a caller whose process goes on would otherwise keep until its exit."""
    import asyncio  # imported already by uvicorn: not among this module's imports, which the CLI loads

    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.abort()
    await asyncio.gather(*server.server_state.tasks, return_exceptions=True)
    await server.lifespan.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m service.api [flags]`."""
    parser = argparse.ArgumentParser(
        prog="python -m service.api", description="Serve the htmllm embedding API."
    )
    add_serve_arguments(parser)
    return run_args(parser.parse_args(argv))
