"""How a job and its answer cross a worker's pipe (`service.core.workers`): a job framed (its length, then
its pickled bytes) and read straight into one buffer of its size, so that a page too large for a worker's
memory limit is read past and answered as a `MemoryError` rather than the worker's death in the middle of
taking it in; a job's exception sent back as itself where it pickles."""

from __future__ import annotations

import gc
import os
import pickle
import struct
from multiprocessing.connection import Connection
from typing import Final

# A job's exception is sent back with at most this much of its message (it may quote the page).
_MESSAGE_CHARS: Final = 500
# A job's frame: its length, then its pickled bytes (`send_job`, `receive_job`).
JOB_HEADER: Final = struct.Struct("!Q")
# A job the worker cannot hold is read past in pieces of this size, into a buffer it has from the start.
DRAIN_CHUNK: Final = 64 * 1024


def _send_error(conn: Connection, exc: BaseException) -> None:
    """The job's exception as itself when it pickles, else as its type name and message."""
    message = str(exc)[:_MESSAGE_CHARS]
    try:
        payload: bytes | None = pickle.dumps(exc)
    except Exception:
        payload = None
    conn.send(("error", payload, type(exc).__name__, message))


def send_job(conn: Connection, job: bytes | memoryview) -> None:
    """`job` framed as `receive_job` reads it: its length, then its bytes, written to the pipe as they
    are (`writev`, no joined copy). `conn` keeps no buffer of its own, so its `recv` of the answer is
    unaffected; a pipe closed meanwhile (`close`) fails `fileno` with OSError, like a dead reader."""
    pending: list[bytes | memoryview] = [JOB_HEADER.pack(len(job)), memoryview(job)]
    while pending:
        written = os.writev(conn.fileno(), pending)
        while pending and written >= len(pending[0]):
            written -= len(pending.pop(0))
        if pending and written:
            pending[0] = pending[0][written:]


def _read_exactly(fd: int, view: memoryview) -> None:
    """Fill `view` from `fd`, straight into its memory; EOFError when the parent's end closes first."""
    while view:
        read = os.readv(fd, [view])
        if not read:
            raise EOFError("the pipe closed inside a job")
        view = view[read:]


class ReadPast(Exception):
    """A job too large for the worker's memory limit, read past: `error` is its answer."""

    def __init__(self, error: MemoryError) -> None:
        super().__init__(str(error))
        self.error = error


def receive_job(fd: int, header: bytearray, spare: bytearray) -> bytearray:
    """The next job's pickled bytes, read into one buffer of its size.

    A job that buffer cannot be allocated for under the memory limit is read past into `spare`, a
    buffer held from the start (`ReadPast`), so the pipe is left at the next job's frame.
    `Connection.recv_bytes` needed the job's size twice over (a read of all of it and a growing copy)
    and failed in the middle of the message, which left nothing to do but die: the parent saw "worker
    died" and paid a new worker for one page's fault. A MemoryError anywhere else here (the few small
    objects a read makes) still ends the worker: where the pipe stands in the frame is then unknown."""
    _read_exactly(fd, memoryview(header))
    (size,) = JOB_HEADER.unpack(header)
    try:
        job = bytearray(size)
    except MemoryError:
        left = size
        with memoryview(spare) as scratch:
            while left:
                piece = min(left, len(scratch))
                _read_exactly(fd, scratch[:piece])
                left -= piece
        too_large = MemoryError(f"a job of {size:,} bytes does not fit in the worker's memory limit")
        raise ReadPast(too_large) from None
    _read_exactly(fd, memoryview(job))
    return job


def report(conn: Connection, exc: BaseException) -> None:
    """Send a failed job's exception back; the caller has already dropped what the job held."""
    exc.__traceback__ = None
    gc.collect()
    try:
        _send_error(conn, exc)
    except MemoryError:
        conn.send(("error", None, type(exc).__name__, "out of memory reporting it"))
