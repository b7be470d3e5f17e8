"""The series of server readings taken while the load runs, and what they say over the run.

Two readings (ready, end) cannot tell allocator growth during warm-up from a slow leak, and one latency
figure cannot tell a slower server from a starved one; a series of RSS and CPU readings can. This module
owns that series: the sampling thread, its CSV (`server.csv`), and its summaries (RSS trend, CPU share).
The load generator's CPU is read beside the server's: locust is one process, and a run where it needs
about a core measures locust, not the server.
"""

from __future__ import annotations

import csv
import os
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from loadtests.procfs import HostCpu, host_cpu_seconds, process_cpu_seconds, process_tree, server_memory_mb


class ServerSample(NamedTuple):
    """One reading. The CPU figures are over the interval since the previous reading (None on the first).

    `server_cpu` and `generator_cpu` (locust's) are in cores (1.0: one CPU busy the whole interval);
    `host_busy` and `host_steal` are shares of the whole machine. A server that gets well under
    `os.cpu_count()` cores while the host is not busy either is waiting (on its batcher, on locust); with
    the host busy or stolen, it is being starved; with the generator near one core, locust is the limit.
    """

    seconds: float
    rss_mb: float
    server_cpu: float | None
    host_busy: float | None
    host_steal: float | None
    generator_cpu: float | None = None


# Locust runs its users in one process (gevent): it cannot use more than one core, and where it needs
# about one, requests wait on it, and the latency and throughput figures are locust's.
GENERATOR_BUSY_CORES = 0.9


class ServerSampler(threading.Thread):
    """Samples the server's RSS and CPU, and the host's CPU, every `interval` seconds while the load runs.

    Two readings (ready, end) cannot tell allocator growth during warm-up from a slow leak; a series can.
    The CPU columns say whether latency that moved during a run followed the CPU the server got.
    """

    def __init__(self, pid: int, interval: float, generator_pid: int | None = None) -> None:
        super().__init__(name="server-sampler", daemon=True)
        self.pid, self.interval = pid, max(interval, 0.1)
        self.generator_pid = generator_pid
        self.samples: list[ServerSample] = []
        self._stop_event = threading.Event()
        self._origin = time.monotonic()
        self._last: tuple[float, float | None, HostCpu | None, float | None] | None = None

    def run(self) -> None:
        self._origin = time.monotonic()
        while True:
            self.sample()
            if self._stop_event.wait(self.interval):
                return

    def sample(self) -> None:
        tree = process_tree(self.pid)
        now, memory = time.monotonic(), server_memory_mb(self.pid, tree)
        cpu, host = process_cpu_seconds(self.pid, tree), host_cpu_seconds()
        generator = None if self.generator_pid is None else process_cpu_seconds(self.generator_pid)
        if memory is None:
            return
        server_cpu = host_busy = host_steal = generator_cpu = None
        if self._last is not None:
            last_time, last_cpu, last_host, last_generator = self._last
            if cpu is not None and last_cpu is not None and now > last_time:
                server_cpu = round((cpu - last_cpu) / (now - last_time), 3)
            if generator is not None and last_generator is not None and now > last_time:
                generator_cpu = round((generator - last_generator) / (now - last_time), 3)
            if host is not None and last_host is not None and host.total > last_host.total:
                span = host.total - last_host.total
                host_busy = round((host.busy - last_host.busy) / span, 3)
                host_steal = round((host.steal - last_host.steal) / span, 3)
        self._last = (now, cpu, host, generator)
        seconds = round(now - self._origin, 1)
        self.samples.append(
            ServerSample(seconds, memory["rss_mb"], server_cpu, host_busy, host_steal, generator_cpu)
        )

    def stop(self) -> list[ServerSample]:
        """Stops sampling after one last sample; the series so far."""
        self._stop_event.set()
        self.join(timeout=5)
        self.sample()
        return self.samples


def generator_cpu_summary(samples: Sequence[ServerSample]) -> dict[str, float | int | bool] | None:
    """The CPU the load generator (locust) used over the run: cores, mean, 90th percentile and most of
    the intervals, and `near_one_core` when a tenth of them or more were at `GENERATOR_BUSY_CORES` or
    over; None with fewer than 2 intervals."""
    cores = [s.generator_cpu for s in samples if s.generator_cpu is not None]
    if len(cores) < 2:
        return None
    p90 = statistics.quantiles(cores, n=10, method="inclusive")[-1]
    return {
        "intervals": len(cores),
        "cores_mean": round(statistics.fmean(cores), 3),
        "cores_p90": round(p90, 3),
        "cores_max": max(cores),
        "near_one_core": p90 >= GENERATOR_BUSY_CORES,
    }


def cpu_summary(samples: Sequence[ServerSample]) -> dict[str, float | int] | None:
    """The CPU the server got over the run (cores: mean, 10th and 90th percentile of the intervals) and
    the host's mean busy and steal shares; None with fewer than 2 intervals."""
    server = [s.server_cpu for s in samples if s.server_cpu is not None]
    busy = [s.host_busy for s in samples if s.host_busy is not None]
    steal = [s.host_steal for s in samples if s.host_steal is not None]
    if len(server) < 2:
        return None
    deciles = statistics.quantiles(server, n=10, method="inclusive")
    summary: dict[str, float | int] = {
        "intervals": len(server),
        "cpus": os.cpu_count() or 1,
        "server_cores_mean": round(statistics.fmean(server), 3),
        "server_cores_p10": round(deciles[0], 3),
        "server_cores_p90": round(deciles[-1], 3),
    }
    if busy and steal:
        summary |= {
            "host_busy_mean": round(statistics.fmean(busy), 3),
            "host_steal_mean": round(statistics.fmean(steal), 3),
        }
    return summary


def memory_trend(samples: Sequence[tuple[float, float]]) -> dict[str, float | int | None] | None:
    """RSS growth over the second half of a run: the least-squares slope in MB per minute, and the medians
    of both halves. None with fewer than 3 samples in the second half (a run too short to say)."""
    if not samples:
        return None
    half = samples[-1][0] / 2
    late = [(t, mb) for t, mb in samples if t >= half]
    early = [mb for t, mb in samples if t < half]
    if len(late) < 3 or late[-1][0] == late[0][0]:
        return None
    slope = statistics.linear_regression([t for t, _ in late], [mb for _, mb in late]).slope
    return {
        "samples": len(samples),
        "second_half_mb_per_min": round(60 * slope, 3),
        "first_half_median_mb": round(statistics.median(early), 1) if early else None,
        "second_half_median_mb": round(statistics.median(mb for _, mb in late), 1),
        "max_mb": max(mb for _, mb in samples),
    }


def write_server_csv(path: Path, samples: Sequence[ServerSample]) -> None:
    """`server.csv`: one row per reading, empty cells where an interval figure is not known yet."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(ServerSample._fields)
        writer.writerows(["" if value is None else value for value in sample] for sample in samples)
