"""A worker's heap left near its memory limit, as a page that ran into the limit can leave it (glibc keeps
what it freed, as it sees fit): for the tests of what a pool does with such a worker. A module of its own,
light to import, so that a worker held to a low limit can run it.
"""

from __future__ import annotations

import resource

# What `fill_but` keeps in the worker across jobs.
_KEPT: list[bytearray] = []


def fill_but(left_mib: int) -> None:
    """Keep all the data this worker's memory limit (`RLIMIT_DATA`) still allows but `left_mib` MiB, then
    fail as a page does that runs into the limit (MemoryError)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    with open("/proc/self/status") as status:
        data = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
    keep(max(0, soft - data - left_mib * 2**20) // 2**20)
    raise MemoryError("a page that ran into the limit, and left the heap there")


def keep(mib: int) -> None:
    """Allocate `mib` MiB and keep it across jobs."""
    _KEPT.append(bytearray(mib * 2**20))


def keep_and_fail(mib: int) -> None:
    """`keep(mib)`, then fail (a page that ran into the limit)."""
    keep(mib)
    raise MemoryError(f"kept {mib} MiB")
