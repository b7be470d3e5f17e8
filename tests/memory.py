"""Memory measured in-process, for the tests that hold code to a bound on what it allocates."""

from __future__ import annotations

import tracemalloc
import zlib
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def traced_peak(work: Callable[[], T]) -> tuple[T, int]:
    """What `work()` returns, and the most memory Python had allocated while it ran."""
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def gzip_bomb(prefix: bytes, size: int, suffix: bytes = b"") -> bytes:
    """Gzip of `prefix`, `size` spaces and `suffix`, built without holding the spaces (a few KB per MiB)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    step = b" " * (1 << 20)
    out = [compressor.compress(prefix)]
    for _ in range(size >> 20):
        out.append(compressor.compress(step))
    out += [compressor.compress(suffix), compressor.flush()]
    return b"".join(out)


def vm_data_mib(pid: int | str = "self") -> int:
    """A process's data (heap and private writable mappings, /proc's VmData) in MiB: what the workers'
    memory limit (`RLIMIT_DATA`) bounds. Called in a worker, its own."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmData for process {pid}")
