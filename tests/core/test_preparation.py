"""One document's way to token ids: the bounded prefix, and the count behind a length refusal."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor

from service.core.preparation import COUNT_LIMIT_FACTOR, init_worker, prepare, prepare_in_worker
from service.core.prune import prune_html
from service.core.tokenizer import HtmlTokenizer
from tests.factories.tokenizer import build_tiny_tokenizer


def _page(words: int) -> str:
    return "<html><body><p>" + " ".join(f"word{i % 50}" for i in range(words)) + "</p></body></html>"


def test_a_page_over_the_limit_is_counted_exactly_up_to_a_bound() -> None:
    tok: HtmlTokenizer = build_tiny_tokenizer()
    max_length = 32
    near = prepare(tok, _page(40), None, max_length=max_length, truncate=False)
    assert near.truncated and near.over_limit_exact
    assert near.over_limit == tok.encode(prune_html(_page(40))).full_length
    assert near.over_limit < COUNT_LIMIT_FACTOR * max_length
    far = prepare(tok, _page(20_000), None, max_length=max_length, truncate=False)
    assert far.truncated and not far.over_limit_exact  # counting stopped: "more than" in the message
    assert far.over_limit == COUNT_LIMIT_FACTOR * max_length
    assert far.ids == prepare(tok, _page(20_000), None, max_length=max_length, truncate=True).ids
    cut = prepare(tok, _page(20_000), None, max_length=max_length, truncate=True)
    assert cut.over_limit is None and len(cut.ids) == max_length


def test_a_preprocessing_process_outlives_a_ctrl_c_to_its_group() -> None:
    """The parent decides what stops at a Ctrl-C: the server drains its queue through these workers."""
    tok = build_tiny_tokenizer()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        1, mp_context=context, initializer=init_worker, initargs=(tok.to_json(),)
    ) as pool:
        pid = pool.submit(os.getpid).result(timeout=60)
        os.kill(pid, signal.SIGINT)
        time.sleep(0.2)
        prepared = pool.submit(prepare_in_worker, _page(5), None, 32, True).result(timeout=60)
        assert prepared.ids == prepare(tok, _page(5), None, max_length=32, truncate=True).ids
        assert pool.submit(os.getpid).result(timeout=60) == pid  # the same worker, alive
