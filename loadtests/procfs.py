"""What Linux /proc says about the server's process tree and the host: memory, CPU seconds, sockets.

Kept apart from the driver so benchmarks can read the same counters (`own_cpu_seconds`) without the
load-test command line. Everything here reads /proc when called; nothing is read at import.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it (Linux /proc), `pid` first.

    The server's work is not all in its own process: with `HTMLLM_INFERENCE_PROCESS` the model runs in a
    child, with `HTMLLM_PREPROCESS_POOL=process` pages are pruned in a forkserver's children, and text
    extraction has its own processes. Reading only the server's pid would miss them. Each thread's
    `children` file names the processes it started (a few reads); without it, every /proc/*/stat.
    """
    children_of = _started_by if Path(f"/proc/{pid}/task/{pid}/children").exists() else _children_by_scan()
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children_of(current))
    return tree


def _started_by(pid: int) -> list[int]:
    """The processes `pid`'s threads started, from their `children` files."""
    children: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children.extend(int(child) for child in listing.read_text(encoding="ascii").split())
        except (OSError, ValueError):
            continue  # the thread or process ended meanwhile
    return children


def _children_by_scan() -> Callable[[int], list[int]]:
    """Every process's children, from every /proc/*/stat's parent field (kernels without `children`)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
            parent = int(stat.rsplit(")", 1)[-1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or unreadable
        children.setdefault(parent, []).append(int(entry.name))
    return lambda pid: children.get(pid, [])


def _read_tree(pid: int, tree: list[int] | None, name: str) -> list[tuple[int, str]] | None:
    """`/proc/<member>/<name>` of `pid` and its descendants; None once `pid` itself is gone (a descendant
    that ended meanwhile is left out)."""
    texts: list[tuple[int, str]] = []
    for member in tree if tree is not None else process_tree(pid):
        try:
            texts.append((member, Path(f"/proc/{member}/{name}").read_text(encoding="ascii")))
        except OSError:
            if member == pid:
                return None
    return texts


def server_memory_mb(pid: int, tree: list[int] | None = None) -> dict[str, float] | None:
    """Resident and peak resident memory of the server and its processes, summed (Linux /proc), to see
    growth over a soak run; None once the server is gone. Pages the processes share are counted in each
    (the forkserver's children share its imports): an upper bound, as a container's limit would not be."""
    statuses = _read_tree(pid, tree, "status")
    if statuses is None:
        return None
    rss = peak = 0
    for member, status in statuses:
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            rss += int(fields["VmRSS"].split()[0])
            peak += int(fields["VmHWM"].split()[0])
        except (KeyError, ValueError, IndexError):
            if member == pid:
                return None
    return {"rss_mb": round(rss / 1024, 1), "peak_rss_mb": round(peak / 1024, 1)}


def process_cpu_seconds(pid: int, tree: list[int] | None = None) -> float | None:
    """User plus system CPU seconds so far of `pid`'s threads, its live descendants' and the children it
    has reaped (Linux /proc); None once it is gone. The server's model and preprocessing may run in
    processes of their own (`process_tree`); their work is the server's."""
    stats = _read_tree(pid, tree, "stat")
    if stats is None:
        return None
    total = 0.0
    for member, stat in stats:
        try:
            own, reaped = _cpu_ticks(stat)
        except (IndexError, ValueError):
            if member == pid:
                return None
            continue
        ticks = own + reaped if member == pid else own  # the children it reaped count once, with it
        total += ticks / os.sysconf("SC_CLK_TCK")
    return total


def own_cpu_seconds(stat_path: str | Path) -> float | None:
    """User plus system CPU seconds of the one process or thread whose /proc stat file this is
    (`/proc/<pid>/stat`, `/proc/<pid>/task/<tid>/stat`), not its children's; None once it is gone."""
    try:
        own, _ = _cpu_ticks(Path(stat_path).read_text(encoding="ascii"))
    except (OSError, IndexError, ValueError):
        return None
    return own / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(stat: str) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) in clock ticks, from a /proc stat file's text."""
    # Field 2 (the command) is in parentheses and may hold spaces: split after its closing one.
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


class HostCpu(NamedTuple):
    """Cumulative CPU seconds of the whole machine; two readings give the shares over an interval."""

    total: float  # seconds of all CPUs
    busy: float  # running anything (this server, locust, the rest of the machine)
    steal: float  # the hypervisor ran someone else while this guest wanted the CPU


def host_cpu_seconds() -> HostCpu | None:
    """The whole machine's CPU time so far, summed over its CPUs (Linux /proc/stat's first line)."""
    try:
        first = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    except (OSError, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = user + nice + system + idle + iowait + irq + softirq + steal  # guest time is inside user
    return HostCpu(total / ticks, (total - idle - iowait - steal) / ticks, steal / ticks)


_TCP_LISTEN = "0A"  # the state column of a listening socket in /proc/net/tcp


def listening_sockets(port: int) -> dict[int, str] | None:
    """The IPv4 TCP sockets listening on `port` in this network namespace, inode -> bound address
    ("127.0.0.1", "0.0.0.0"), from /proc/net/tcp; None where it cannot be read (not Linux).

    Which process answers a port cannot be told from the answer (any server may say 200 to /ready); the
    kernel's socket table names the socket, and the socket's inode names its process (`socket_inodes`)."""
    try:
        lines = Path("/proc/net/tcp").read_text(encoding="ascii").splitlines()[1:]
    except OSError:
        return None
    found: dict[int, str] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _TCP_LISTEN:
            continue
        address, _, hex_port = fields[1].partition(":")
        try:
            if int(hex_port, 16) != port:
                continue
            # The address is the kernel's 32-bit word in host byte order, printed in hex.
            packed = int(address, 16).to_bytes(4, sys.byteorder)
            found[int(fields[9])] = socket.inet_ntoa(packed)
        except (ValueError, OverflowError):
            continue
    return found


def socket_inodes(pids: Iterable[int]) -> set[int]:
    """The inodes of the sockets these processes hold open (their /proc/<pid>/fd links read
    `socket:[<inode>]`); a process that ended meanwhile, or another user's, adds none."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes
