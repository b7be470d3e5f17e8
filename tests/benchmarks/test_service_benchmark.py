"""benchmarks/service.py reads the server's own /metrics: what it prints must be what the server saw."""

from __future__ import annotations

from types import ModuleType

import pytest
from prometheus_client import generate_latest

from service.api.metrics import ServiceMetrics
from tests.benchmarks.scripts import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("service")


def _scrape(metrics: ServiceMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_full_collections_over_the_load_with_their_longest_pause(bench: ModuleType) -> None:
    metrics = ServiceMetrics()
    pause = metrics.gc_pause
    pause.labels(generation="2").observe(0.4)  # before the load (the freeze's own collection)
    pause.labels(generation="0").observe(0.001)
    before = _scrape(metrics)
    for generation, seconds in ((0, 0.00002), (2, 0.2), (2, 0.003), (1, 0.002)):
        pause.labels(generation=str(generation)).observe(seconds)

    out = bench.gc_over_load(before, _scrape(metrics))

    assert out["gc_full_collections"] == 2
    assert out["gc_full_max_ms"] == 250.0  # 0.2 s lies in the (0.1, 0.25] bucket
    assert out["gc_ms"] == pytest.approx(1000 * (0.00002 + 0.2 + 0.003 + 0.002))
    assert bench._full_gc(out) == "2, <250"


def test_a_load_without_full_collections_reads_as_none(bench: ModuleType) -> None:
    metrics = ServiceMetrics()
    metrics.gc_pause.labels(generation="2").observe(0.3)
    scrape = _scrape(metrics)

    out = bench.gc_over_load(scrape, scrape)

    assert out == {"gc_full_collections": 0.0, "gc_full_max_ms": 0.0, "gc_ms": 0.0}
    assert bench._full_gc(out) == "0"
