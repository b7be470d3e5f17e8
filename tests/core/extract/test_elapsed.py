"""An extraction's `elapsed_s` is the page's own work: a worker's start-up for its first job (and the wait
for an idle worker) had been counted in it, so a pool's first page looked a second slow."""

from __future__ import annotations

import multiprocessing
import time

from service.core.extract import ExtractorPool, extract, extract_all
from service.core.extract.extractors import RawOutput, run_extractor
from tests.core.test_extract import SENTENCES, page

HTML = page("<article>" + "".join(f"<p>{s}</p>" for s in SENTENCES) + "</article>")


def test_a_first_job_s_elapsed_time_leaves_out_the_worker_s_start_up() -> None:
    # A spawned worker imports the extractor libraries itself (a forkserver's fork would be too quick to
    # tell apart): its start-up is most of the first call, the page's extraction a few milliseconds.
    with ExtractorPool(1, context=multiprocessing.get_context("spawn")) as pool:
        started = time.perf_counter()
        result = extract(HTML, "resiliparse", runner=pool)
        call_s = time.perf_counter() - started
        assert result.passed
        (attempt,) = result.attempts
        assert 0 < attempt.elapsed_s <= result.elapsed_s < call_s / 2, (result.elapsed_s, call_s)
        warm = extract_all(HTML, extractors=["resiliparse"], runner=pool)["resiliparse"]
        assert not isinstance(warm, Exception) and warm.elapsed_s > 0


def test_the_extraction_is_timed_where_it_runs() -> None:
    out = run_extractor("resiliparse", HTML)
    assert out.text and out.elapsed_s > 0


class _OwnRunner:
    """A caller's own runner, which builds its outputs without timing them, and takes at least
    `_OWN_RUNNER_S` a call (a remote service, say)."""

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput:
        time.sleep(_OWN_RUNNER_S)
        out = run_extractor(name, html, language=language)
        return RawOutput(out.text, out.language)


_OWN_RUNNER_S = 0.05


def test_a_runner_that_does_not_time_its_extractions_has_its_whole_call_counted() -> None:
    # Its output had said 0 s taken, so the whole call counted as overhead, and the attempt as ~0 s.
    result = extract(HTML, "resiliparse", runner=_OwnRunner())
    (attempt,) = result.attempts
    assert attempt.elapsed_s >= _OWN_RUNNER_S and result.elapsed_s >= attempt.elapsed_s
