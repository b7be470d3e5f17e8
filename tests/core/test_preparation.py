"""One document's way to token ids: the bounded prefix, and the count behind a length refusal."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from service.core.errors import HtmllmError
from service.core.preparation import COUNT_LIMIT_FACTOR, init_worker, prepare, prepare_in_worker
from service.core.prune import InputTooLargeError, ParseFailedError, TooManyNamesError, prune_html
from service.core.tokenizer import HtmlTokenizer
from service.core.workers import WorkerPool
from tests.factories.names import colliding_names
from tests.factories.tokenizer import build_tiny_tokenizer
from tests.memory import vm_data_mib


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


def _worker_pool(
    tok: HtmlTokenizer, memory_limit_bytes: int | None = None, timed: bool = False
) -> WorkerPool:
    return WorkerPool(
        1,
        name="preprocessing",
        preload=["service.core.preparation"],
        initializer=init_worker,
        initargs=(tok.to_json(), None, timed),
        memory_limit_bytes=memory_limit_bytes,
    )


def test_a_preprocessing_process_outlives_a_ctrl_c_to_its_group() -> None:
    """The parent decides what stops at a Ctrl-C: the server drains its queue through these workers."""
    tok = build_tiny_tokenizer()
    with _worker_pool(tok) as pool:
        pid = pool.call(os.getpid, (), timeout_s=60)
        os.kill(pid, signal.SIGINT)
        time.sleep(0.2)
        prepared = pool.call(prepare_in_worker, (_page(5), None, 32, True), timeout_s=60)
        assert prepared.ids == prepare(tok, _page(5), None, max_length=32, truncate=True).ids
        assert pool.call(os.getpid, (), timeout_s=60) == pid  # the same worker, alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap on Linux")
def test_a_page_past_the_memory_limit_fails_typed_and_the_worker_prunes_on() -> None:
    """What the pruner's pre-checks misjudge cannot take the pod: a parse that needs more memory than
    the worker may use fails as a typed error, and the pool serves the next page: in the same worker, or
    in a fresh one where the failed parse left it holding more than half its room (here, with 4 MiB of
    room, that depends on what the allocator gave back: `WorkerPool` replaces such a worker, since every
    later page had failed in it)."""
    tok = build_tiny_tokenizer()
    with _worker_pool(tok) as probe:
        probe.call(prepare_in_worker, (_page(5), None, 32, True), timeout_s=60)
        idle_mib = probe.call(vm_data_mib, (), timeout_s=60)
        # No tokenizer thread pool: started mid-page under the limit, it failed and aborted the worker.
        assert probe.call(_tokenizers_parallelism, (), timeout_s=60) == "false"
    # 3 MB of markup, in the pruner's budgets: its parse needs 16-32 MiB more than an idle worker holds.
    big = "<html><body>" + "<div class='a'><span>some text</span> more</div>\n" * 60_000 + "</body></html>"
    with _worker_pool(tok, memory_limit_bytes=(idle_mib + 4) * 2**20) as pool:
        with pytest.raises(HtmllmError) as refused:
            pool.call(prepare_in_worker, (big, None, 32, True), timeout_s=60)
        assert isinstance(refused.value, InputTooLargeError | ParseFailedError)
        assert f"may use {idle_mib + 4} MiB" in refused.value.message
        # The setting named as a library caller sets it, and as a server's operator does.
        said = "EngineConfig.preprocess_memory_limit_mb, HTMLLM_PREPROCESS_MEMORY_LIMIT_MB in the service"
        assert said in refused.value.message
        prepared = pool.call(prepare_in_worker, (_page(5), None, 32, True), timeout_s=60)
        assert prepared.ids == prepare(tok, _page(5), None, max_length=32, truncate=True).ids
        assert pool.live_workers == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap on Linux")
def test_a_worker_held_to_a_memory_limit_leaves_the_text_growth_check_to_it() -> None:
    """A page that grows a text node in many pieces (660 KB, about 1.1 GB to parse) is refused by the
    pruner's check where nothing else bounds it, and fails against the limit of a worker held to one
    (which prunes without that check, its costliest: `prune_document`); the pool prunes on."""
    page = "<table>" + ("y" * 8 + "<!>") * 60_000
    with pytest.raises(InputTooLargeError, match="grows text nodes"):
        prune_html(page)
    tok = build_tiny_tokenizer()
    with _worker_pool(tok, memory_limit_bytes=1024 * 2**20) as pool:
        with pytest.raises(ParseFailedError) as failed:
            pool.call(prepare_in_worker, (page, None, 32, True), timeout_s=60)
        assert "may use 1024 MiB, EngineConfig.preprocess_memory_limit_mb" in failed.value.message
        prepared = pool.call(prepare_in_worker, (_page(5), None, 32, True), timeout_s=60)
        assert prepared.ids == prepare(tok, _page(5), None, max_length=32, truncate=True).ids
        assert pool.live_workers == 1  # (the same worker, or a fresh one if the parse left it near its limit)


def test_a_timed_worker_leaves_the_name_lookup_check_to_its_time_limit() -> None:
    """A page of 3,000 names sharing one hash bucket and 60,000 uses of the last (about 0.4 s to parse;
    the same at 16 MB: minutes) is refused by the pruner's check where nothing else bounds it, and
    pruned by a worker its parent stops after a time limit (which prunes without the check)."""
    names = colliding_names(3000, 5)
    page = b"".join(b"<br " + name + b">" for name in names) + (b"<br " + names[-1] + b">x") * 60_000
    with pytest.raises(TooManyNamesError):
        prune_html(page)
    tok = build_tiny_tokenizer()
    with _worker_pool(tok, timed=True) as pool:
        prepared = pool.call(prepare_in_worker, (page, None, 32, True), timeout_s=60)
        assert prepared.truncated
    with _worker_pool(tok) as pool, pytest.raises(TooManyNamesError):
        pool.call(prepare_in_worker, (page, None, 32, True), timeout_s=60)


def _tokenizers_parallelism() -> str | None:
    return os.environ.get("TOKENIZERS_PARALLELISM")
