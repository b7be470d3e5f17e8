"""Cells of the memory and pre-check benchmarks' tables that had said something untrue."""

from __future__ import annotations

import math

from tests.benchmarks.scripts import load_script


def test_memory_names_the_time_of_its_after_warm_up_sample() -> None:
    """A run shorter than 60 s took its last sample under a column saying "RSS at 60 s"."""
    memory = load_script("memory")
    short = memory.summarize([[0.0, 0, 500.0], [10.0, 40, 600.0], [20.0, 90, 610.0]])
    assert (short["rss_after_warmup_mb"], short["rss_after_warmup_s"]) == (610.0, 20)
    long = memory.summarize([[float(t), t, 500.0 + t] for t in range(0, 130, 10)])
    assert (long["rss_after_warmup_mb"], long["rss_after_warmup_s"]) == (560.0, 60)


def test_precheck_ratios_leave_out_the_depth_where_it_was_not_timed() -> None:
    """The corpus row times only the gate: its ratio line had said "depth nanx"."""
    precheck = load_script("precheck_cost")
    timed = {"baseline": 3.0, "checkout": 1.5, "baseline depth": 2.0, "checkout depth": 0.5}
    assert precheck.ratios(timed) == "depth 4.0x, gate 2.0x"
    corpus = {"baseline": 3.0, "checkout": 1.5, "baseline depth": math.nan, "checkout depth": math.nan}
    assert precheck.ratios(corpus) == "gate 2.0x"
