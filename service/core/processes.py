"""How the service starts its worker processes (text extractors, preprocessing): one choice for all, how
they and the helpers multiprocessing starts with them outlive the signals sent to the whole process group
(`group_signals_held`), how it gets a forkserver back that can no longer start them (`restart_forkserver`)
or does not answer (`forkserver_deadline`), whether a worker's forkserver can still tell its exit status
(`forkserver_lost`), what a start that failed left open (`close_failed_start`), and how a start out of file
descriptors is said: one line naming the limit and how to raise it (`launch_failure`), the forkserver's end
included (`service.core.forkserver_exit`), where each had been a raw traceback."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import resource
import signal
import stat
import sys
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from multiprocessing import forkserver, process, resource_tracker
from multiprocessing.context import BaseContext
from types import CodeType
from typing import Any, Final

from service.core import log_lines

try:
    from multiprocessing import popen_forkserver
except ImportError:  # no descriptor passing (Windows): no forkserver
    popen_forkserver = None  # type: ignore[assignment]

# The signals that reach every process of the server's group at once: a terminal's Ctrl-C (SIGINT) and
# hang-up (SIGHUP: the terminal or SSH session closed), and a SIGTERM sent to the group (`kill -TERM --
# -PGID`, systemd's default KillMode=control-group). The server drains on each, through its worker
# processes and its model's process, which must live until it has no more use for them: it stops them
# itself (a kill, a closed pipe).
GROUP_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGHUP, signal.SIGTERM})

# The attributes of CPython's `ForkServer` that say which one runs; all None: none (it launches one).
_FORKSERVER_STATE: Final = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")


def _code_of(owner: object, name: str) -> CodeType | None:
    code = getattr(getattr(owner, name, None), "__code__", None)
    return code if isinstance(code, CodeType) else None


# The CPython versions whose forkserver start was read and found to leak on a failure (`close_failed_start`:
# the same code from 3.11 to 3.14, and on CPython's main branch as of 2026-12). A later one may close what
# it made itself, and a second close would then close whatever another thread opened under those numbers
# since: it is left alone (its leak, if any, stays) until its code has been read.
_LEAKY_START: Final = (3, 11) <= sys.version_info[:2] <= (3, 14) and sys.implementation.name == "cpython"
# The two functions of that start whose failures leave descriptors open; their frames are told by their code.
_CONNECT_CODE: Final = _code_of(forkserver.ForkServer, "connect_to_new_process") if _LEAKY_START else None
_LAUNCH_CODE: Final = (
    None if popen_forkserver is None or not _LEAKY_START else _code_of(popen_forkserver.Popen, "_launch")
)


# Preloaded into the forkserver before any other module (`worker_context`): its import installs the
# forkserver's one-line exit (`forkserver_exit.ForkserverExit`).
FORKSERVER_EXIT_MODULE: Final = "service.core.forkserver_exit"


def worker_context(preload: Sequence[str]) -> BaseContext:
    """forkserver on Linux, spawn elsewhere.

    A forkserver worker never forks the server itself (whose torch threads a fork would copy mid-flight) and
    starts from a process that has imported only `preload`. That list is a hint: the forkserver is one per
    server process, started by whichever pool needs it first, and a module it did not preload is imported by
    the worker when first used (a missing one is skipped). A worker also imports the main module of a
    program run as a script (`python bench.py`, and the `htmllm` command's, which only imports
    `service.cli`; not `python -m service.api`), as multiprocessing does: one that imports torch at its top
    gives every worker torch, 7-9 s of each worker's start and about 320 MiB of its memory limit
    (service.core.workers; docs/engine.md). Adding `'__main__'` to `preload` would not spare the workers
    that import: CPython never passes the server the script's path (`forkserver.ensure_running` filters for
    a `main_path` key that `spawn.get_preparation_data` names `init_main_from_path`). Only the script can,
    by importing torch under `if __name__ == "__main__":`; stripping the path from each worker's preparation
    data would mean replacing multiprocessing's private `Popen._launch`.
    """
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        # `forkserver_exit` first: imported by the forkserver, it says the forkserver's end in one line,
        # whatever the rest of `preload` does.
        ctx.set_forkserver_preload([FORKSERVER_EXIT_MODULE, *preload])
        return ctx
    return multiprocessing.get_context("spawn")


# PYTHONSAFEPATH is read by Python 3.11 and later: no current directory first on the import path.
_SAFE_PATH_VARIABLE: Final = "PYTHONSAFEPATH"
_environment_lock = threading.Lock()


def start_forkserver(ctx: BaseContext) -> None:
    """Start `ctx`'s forkserver now, where it is one and none runs, with no current directory on its
    import path (`PYTHONSAFEPATH`) and told the format of the server's log lines (`log_lines`); the next
    process start uses it.

    multiprocessing launches it as `python -c ...`, which puts the current directory first on its
    import path, and it imports `preload` (the service's modules) before anything else; Python 3.11's
    `forkserver.main` never applies the parent's `sys.path` it is handed. Run from a folder holding a
    `service.py` or a `service/` (a crawl team's own project), it imported that instead, and every
    worker it forked failed to start: `htmllm serve`, `embed` and `extract` failed with
    "No module named 'service.cli'; 'service' is not a package", while the `htmllm` command itself ran
    (a console script's path starts with its bin directory, not the current one). PYTHONSAFEPATH is set
    only where the environment does not set it already.

    It runs none of the server's logging set-up, and writes one line of its own as it ends
    (`forkserver_exit`): `log_lines.FORMAT_VARIABLE` says "json" where the server's lines are JSON
    (`log_lines.json_in_use`), which `--log-format json` or `serve(settings)` make them without the
    environment saying so, else "text". The variables are set for the launch alone, under a lock."""
    if ctx.get_start_method() != "forkserver":
        return
    launch = {log_lines.FORMAT_VARIABLE: "json" if log_lines.json_in_use() else "text"}
    with _environment_lock:
        if not os.environ.get(_SAFE_PATH_VARIABLE):
            launch[_SAFE_PATH_VARIABLE] = "1"
        before = {name: os.environ.get(name) for name in launch}
        os.environ.update(launch)
        try:
            forkserver.ensure_running()
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@contextlib.contextmanager
def group_signals_held() -> Iterator[None]:
    """Start processes within: each starts with `GROUP_SIGNALS` blocked (a signal mask is inherited
    across fork and exec) until it says which it ignores (`ignore_group_signals`), and so do the helper
    processes multiprocessing starts with the first of them: the resource tracker, which ignores
    SIGINT and SIGTERM and keeps SIGHUP blocked for good, and the forkserver, which ignores SIGINT and
    keeps the other two blocked, so that the workers it forks, now and later, are born so too.

    A hang-up had killed them all with the server, which then drained: each page held by a
    preprocessing process failed (422, "crashed its preprocessing process"), each batch in the model's
    process too (500), and the tracker's death was a raw warning at the next start. The resource
    tracker is started here first: its own start lets SIGINT and SIGTERM through again in the thread
    that starts it. The mask is this thread's alone (a pool's thread starts its workers so too); a
    signal that comes meanwhile is taken by another thread, or once the mask is restored."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    try:
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def ignore_group_signals(ignored: Collection[signal.Signals]) -> None:
    """In a process started within `group_signals_held`: ignore `ignored`, and let the other group signals
    through (their default action), held back since the start. One that came meanwhile is discarded if
    ignored, else acted on now."""
    for sig in ignored:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, GROUP_SIGNALS)


def forkserver_in_use(ctx: BaseContext) -> object:
    """What names the forkserver `ctx` starts processes from now (its socket's address), for
    `restart_forkserver` to tell whether another thread replaced it meanwhile; None when `ctx` does not
    use one, or none runs yet."""
    if ctx.get_start_method() != "forkserver":
        return None
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)


def forkserver_replaced(ctx: BaseContext, forked_by: int | None) -> bool:
    """Whether the forkserver whose pid is `forked_by` (a worker's parent when it started) is no longer
    the one `ctx` starts processes from: `restart_forkserver` forgot it, or multiprocessing launched
    another after it died. The exit status of a worker it forked comes through it: it exits once its
    last worker has (`restart_forkserver`), before it has told that one's status, which then reads 255
    whatever ended the worker (multiprocessing's `Popen.poll`). False where `ctx` uses no forkserver,
    `forked_by` is unknown, or CPython's state is not as expected: the status is then taken as it reads."""
    if forked_by is None or ctx.get_start_method() != "forkserver":
        return False
    running = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", forked_by)
    return bool(running != forked_by)


def forkserver_lost(ctx: BaseContext, forked_by: int | None) -> bool:
    """Whether the forkserver whose pid is `forked_by` can no longer tell the exit status of a worker it
    forked: replaced (`forkserver_replaced`), or dead and not replaced yet (the kernel's OOM killer, a
    `kill -9`: multiprocessing launches a new one only at the next process start). Once it is dead, every
    worker of it that dies reads 255, whatever ended it, and a live one reads dead too (its `Popen.poll`
    reads the status from the forkserver's socket, now closed). False where `ctx` uses no forkserver,
    `forked_by` is unknown, or it runs (a pid recycled since reads as running: the status is taken as it
    reads, as before)."""
    return forkserver_replaced(ctx, forked_by) or (
        forked_by is not None and ctx.get_start_method() == "forkserver" and _child_exited(forked_by)
    )


def _child_exited(pid: int) -> bool:
    """Whether this process's child `pid` has exited, asked without reaping it (`WNOWAIT`): the forkserver
    in use is reaped by multiprocessing's own `ensure_running` (`waitpid`), which fails on a pid reaped
    elsewhere, and with it every later process start. A pid that is no child of this process (any more)
    is no forkserver of its own that runs: True. False where the kernel cannot be asked (no `waitid`)."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return False
    try:
        return waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True
    except OSError:
        return False


def restart_forkserver(ctx: BaseContext, seen: object) -> bool:
    """After a process could not be started: forget the forkserver `seen` names (`forkserver_in_use`) if
    it is still the one in use, so that the next start launches a new one; True when it was forgotten.

    A forkserver whose socket is gone (a /tmp cleaner, systemd-tmpfiles or tmpreaper, deleted
    /tmp/pymp-*/listener-*) runs on but cannot be reached: every start failed with FileNotFoundError,
    and multiprocessing only launches a new one when the old one has died, so a server that lost one
    worker (the OOM killer, a page past its time limit) had none again until an operator killed it.
    CPython's own `_stop` cannot serve: it waits for the forkserver to exit, which it does only once
    every process it forked has (they hold its "alive" pipe), and it fails on the missing socket. So this
    closes this process's end of that pipe and lets the old one go when its last worker does (a thread
    reaps it); those workers serve on meanwhile (the last of them to die has no readable exit status:
    `forkserver_replaced`). The preload list is the forkserver object's, kept for the next one. The
    directory the sockets live in is made again if it was deleted with them.

    The next forkserver is started by the next process start, within `group_signals_held` as every start
    of the service's is: it outlives a hang-up as the first did.

    CPython's forkserver keeps this state in private attributes (the same from 3.11 to 3.13); where they
    are not as expected, nothing is forgotten and the caller's retry is an ordinary one."""
    if ctx.get_start_method() != "forkserver":
        return False
    forgotten = _forget(seen)
    if forgotten is None:
        return False
    pid, alive = forgotten
    if alive is not None:
        os.close(alive)
    threading.Thread(target=_reap, args=(pid,), name="htmllm-forkserver-reaper", daemon=True).start()
    return True


def _forget(seen: object) -> tuple[int, int | None] | None:
    """Forget the forkserver `seen` names if it is still the one in use: its pid (unreaped: nothing reaps
    the one in use but `ensure_running`, under the same lock) and this process's end of its "alive" pipe,
    both now the caller's. None where it is not, or CPython's state is not as expected."""
    server: Any = getattr(forkserver, "_forkserver", None)
    lock = getattr(server, "_lock", None)
    if lock is None or not all(hasattr(server, name) for name in _FORKSERVER_STATE):
        return None
    with lock:
        _remake_temp_dir()
        pid, alive = server._forkserver_pid, server._forkserver_alive_fd
        if pid is None or server._forkserver_address != seen:
            return None  # none runs, or another thread already replaced the one that failed
        for name in _FORKSERVER_STATE:
            setattr(server, name, None)
        if hasattr(server, "_forkserver_authkey"):  # 3.13: the next one gets its own
            server._forkserver_authkey = None
    return pid, alive


class ForkserverDeadline:
    """What `forkserver_deadline` did: `abandoned`, the pid of the forkserver it killed past `timeout_s`
    (None: none)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.abandoned: int | None = None
        self._lock = threading.Lock()
        self._over = False

    def _expire(self, seen: object) -> None:
        with self._lock:
            if not self._over:
                self.abandoned = _abandon(seen)

    def _end(self) -> None:
        with self._lock:
            self._over = True


@contextlib.contextmanager
def forkserver_deadline(ctx: BaseContext, timeout_s: float) -> Iterator[ForkserverDeadline]:
    """Start a process within: where the forkserver in use has not answered it within `timeout_s`, that
    forkserver is forgotten (as `restart_forkserver` does) and killed, so that the start fails (EOFError,
    a broken pipe: what a forkserver that died under it gives) and the next start launches a new one.

    A stopped forkserver (SIGSTOP: a debugger's, an operator's; a frozen cgroup) left `Process.start`
    waiting for good for the pid of the process it was asked to fork (`forkserver.read_signed`, which has
    no timeout; the connect and the send of the start's data before it may wait too, on a full queue or
    pipe), and with it the pool's thread and every later start behind the pool's place it held. Only the
    forkserver's death ends that wait: the pipes the start handed it close with it. Its workers serve on,
    as a dead forkserver's do (`forkserver_lost`). Nothing happens where `ctx` uses no forkserver, none runs
    (`start_forkserver` first), or the start is over first; a timer thread waits meanwhile. A frozen
    cgroup v1 takes the kill only once thawed: the start then fails only then."""
    watch = ForkserverDeadline(timeout_s)
    seen = forkserver_in_use(ctx)
    if seen is None:
        yield watch
        return
    timer = threading.Timer(timeout_s, watch._expire, args=(seen,))
    timer.name, timer.daemon = "htmllm-forkserver-deadline", True
    timer.start()
    try:
        yield watch
    finally:
        watch._end()
        timer.cancel()


def _abandon(seen: object) -> int | None:
    """Forget the forkserver `seen` names, if still in use, and kill it; its pid (None: not in use)."""
    forgotten = _forget(seen)
    if forgotten is None:
        return None
    pid, alive = forgotten
    with contextlib.suppress(ProcessLookupError):  # unreaped, so its pid is its own (a zombie takes it too)
        os.kill(pid, signal.SIGKILL)  # a stopped process dies of it as well
    if alive is not None:
        os.close(alive)
    threading.Thread(target=_reap, args=(pid,), name="htmllm-forkserver-reaper", daemon=True).start()
    return pid


def _remake_temp_dir() -> None:
    """Make this process's multiprocessing directory again if it was deleted: the next forkserver's
    socket is bound in it (multiprocessing looks it up once and keeps the name). Made again under the
    same name only where nothing has taken it (mkdir refuses anything there, links included), so its
    removal at exit still finds it; else a new one."""
    config: Any = getattr(process.current_process(), "_config", None)
    tempdir = config.get("tempdir") if isinstance(config, dict) else None
    if not isinstance(tempdir, str) or os.path.isdir(tempdir):
        return
    try:
        os.mkdir(tempdir, 0o700)
    except OSError:
        config["tempdir"] = None  # `util.get_temp_dir` makes a new one


def _reap(pid: int) -> None:
    """Wait for a forgotten forkserver to exit, so that it leaves no zombie behind."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def close_failed_start(error: BaseException) -> None:
    """Close the descriptors CPython's forkserver start left open when `Process.start` failed with `error`.
    Call it once for that error, before anything else may open descriptors in this thread.

    Out of descriptors (EMFILE: a server whose connections took them all), multiprocessing left two open
    each time its second pipe could not be made (`ForkServer.connect_to_new_process` closes only the pipes
    it got to hand over), and two when the duplicate of the data pipe could not be made (`Popen._launch`),
    with the child the forkserver had forked waiting for its data for good; a start that failed after that
    left two more to the Popen's finalizer, which a traceback in a reference cycle put off to a full
    collection. Each such leak was for good: a server whose descriptors ran out under load kept failing
    worker starts, every page a 503, after the load had gone. The frames `error` passed through say which
    of these happened (what their locals hold: what had been made before the failure). Only descriptors
    that nothing has closed are closed, and only in frames of the code known to leak them."""
    traceback = error.__traceback__
    while traceback is not None:
        code, names = traceback.tb_frame.f_code, traceback.tb_frame.f_locals
        if code is _CONNECT_CODE and "parent_r" in names and "child_r" not in names:
            parent_r, child_w = names.get("parent_r"), names.get("child_w")
            if _one_pipe(parent_r, child_w):  # its first pipe, made: the second failed
                _close(parent_r, child_w)
        elif code is _LAUNCH_CODE and "w" in names:  # the forkserver took the start: its two pipes
            _close_launch(names)
        traceback = traceback.tb_next


def _close_launch(names: Mapping[str, Any]) -> None:
    """What `Popen._launch` had made when it failed: the status pipe (`sentinel`) and the data pipe (`w`)
    from the forkserver, then a duplicate of the data pipe (`_parent_w`) that it hands, with the status
    pipe, to a finalizer, then `w` to a file that closes it when its `with` block ends. A failure in the
    `open` of that file (out of memory) may or may not have closed `w`: it is left."""
    popen = names.get("self")
    finalizer = getattr(popen, "finalizer", None)
    if finalizer is not None:
        finalizer()  # the status pipe and the duplicate, now rather than when the Popen is collected
    else:  # no duplicate made, or no finalizer: nothing would ever close them
        _close(names.get("w"), getattr(popen, "sentinel", None), names.get("_parent_w"))


def _one_pipe(read_end: object, write_end: object) -> bool:
    """Whether `read_end` and `write_end` are still the two ends of one pipe, as `os.pipe` made them."""
    if not isinstance(read_end, int) or not isinstance(write_end, int):
        return False
    try:
        read, write = os.fstat(read_end), os.fstat(write_end)
    except OSError:
        return False
    return stat.S_ISFIFO(read.st_mode) and (read.st_dev, read.st_ino) == (write.st_dev, write.st_ino)


def _close(*fds: object) -> None:
    for fd in fds:
        if isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.close(fd)


class DescriptorShortages:
    """The forkservers (as `forkserver_in_use` names them) that a process start ran out of file descriptors
    with: one that reached its forkserver before it ran out ends it (`forkserver_exit`), and the next
    start meets it gone (its connection refused, or cut off). That start's failure says only so
    (`ConnectionRefusedError: [Errno 111] Connection refused`); asked here, it can say what to act on,
    the descriptor limit. One per server process, as its forkserver is (`SHORTAGES`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forkservers: list[object] = []  # (the last few: a start meets the one it used last)

    def note(self, ctx: BaseContext) -> None:
        """A process start of `ctx` failed for want of file descriptors (`out_of_descriptors`)."""
        seen = forkserver_in_use(ctx)
        if seen is None:
            return
        with self._lock:
            if seen not in self._forkservers:
                self._forkservers = [*self._forkservers[-3:], seen]

    def ended(self, seen: object) -> str | None:
        """Why a start could not reach the forkserver `seen` names, where a start before it ran out of file
        descriptors with it: a clause for its message, naming the limit (`descriptor_limit`); else None."""
        with self._lock:
            if seen is None or seen not in self._forkservers:
                return None
        reached = "a start before ran out of file descriptors, which ends the forkserver it reached"
        return f"{reached}: {descriptor_limit()}"


SHORTAGES: Final = DescriptorShortages()


def out_of_descriptors(error: BaseException | None) -> bool:
    """Whether `error` is a process's failure for want of file descriptors: its own limit reached (EMFILE)."""
    return isinstance(error, OSError) and error.errno == errno.EMFILE


def descriptor_limit() -> str:
    """What a start that ran out of file descriptors says of them: the limit this process runs with (its
    forkserver's and workers' too), and how to raise it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:  # only a privileged change raises it
        how = f"raise it and its hard limit ({hard}): `ulimit -n` as root, the container's nofile ulimit"
    else:
        above = "" if hard == resource.RLIM_INFINITY else f", up to {hard}"
        how = f"raise it with `ulimit -n` before starting the server{above}, or the container's nofile ulimit"
    return f"the limit is {soft} open files (RLIMIT_NOFILE): {how}"


def launch_failure(error: BaseException) -> str:
    """Why a worker's process could not be launched, for a message: out of file descriptors, with the limit
    and how to raise it (`descriptor_limit`), rather than `[Errno 24] Too many open files`; else the
    error's class and text."""
    if out_of_descriptors(error):
        return f"too many open files: {descriptor_limit()}"
    return f"{type(error).__name__}: {error}"
