"""How many CPUs this process may really use, and so how many threads a forward pass should run.

torch and onnxruntime size their intra-op thread pools from the CPUs the process may be scheduled on
(its affinity mask), not from the CPU time it is allowed. In a container with a CPU limit (a cgroup
bandwidth quota: `cpu.max` in cgroup v2, `cpu.cfs_quota_us` in v1) on a large node, that is one
thread per node core against a quota of a few CPUs: the threads burn the period's quota in a fraction
of it, the whole container is throttled for the rest, and every forward pass waits on a thread that
is not running (docs/benchmarks.md, "CPU limits"). The JVM, .NET and, since 1.25, Go read the quota
for the same reason.

The quota is read for every cgroup on the path from this process's cgroup up to the root of the
mounted hierarchy, and the tightest one wins: the kernel enforces every level, and a container runtime
can put the limit on a parent of the process's own cgroup. A CPU limit of 1.5 gives 2 threads (the
limit rounded up): on the 2-core machine of the benchmark, 2 threads under a 1.5-CPU quota served
more than 1 did, and 1 thread served more than 2 under a 1-CPU quota.

Nothing here raises: a file that is missing or unreadable is a limit that is not there, which is the
backends' own behaviour.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# Below this a cgroup's quota is not taken as a CPU count (a misread file; the kernel's minimum is 1 ms).
_SMALLEST_LIMIT = 0.01
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs the scheduler may run this process on, and the tightest cgroup CPU limit over it."""

    affinity: int  # CPUs in the process's affinity mask
    limit: float | None = None  # CPUs' worth of time per period the tightest cgroup quota allows
    limit_file: str | None = None  # where that quota was read

    @property
    def threads(self) -> int:
        """Threads that keep every CPU the process may use busy without running over its quota."""
        if self.limit is None:
            return max(1, self.affinity)
        return max(1, min(self.affinity, math.ceil(self.limit - 1e-9)))

    def describe(self) -> str:
        if self.limit is None:
            return f"{self.affinity} CPUs in the affinity mask, no cgroup CPU limit"
        return (
            f"a cgroup CPU limit of {self.limit:g} ({self.limit_file}), "
            f"{self.affinity} CPUs in the affinity mask"
        )


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads a backend runs, and why (logged at start, shown by /info)."""

    threads: int
    reason: str


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all of the machine's where the platform has no masks)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cpu_budget(*, proc_self: Path = Path("/proc/self"), root: Path = Path("/")) -> CpuBudget:
    """This process's CPU budget; `proc_self` and `root` (where mount points lie) are for tests."""
    tightest: tuple[float, str] | None = None
    for limit, where in _cgroup_limits(proc_self, root):
        if tightest is None or limit < tightest[0]:
            tightest = (limit, where)
    if tightest is None:
        return CpuBudget(affinity=affinity_cpus())
    return CpuBudget(affinity=affinity_cpus(), limit=tightest[0], limit_file=tightest[1])


def intra_op_threads(
    requested: int | None,
    *,
    environ: Mapping[str, str] | None = None,
    budget: CpuBudget | None = None,
) -> ThreadChoice:
    """The threads a forward pass runs: the setting, else OMP_NUM_THREADS, else the CPU budget.

    OMP_NUM_THREADS is honoured because torch honours it on its own and a deployment that sets it
    means it; onnxruntime does not read it, so this is also what makes both backends agree.
    """
    if requested is not None:
        if requested < 1:
            raise ValueError(f"intra-op threads must be at least 1, not {requested}")
        return ThreadChoice(requested, "set in the configuration")
    env = os.environ if environ is None else environ
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return ThreadChoice(int(omp), "OMP_NUM_THREADS")
    budget = budget or cpu_budget()
    return ThreadChoice(budget.threads, budget.describe())


def pool_workers(
    requested_threads: int | None,
    *,
    cap: int,
    environ: Mapping[str, str] | None = None,
    budget: CpuBudget | None = None,
) -> int:
    """The default size of a worker pool that shares the CPUs with the forward pass (pruning, text
    extraction): as many workers as the pass runs threads (`intra_op_threads`, so the same setting,
    OMP_NUM_THREADS or cgroup limit), at most `cap`, at least 1.

    A fixed 2 each put 1 torch thread, 2 pruning and 2 extraction processes on a container limited to 1
    CPU, which the quota then throttled as a whole; `cap` keeps a large machine at the pool's own
    default, since each worker costs memory (tens to hundreds of MiB) whether it is busy or not.
    """
    threads = intra_op_threads(requested_threads, environ=environ, budget=budget).threads
    return max(1, min(cap, threads))


def _cgroup_limits(proc_self: Path, root: Path) -> Iterator[tuple[float, str]]:
    """Every CPU quota on this process's cgroup paths, in CPUs, with the file it came from."""
    memberships = _memberships(proc_self)
    for mount_root, mount_point, version in _cgroup_mounts(proc_self):
        path = memberships.get("v2" if version == 2 else "cpu")
        if path is None:
            continue
        relative = _relative(path, mount_root)
        if relative is None:
            continue
        top = root / mount_point.lstrip("/")
        directory = top / relative.lstrip("/")
        while True:
            found = _read_limit(directory, version)
            if found is not None:
                yield found
            if directory == top or top not in directory.parents:
                break
            directory = directory.parent


def _memberships(proc_self: Path) -> dict[str, str]:
    """`/proc/self/cgroup` as {"v2": path} for the unified hierarchy and {"cpu": path} for v1's cpu."""
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    found: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            found["v2"] = path
        elif "cpu" in controllers.split(","):
            found["cpu"] = path
    return found


def _cgroup_mounts(proc_self: Path) -> Iterator[tuple[str, str, int]]:
    """(root of the mounted subtree, mount point, cgroup version) for each cgroup mount with CPU quotas."""
    try:
        lines = (proc_self / "mountinfo").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return
    for line in lines:
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) < separator + 4:
            continue
        fstype, options = fields[separator + 1], fields[separator + 3].split(",")
        if fstype == "cgroup2":
            yield _unescape(fields[3]), _unescape(fields[4]), 2
        elif fstype == "cgroup" and "cpu" in options:
            yield _unescape(fields[3]), _unescape(fields[4]), 1


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def _relative(path: str, mount_root: str) -> str | None:
    """The cgroup `path` below the mounted subtree's root, or None when it lies outside it."""
    if ".." in path.split("/"):  # a cgroup outside this namespace's view
        return None
    if mount_root == "/":
        return path
    if path == mount_root:
        return "/"
    if path.startswith(mount_root + "/"):
        return path[len(mount_root) :]
    return None


def _read_limit(directory: Path, version: int) -> tuple[float, str] | None:
    try:
        if version == 2:
            file = directory / "cpu.max"
            quota_text, period_text = file.read_text().split()[:2]
            if quota_text == "max":
                return None
            quota, period = int(quota_text), int(period_text)
        else:
            file = directory / "cpu.cfs_quota_us"
            quota = int(file.read_text())
            period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if quota <= 0 or period <= 0 or quota / period < _SMALLEST_LIMIT:
        return None
    return quota / period, str(file)
