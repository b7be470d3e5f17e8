"""One document's way to token ids: decode and prune the raw HTML, then tokenize a bounded prefix.

The Engine runs `prepare` on its worker threads, or, with `preprocess_pool="process"`, runs
`prepare_in_worker` in processes (`service.core.workers`) started with `init_worker`: pruning holds
the GIL for most of its time (two threads prune about 1.1x as many pages as one), so on a GPU, which
needs hundreds of pages a second, threads cannot feed the model and processes can; and a process can
be stopped after a time limit and held to a memory limit, a thread cannot. This module imports no
torch, so a worker process starts in a fraction of a second and stays small.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from dataclasses import dataclass
from typing import NamedTuple

from service.core.errors import ErrorCode, HtmllmError
from service.core.processes import ignore_group_signals
from service.core.prune import InputTooLargeError, ParseFailedError, prune_html
from service.core.tokenizer import HtmlTokenizer
from service.core.words import WordTables, adopt_word_tables


class PreprocessError(HtmllmError):
    """The pruner failed on a page in a way it does not type itself; the cause is chained."""

    code = ErrorCode.PREPROCESS_FAILED


@dataclass(frozen=True)
class Prepared:
    """Token ids for the model, or (`over_limit`) the full length of a page refused for its length."""

    ids: list[int]
    truncated: bool
    prune_s: float
    tokenize_s: float
    over_limit: int | None = None  # tokens of the whole page when it is too long and may not be cut
    over_limit_exact: bool = True  # False: the page has more than `over_limit` tokens (counting stopped)


# A page refused for its length is counted for the error message up to this many times the limit; past
# it the message says "more than". Counting a 15 MB page in full took seconds of a preprocessing worker.
COUNT_LIMIT_FACTOR = 16
# A process held to this much memory or less (the process pool's workers: 1024 MiB by default) prunes
# without the text growth check (`prune_document`).
TEXT_GROWTH_UNCHECKED_MB = 2048
# How a message names the preprocessing memory limit, for both who set it: a library caller in
# `EngineConfig`, a server's operator by the environment variable (which only the HTTP service's settings
# read: naming it alone had sent library callers to a setting that does nothing for an Engine).
MEMORY_LIMIT_SETTING = (
    "EngineConfig.preprocess_memory_limit_mb, HTMLLM_PREPROCESS_MEMORY_LIMIT_MB in the service"
)
# Set by `init_worker` in a preprocessing process that is stopped after a time limit: it prunes without
# the name lookup check (a page whose names would take the parser long fails against the limit).
_worker_timed = False


def prune_document(html: str | bytes, encoding: str | None) -> str:
    """`prune_html`, with any untyped failure on odd input turned into a typed, per-document error.

    In a preprocessing process with a memory limit (`service.core.workers.limit_memory`) a page whose
    parse needs more fails here, not the pod: Python's allocations as MemoryError (a 413, like the
    pruner's own memory budget), the HTML parser's as its parse failure (said so in the message). Under
    a limit of `TEXT_GROWTH_UNCHECKED_MB` or less the pruner's text growth check is left out: a page
    that grows a text node past it fails so (a 2.4 MB one in 0.6 s), and the check would cost every page
    about 40% more pruning CPU (docs/benchmarks.md). So is the name lookup check in a process stopped
    after a time limit (`init_worker(timed=True)`).
    """
    limit = _memory_limit_mb()
    try:
        return prune_html(
            html,
            encoding=encoding,
            text_growth=limit is None or limit > TEXT_GROWTH_UNCHECKED_MB,
            name_lookups=not _worker_timed,
        )
    except ParseFailedError as exc:
        if limit is None:
            raise
        said = f"{exc.message} ({_limit_said(limit)}; a parse that needs more fails so)"
        raise ParseFailedError(said) from exc
    except HtmllmError:
        raise
    except MemoryError as exc:
        # Said as the parse's failure above: which of the two a page meets depends on where the memory
        # runs out (the pre-checks' arrays or the parser), not on the page.
        allowed = "" if limit is None else f" ({_limit_said(limit)})"
        raise InputTooLargeError(f"pruning this page needs more memory than it may use{allowed}") from exc
    except Exception as exc:
        raise PreprocessError(f"pruning failed: {type(exc).__name__}: {exc}") from exc


def _limit_said(limit: int) -> str:
    """The memory limit, as `prune_document`'s errors say it."""
    return f"this process may use {limit} MiB, {MEMORY_LIMIT_SETTING}"


def _memory_limit_mb() -> int | None:
    """This process's data limit in MiB (`RLIMIT_DATA`), None when it has none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else soft // 2**20


def prepare(
    tokenizer: HtmlTokenizer, html: str | bytes, encoding: str | None, *, max_length: int, truncate: bool
) -> Prepared:
    """Prune, then tokenize only the prefix that fills `max_length` (ids and truncated flag exact)."""
    started = time.perf_counter()
    pruned = prune_document(html, encoding)
    pruned_at = time.perf_counter()
    encoded = tokenizer.encode(pruned, max_length=max_length, count_all=False)
    tokenized_at = time.perf_counter()
    if not encoded.truncated or truncate:
        return Prepared(encoded.ids, encoded.truncated, pruned_at - started, tokenized_at - pruned_at)
    limit = count_limit(max_length)  # for the error message, bounded
    counted = tokenizer.encode(pruned, max_length=limit, count_all=False)
    over_limit = limit if counted.truncated else counted.full_length
    return Prepared(
        encoded.ids,
        encoded.truncated,
        pruned_at - started,
        tokenized_at - pruned_at,
        over_limit=over_limit,
        over_limit_exact=not counted.truncated,
    )


class Preprocessed(NamedTuple):
    """What `/v1/preprocess` shows of a page: the pruned HTML and its tokens ([CLS]/[SEP] included,
    before truncation), counted until past `count_limit(max_length)`; with `tokens_exact` False the
    page has at least `tokens`."""

    html: str
    tokens: int
    tokens_exact: bool


def count_limit(max_length: int) -> int:
    """How far a page's tokens are counted beyond what the model takes (`COUNT_LIMIT_FACTOR` times)."""
    return COUNT_LIMIT_FACTOR * max_length


def preprocess(
    tokenizer: HtmlTokenizer, html: str | bytes, encoding: str | None, max_length: int
) -> Preprocessed:
    """The pruned HTML and its token count, counted as far as `count_limit(max_length)`, for debugging.

    Counting a whole page had no bound: 4 MB of `<option>x` or of entities took 5-16 s of a worker and
    1-3 GB (the tokenizer's encoding holds ~800 bytes a token), so a 16 MB body could end the server.
    """
    pruned = prune_document(html, encoding)
    counted = tokenizer.encode(pruned, max_length=count_limit(max_length), count_all=False)
    return Preprocessed(pruned, counted.full_length, not counted.truncated)


# The tokenizer of a worker process, set once by `init_worker` (the pool's initializer).
_worker_tokenizer: HtmlTokenizer | None = None


def init_worker(tokenizer_json: str, word_tables: WordTables | None = None, timed: bool = False) -> None:
    """A preprocessing process's start: its tokenizer, warmed; with `word_tables` (the server's, when it
    has built them) it adopts them instead of building (a second of every worker's start). `timed`: the
    parent stops it after a time limit (`prune_document`)."""
    global _worker_tokenizer, _worker_timed
    _worker_timed = timed
    # A Ctrl-C or a hang-up reaches the whole process group: the parent decides what stops (the server
    # drains its queue through these workers, `htmllm embed` keeps what is finished); a worker that died
    # of one would fail the pages it held (with a traceback each, for a Ctrl-C).
    ignore_group_signals((signal.SIGINT, signal.SIGHUP))
    # One page at a time: the Rust tokenizer's thread pool (a thread per core, started by the first
    # encode) would add nothing but threads, and, started mid-page under the worker's memory limit,
    # it failed to start and aborted the worker.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if word_tables is not None:
        adopt_word_tables(word_tables)
    _worker_tokenizer = HtmlTokenizer.from_json(tokenizer_json)
    _worker_tokenizer.warm()
    _worker_tokenizer.encode("<p>warm</p>", max_length=8)  # the rest of the first encode's set-up, now


def _tokenizer_of_worker() -> HtmlTokenizer:
    if _worker_tokenizer is None:
        raise HtmllmError("a preprocessing process ran before init_worker", code=ErrorCode.INTERNAL)
    return _worker_tokenizer


def prepare_in_worker(html: str | bytes, encoding: str | None, max_length: int, truncate: bool) -> Prepared:
    return prepare(_tokenizer_of_worker(), html, encoding, max_length=max_length, truncate=truncate)


def preprocess_in_worker(html: str | bytes, encoding: str | None, max_length: int) -> Preprocessed:
    return preprocess(_tokenizer_of_worker(), html, encoding, max_length)
