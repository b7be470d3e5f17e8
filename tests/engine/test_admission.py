"""The drain rate behind the engine's deadline-aware admission (explicit times, no clock)."""

from __future__ import annotations

import pytest

from service.engine.admission import DrainRate


def test_no_estimate_before_a_batch_ends_while_busy() -> None:
    rate = DrainRate()
    assert rate.seconds_for(100) is None
    rate.finished(1.0, 10)  # never busy: nothing to measure against
    assert rate.seconds_for(100) is None
    rate.busy(2.0)
    rate.finished(3.0, 10)
    assert rate.rate == pytest.approx(10.0)
    assert rate.seconds_for(100) == pytest.approx(10.0)


def test_idle_time_is_not_counted_as_slowness() -> None:
    rate = DrainRate()
    rate.busy(0.0)
    rate.finished(1.0, 20)  # 20 a second
    rate.idle()
    rate.busy(60.0)  # a minute without work
    rate.finished(61.0, 20)
    assert rate.rate == pytest.approx(20.0)


def test_the_rate_follows_a_change_within_its_horizon() -> None:
    rate = DrainRate(horizon_s=5.0)
    rate.busy(0.0)
    rate.finished(1.0, 10)
    now = 1.0
    for _ in range(200):  # 20 s of batches at 100 a second
        now += 0.1
        rate.finished(now, 10)
    assert rate.rate == pytest.approx(100.0, rel=0.02)
    assert rate.seconds_for(1000) == pytest.approx(10.0, rel=0.02)


def test_time_excluded_from_a_busy_interval_is_not_counted_as_slowness() -> None:
    """A pass that waited 50 s for its model to load (an inference process restarted) and then ran
    10 documents in a second: 10 a second, not one fifth."""
    rate = DrainRate()
    rate.busy(0.0)
    rate.exclude(50.0)
    rate.finished(51.0, 10)
    assert rate.rate == pytest.approx(10.0)
    rate.idle()
    rate.exclude(30.0)  # idle: nothing being measured to take it from
    rate.busy(100.0)
    rate.finished(101.0, 10)
    assert rate.rate == pytest.approx(10.0)
