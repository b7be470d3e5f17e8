"""The CPU budget: cgroup v1 and v2 quotas on the process's cgroup path, affinity, and the thread choice.

Each test lays out a fake `/proc/self` and cgroup filesystem under tmp_path, the way a container
runtime would on a real node, and reads it through `cpu_budget(proc_self=..., root=...)`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from service.core.cpus import CpuBudget, affinity_cpus, cpu_budget, intra_op_threads, pool_workers

V2_MOUNT = (
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate"
)
V1_CPU_MOUNT = "32 31 0:29 {root} {point} rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct"
OTHER_MOUNTS = (
    "23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw",
    "25 23 0:5 / /proc rw,nosuid - proc proc rw",
    "33 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
)


def _layout(tmp_path: Path, *, cgroup: str, mounts: list[str], files: dict[str, str]) -> CpuBudget:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("\n".join([*OTHER_MOUNTS, *mounts]) + "\n")
    for name, text in files.items():
        path = tmp_path / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return cpu_budget(proc_self=proc, root=tmp_path)


def _container_v2(tmp_path: Path, cpu_max: str, *, pod_cpu_max: str | None = None) -> CpuBudget:
    """A Kubernetes container's cgroup v2 layout, `/kubepods/pod1/c1`, with its `cpu.max` (and its
    pod's, if given): the layouts below differ only in those files."""
    files = {"/sys/fs/cgroup/kubepods/pod1/c1/cpu.max": cpu_max}
    if pod_cpu_max is not None:
        files["/sys/fs/cgroup/kubepods/pod1/cpu.max"] = pod_cpu_max
    return _layout(tmp_path, cgroup="0::/kubepods/pod1/c1\n", mounts=[V2_MOUNT], files=files)


def test_no_cgroup_limit_leaves_the_affinity_mask(tmp_path: Path) -> None:
    budget = _container_v2(tmp_path, "max 100000\n")
    assert budget.limit is None and budget.affinity == affinity_cpus()
    assert budget.threads == affinity_cpus()


def test_cgroup_v2_quota_of_the_process_cgroup(tmp_path: Path) -> None:
    budget = _container_v2(tmp_path, "150000 100000\n", pod_cpu_max="max 100000\n")
    assert budget.limit == pytest.approx(1.5)
    assert budget.limit_file == str(tmp_path / "sys/fs/cgroup/kubepods/pod1/c1/cpu.max")
    assert "1.5" in budget.describe()


def test_a_tighter_parent_limit_wins(tmp_path: Path) -> None:
    # The kernel enforces every level: a pod-level limit over an unlimited container cgroup still binds.
    budget = _layout(
        tmp_path,
        cgroup="0::/kubepods/pod1/c1\n",
        mounts=[V2_MOUNT],
        files={
            "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "max 100000\n",
            "/sys/fs/cgroup/kubepods/pod1/cpu.max": "200000 100000\n",
            "/sys/fs/cgroup/kubepods/cpu.max": "800000 100000\n",
            "/sys/fs/cgroup/cpu.max": "50000 100000\n",  # the mount's root counts too
        },
    )
    assert budget.limit == pytest.approx(0.5)
    assert budget.limit_file == str(tmp_path / "sys/fs/cgroup/cpu.max")


def test_nothing_above_the_mount_is_read(tmp_path: Path) -> None:
    # A cgroup namespace mounts the container's own cgroup as the root; the host's files beside it
    # are not part of this process's hierarchy.
    budget = _layout(
        tmp_path,
        cgroup="0::/\n",
        mounts=[V2_MOUNT],
        files={"/sys/fs/cpu.max": "10000 100000\n", "/sys/fs/cgroup/cpu.max": "300000 100000\n"},
    )
    assert budget.limit == pytest.approx(3.0)


def test_cgroup_v1_quota_with_the_cgroup_path_as_the_mount_root(tmp_path: Path) -> None:
    # Docker on cgroup v1 without a cgroup namespace: /proc/self/cgroup names the full path, and the
    # mount shows that same path as its root, so the limit sits at the mount point itself.
    point = "/sys/fs/cgroup/cpu,cpuacct"
    budget = _layout(
        tmp_path,
        cgroup="4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        mounts=[V1_CPU_MOUNT.format(root="/docker/abc", point=point)],
        files={f"{point}/cpu.cfs_quota_us": "50000\n", f"{point}/cpu.cfs_period_us": "100000\n"},
    )
    assert budget.limit == pytest.approx(0.5)
    assert budget.threads == 1


def test_cgroup_v1_without_a_quota(tmp_path: Path) -> None:
    point = "/sys/fs/cgroup/cpu"
    budget = _layout(
        tmp_path,
        cgroup="3:cpu:/\n",
        mounts=[V1_CPU_MOUNT.format(root="/", point=point)],
        files={f"{point}/cpu.cfs_quota_us": "-1\n", f"{point}/cpu.cfs_period_us": "100000\n"},
    )
    assert budget.limit is None


def test_hybrid_hierarchies_take_the_tighter_of_v1_and_v2(tmp_path: Path) -> None:
    point = "/sys/fs/cgroup/cpu"
    budget = _layout(
        tmp_path,
        cgroup="3:cpu:/job\n0::/job\n",
        mounts=[
            V1_CPU_MOUNT.format(root="/", point=point),
            "40 31 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw",
        ],
        files={
            f"{point}/job/cpu.cfs_quota_us": "250000\n",
            f"{point}/job/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/unified/job/cpu.max": "120000 100000\n",
        },
    )
    assert budget.limit == pytest.approx(1.2)


def test_an_escaped_mount_point_is_read(tmp_path: Path) -> None:
    mount = "30 23 0:26 / /srv/cgroup\\040fs rw - cgroup2 cgroup2 rw"
    budget = _layout(
        tmp_path, cgroup="0::/a\n", mounts=[mount], files={"/srv/cgroup fs/a/cpu.max": "100000 100000\n"}
    )
    assert budget.limit == pytest.approx(1.0)


@pytest.mark.parametrize("cgroup", ["0::/elsewhere/c1\n", "0::/../host\n"])
def test_a_cgroup_outside_the_mounted_subtree_is_not_guessed(tmp_path: Path, cgroup: str) -> None:
    mount = "30 23 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw"
    budget = _layout(
        tmp_path,
        cgroup=cgroup,
        mounts=[mount],
        files={"/sys/fs/cgroup/cpu.max": "100000 100000\n", "/sys/fs/host/cpu.max": "100000 100000\n"},
    )
    assert budget.limit is None


def test_missing_files_mean_no_limit(tmp_path: Path) -> None:
    assert cpu_budget(proc_self=tmp_path / "nothing", root=tmp_path).limit is None


@pytest.mark.parametrize("seed", range(20))
def test_garbage_never_raises(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)

    def noise() -> str:
        alphabet = "0123456789 :-/\n\\cgroup2maxcpu,"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))

    budget = _layout(
        tmp_path,
        cgroup=noise(),
        mounts=[V2_MOUNT, noise()],
        files={"/sys/fs/cgroup/cpu.max": noise(), "/sys/fs/cgroup/cpu.cfs_quota_us": noise()},
    )
    assert budget.threads >= 1


@pytest.mark.parametrize(
    ("affinity", "limit", "threads"),
    [
        (64, None, 64),
        (64, 2.0, 2),
        (64, 1.5, 2),
        (64, 1.0, 1),
        (64, 0.5, 1),
        (2, 8.0, 2),
        (64, 3.0000000001, 3),
        (64, 3.00001, 4),
    ],
)
def test_threads_are_the_limit_rounded_up_within_the_affinity(
    affinity: int, limit: float | None, threads: int
) -> None:
    assert CpuBudget(affinity=affinity, limit=limit).threads == threads


def test_the_setting_then_omp_then_the_budget() -> None:
    budget = CpuBudget(affinity=64, limit=2.0, limit_file="/sys/fs/cgroup/cpu.max")
    assert intra_op_threads(3, environ={"OMP_NUM_THREADS": "5"}, budget=budget).threads == 3
    omp = intra_op_threads(None, environ={"OMP_NUM_THREADS": "5"}, budget=budget)
    assert (omp.threads, omp.reason) == (5, "OMP_NUM_THREADS")
    for unusable in ("", "0", "four", "4,2"):
        chosen = intra_op_threads(None, environ={"OMP_NUM_THREADS": unusable}, budget=budget)
        assert chosen.threads == 2 and "/sys/fs/cgroup/cpu.max" in chosen.reason
    with pytest.raises(ValueError, match="at least 1"):
        intra_op_threads(0, environ={}, budget=budget)


def test_worker_pools_follow_a_cgroup_quota_up_to_their_cap(tmp_path: Path) -> None:
    """A fixed 2 prune and 2 extraction workers beside 1 torch thread overran a 1-CPU quota."""
    budget = _container_v2(tmp_path, "100000 100000\n")
    assert budget.limit == pytest.approx(1.0)
    assert pool_workers(None, cap=2, environ={}, budget=budget) == 1
    assert pool_workers(None, cap=2, environ={}, budget=CpuBudget(affinity=64, limit=0.5)) == 1  # at least 1
    assert pool_workers(None, cap=2, environ={}, budget=CpuBudget(affinity=64, limit=1.5)) == 2
    assert pool_workers(None, cap=2, environ={}, budget=CpuBudget(affinity=64)) == 2  # the cap
    # The same budget the forward pass follows: its setting, then OMP_NUM_THREADS.
    unlimited = CpuBudget(affinity=64)
    assert pool_workers(1, cap=2, environ={}, budget=unlimited) == 1
    assert pool_workers(None, cap=2, environ={"OMP_NUM_THREADS": "1"}, budget=unlimited) == 1


def test_this_machine_reads_without_error() -> None:
    budget = cpu_budget()
    assert budget.affinity == len(os.sched_getaffinity(0))
    assert 1 <= budget.threads <= budget.affinity
