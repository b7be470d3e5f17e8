"""Pretraining shards: pages pruned, tokenized, sampled and written as parquet (paper section 2.2).

`prepare_shards` reads a page collection with `service.core.pages.iter_pages`, and for each page
- prunes it (`service.core.prune.prune_html`) and tokenizes the pruned HTML (`HtmlTokenizer`) in a
  process pool, since both are CPU-bound and independent per page;
- extracts the page's plain text (`service.core.extract.extract`, union by default) in the main
  process through the isolated extractor pool, so a pathological page is killed at its time limit
  rather than hanging a worker; this text is what the teacher will read.

A page's `domain` is its site (`sites.site_of`: registrable domain, through web.archive.org captures).
Then it samples, as the paper does: at most K documents per domain (so a few huge sites do not dominate)
and, under a global cap, uniformly over text length (round-robin over log-length bins of the whole page's
text tokens, so short and long pages are equally represented, however short the training window); when
rows carry a `cluster` field, documents from high-entropy clusters (clusters whose pages spread over many
domains) are taken first within each length bin. A deterministic
held-out split by domain (no site on both sides, so templates do not leak) is marked in the `split`
column; it is where the distillation cosine is reported.

Layout of the output directory:

    manifest.json       tokenizer hash, prune version, max length, sampling options, counts, shard list
    tokenizer.json      the tokenizer the ids were made with (training reads it from here)
    shard-00000.parquet  id, url, domain, split, cluster, input_ids, length, full_length, truncated,
                         text_length, text, extractor, pruned

Everything is held in memory between processing and writing, which is fine up to ~10^5 pages; a full
crawl goes through Ray Data or Spark instead (docs/training.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from multiprocessing.context import BaseContext
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from model_training.sites import site_of
from service.core.errors import ErrorCode, HtmllmError
from service.core.pages import Page, PageSourceError, PageUnreadableError, iter_pages
from service.core.processes import GROUP_SIGNALS
from service.core.progress import progress_bar
from service.core.tokenizer import Encoding, HtmlTokenizer

MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
SHARD_FORMAT_VERSION = 1
TRAIN, HELDOUT = "train", "heldout"
NO_EXTRACTION = "none"
EMPTY_PAGE = "prune:empty"  # the skip reason of a page whose pruned HTML is empty

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("url", pa.string()),
        ("domain", pa.string()),
        ("split", pa.string()),
        ("cluster", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("length", pa.int32()),
        ("full_length", pa.int32()),
        ("truncated", pa.bool_()),
        ("text_length", pa.int32()),
        ("text", pa.string()),
        ("extractor", pa.string()),
        ("pruned", pa.string()),
    ]
)


class DataError(HtmllmError):
    """Unusable data options or shards (missing manifest, tokenizer mismatch, empty result)."""

    code = ErrorCode.VALIDATION


class WorkerLostError(HtmllmError):
    """A prune-and-tokenize worker died while the run waited for its pages: killed from outside (the
    kernel's OOM killer, a `kill -9`) or crashed. multiprocessing's pool starts another worker but never
    runs the dead one's task again, so the run had waited for it forever, idle and silent (under nohup,
    over SSH, for good). It fails instead, saying so, with nothing written: the run is the trouble of the
    machine (its memory), not of a page the pruner refuses, so no page is counted as skipped for it."""

    code = ErrorCode.INTERNAL

    def __init__(self, pid: int | None, exit_code: int) -> None:
        worker = f"a preparation worker (pid {pid})"
        if exit_code == -signal.SIGKILL:
            how = f"{worker} was killed (SIGKILL: the kernel's OOM killer, or a kill -9?)"
            again = "run the same command again, with fewer --workers"
        elif exit_code < 0:
            how = f"{worker} was killed by {_signal_name(-exit_code)}"
            again = "run the same command again"
        else:
            how = f"{worker} exited with status {exit_code}"
            again = "run the same command again"
        super().__init__(f"{how}; nothing was written (a preparation does not resume): {again}")
        self.pid, self.exit_code = pid, exit_code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class Document:
    """One processed page, a row of a shard."""

    id: str
    url: str | None
    domain: str
    cluster: str | None
    input_ids: list[int]
    length: int
    full_length: int
    truncated: bool
    text_length: int  # text (non-tag, non-special) tokens of the whole page, before truncation: the length
    # the sampler is uniform over
    text: str = ""
    extractor: str = NO_EXTRACTION
    pruned: str = ""
    split: str = TRAIN


@dataclass(frozen=True)
class SamplingConfig:
    per_domain: int = 1000  # K: at most this many documents per domain
    max_documents: int | None = None  # global cap, sampled uniformly over text length
    length_bins: int = 16
    prioritise_clusters: bool = False  # high-entropy clusters first within a length bin
    holdout_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.per_domain < 1:
            raise DataError(f"per_domain must be at least 1, got {self.per_domain}")
        if self.max_documents is not None and self.max_documents < 1:
            raise DataError(f"max_documents must be at least 1, got {self.max_documents}")
        if self.length_bins < 1:
            raise DataError(f"length_bins must be at least 1, got {self.length_bins}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise DataError(f"holdout_fraction must be in [0, 1), got {self.holdout_fraction}")


@dataclass
class PrepareStats:
    pages: int = 0
    processed: int = 0
    written: int = 0
    train: int = 0
    heldout: int = 0
    shards: int = 0
    tokens: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> pages


def domain_of(url: str | None) -> str:
    """The site of `url` (`sites.site_of`), "" when there is none: the `domain` column of the shards.

    The per-domain cap, the held-out split and cluster entropy all key on it, and evaluation's folds
    use the same `site_of`: subdomains of one site (`de.creativecommons.org`) are one domain, so the
    split cannot put a site's templates on both sides, and web.archive.org captures count as the sites
    they archive, not as one huge domain.
    """
    return site_of(url) or ""


def _site_of_hint(value: Any) -> str:
    """The site of a page's `domain` metadata (a host or a URL), for pages without a URL."""
    hint = str(value or "").strip()
    if not hint:
        return ""
    return domain_of(hint if "://" in hint else "http://" + hint) or hint.lower()


def holdout_split(domain: str, doc_id: str, fraction: float) -> str:
    """TRAIN or HELDOUT from a hash of the domain (of the id when the domain is unknown): stable."""
    key = domain or f"id:{doc_id}"
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64
    return HELDOUT if bucket < fraction else TRAIN


# --- sampling ---------------------------------------------------------------------------------------


def cluster_entropy(docs: Sequence[Document]) -> dict[str, float]:
    """Shannon entropy (nats) of the domain distribution inside each cluster.

    A cluster whose pages all come from one site is a template family (low entropy, little to learn
    after the first few); one that spans many sites is a topic (high entropy).
    """
    by_cluster: dict[str, Counter[str]] = defaultdict(Counter)
    for doc in docs:
        if doc.cluster is not None:
            by_cluster[doc.cluster][doc.domain or f"id:{doc.id}"] += 1
    entropy: dict[str, float] = {}
    for cluster, counts in by_cluster.items():
        total = sum(counts.values())
        entropy[cluster] = -sum(c / total * math.log(c / total) for c in counts.values())
    return entropy


def length_uniform_sample(
    indices: Sequence[int],
    lengths: Sequence[int],
    n: int,
    rng: random.Random,
    *,
    bins: int,
    priority: Mapping[int, float] | None = None,
) -> list[int]:
    """`n` of `indices`, as uniform over log text length as the data allows (sorted).

    Indices are put in `bins` equal-width bins of log(1 + length) and taken round-robin, one per bin
    per round, so every length range contributes equally until it runs out. Within a bin the order is
    random, or by descending `priority` (random among ties).
    """
    if n >= len(indices):
        return sorted(indices)
    logs = {i: math.log1p(max(lengths[i], 0)) for i in indices}
    lo, hi = min(logs.values()), max(logs.values())
    width = (hi - lo) / bins or 1.0
    buckets: list[list[int]] = [[] for _ in range(bins)]
    for i in indices:
        buckets[min(int((logs[i] - lo) / width), bins - 1)].append(i)
    for bucket in buckets:
        rng.shuffle(bucket)
        if priority is not None:
            bucket.sort(key=lambda i: -priority.get(i, 0.0))  # stable: ties keep the random order
    chosen: list[int] = []
    position = 0
    while len(chosen) < n:
        # Each round visits the bins in a fresh random order, so when fewer documents than bins
        # remain to be taken, the short bins are not favoured over the long ones.
        live = [bucket for bucket in buckets if position < len(bucket)]
        rng.shuffle(live)
        for bucket in live[: n - len(chosen)]:
            chosen.append(bucket[position])
        position += 1
    return sorted(chosen)


def sample_documents(docs: Sequence[Document], config: SamplingConfig) -> list[int]:
    """Indices of the documents to keep: per-domain cap, then the global length-uniform cap."""
    rng = random.Random(config.seed)
    lengths = [d.text_length for d in docs]
    priority: dict[int, float] | None = None
    if config.prioritise_clusters and any(d.cluster is not None for d in docs):
        entropy = cluster_entropy(docs)
        priority = {i: entropy.get(d.cluster, 0.0) for i, d in enumerate(docs) if d.cluster is not None}

    by_domain: dict[str, list[int]] = defaultdict(list)
    for i, doc in enumerate(docs):
        by_domain[doc.domain].append(i)
    kept: list[int] = []
    for domain in sorted(by_domain):
        members = by_domain[domain]
        if not domain:  # pages without a URL are not one site: no cap among them
            kept.extend(members)
            continue
        kept.extend(
            length_uniform_sample(
                members, lengths, config.per_domain, rng, bins=config.length_bins, priority=priority
            )
        )
    if config.max_documents is not None:
        kept = length_uniform_sample(
            kept, lengths, config.max_documents, rng, bins=config.length_bins, priority=priority
        )
    return sorted(kept)


# --- processing -------------------------------------------------------------------------------------

_worker_tokenizer: HtmlTokenizer | None = None
_worker_max_length: int = 0


# The signals a prepare worker ignores (`_init_worker`), held back until it does: those that reach the
# whole process group, Ctrl-C, a hang-up and a group's SIGTERM, as the service's workers do.
_WORKER_SIGNALS = GROUP_SIGNALS


def _init_worker(tokenizer_json: str, max_length: int) -> None:
    """Pool initializer: each worker builds its tokenizer once (tokenizers objects do not pickle).

    Ctrl-C, SIGHUP and SIGTERM are ignored: they reach the workers too (a terminal's Ctrl-C and hang-up
    the process group, systemd's or Slurm's SIGTERM every process of the job), and the parent decides
    what stops (`htmllm data prepare` stops on each as on Ctrl-C). A worker that died of one printed a
    traceback (the parent's handlers come with the fork: the command's SIGHUP handler raised
    KeyboardInterrupt in each worker); worse, one that died as it took the pool's queue lock, which a
    signal's exception can leave taken, hung the parent, which waits for that lock to end the pool. The
    pool ends its workers with SIGKILL instead (`_WorkerPool`), once it holds that lock itself. A worker
    whose parent died (a hang-up left to its default action, `prepare_shards` called from a script) does
    not live on: the pool's task pipe has no writer left, and the worker ends at its end.
    """
    from tokenizers import Tokenizer

    for number in _WORKER_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _WORKER_SIGNALS)  # held back since the fork

    global _worker_tokenizer, _worker_max_length
    _worker_tokenizer = HtmlTokenizer.from_tokenizers(Tokenizer.from_str(tokenizer_json))
    _worker_max_length = max_length


# How often a wait for the pool's results looks for a worker that died under it (`_pool_results`): how
# soon a killed worker fails the run, not a limit on a page (a slow page is waited for).
_LOST_POLL_S = 0.2
# The teardown after a lost worker (`_WorkerPool._end_orphaned`): how long it waits for the result queue's
# lock before taking it as held by a killed worker (the pool's own task thread holds it for one small
# write), and for the pool's threads to end (daemon threads, left behind past it rather than waited for).
_LOCK_GRACE_S = 1.0
_TEARDOWN_S = 10.0
_RUN, _TERMINATE = "RUN", "TERMINATE"  # multiprocessing.pool's states


class _WorkerPool(Pool):
    """The prune-and-tokenize pool: its workers ignore SIGTERM (`_init_worker`), so `terminate` ends
    them with SIGKILL, as SIGTERM's default would have.

    It knows every worker it started (`lost`): multiprocessing's pool replaces a worker that died (the
    kernel's OOM killer, a `kill -9`) but not the task it held, whose results never come; `_pool_results`
    fails the run instead. And a worker killed holding one of the pool's queue locks (an idle worker holds
    the task queue's while it waits for a task, a busy one the result queue's while it sends its pages)
    never gives it back: the pool's own `terminate` takes the first and writes under the second, and had
    waited for ever. Once a worker has died, `terminate` ends the pool without them (`_end_orphaned`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._started: list[Any] = []  # before `Pool()` starts the first workers
        super().__init__(*args, **kwargs)

    def Process(self, ctx: Any, *args: Any, **kwds: Any) -> Any:  # type: ignore[override]
        """Every worker the pool starts, its first and its replacements (a bound method: the pool calls
        `self.Process`, from its worker thread too)."""
        process = ctx.Process(*args, **kwds)
        process.terminate = process.kill
        self._started.append(process)
        return process

    def lost(self) -> tuple[int | None, int] | None:
        """(pid, exit code) of a worker that ended while the pool runs, None while none has: a worker
        ends only with the pool (no `maxtasksperchild`), so one that did was killed or crashed."""
        if self._state != _RUN:  # type: ignore[attr-defined]
            return None
        for process in list(self._started):  # appended to by the pool's worker thread
            code = process.exitcode
            if code is not None:
                return process.pid, code
        return None

    def terminate(self) -> None:
        if self.lost() is not None:
            self._end_orphaned()
        else:
            super().terminate()

    def _kill_started(self) -> None:
        """SIGKILL every worker started that still runs (`terminate` is `kill` for them: `Process`)."""
        for process in list(self._started):
            if process.exitcode is None:
                process.kill()

    def _end_orphaned(self) -> None:
        """`terminate` once a worker has died, taking none of the locks a dead worker may hold: the pool's
        threads stopped, every worker killed, then the locks and pipes they shared freed by hand.

        multiprocessing's own teardown is given up (it also runs at the interpreter's exit). The workers are
        killed first and again on the way out, whatever ends the waits: a Ctrl-C in the middle of them
        (one right after the kill, or Slurm's SIGTERM after the OOM killer's) had left workers that ignore
        SIGTERM, which multiprocessing's exit then sends them and waits on for ever."""
        pool: Any = self  # Pool's internals, which typeshed does not describe
        pool._state = _TERMINATE
        pool._terminate.cancel()
        for thread in (pool._worker_handler, pool._task_handler, pool._result_handler):
            thread._state = _TERMINATE
        pool._change_notifier.put(None)
        deadline = time.monotonic() + _TEARDOWN_S
        self._kill_started()
        try:
            pool._worker_handler.join(_TEARDOWN_S)  # it starts no worker after this; it ends the task thread
        finally:
            self._kill_started()  # what it started meanwhile
        for process in list(self._started):
            process.join()
        # No worker is left: a lock still held is a dead one's. The result queue's is taken by the task
        # thread once more (its end-of-results mark): wait that long, then free it for it.
        lock = pool._outqueue._wlock
        if lock is not None:
            lock.acquire(timeout=_LOCK_GRACE_S)
            lock.release()
        # The task thread may be blocked writing a task, or its end marks for the workers, into the task
        # pipe nobody reads now: read it empty (raw: a dead worker may have read half of a message).
        reader = pool._inqueue._reader
        while pool._task_handler.is_alive() and time.monotonic() < deadline:
            if reader.poll(_LOST_POLL_S):
                os.read(reader.fileno(), 1 << 16)
        # The result thread ends at the task thread's mark, or, when a dead worker sent half a result
        # (its mark read as part of it), at the pipe's end: this process holds its last write end.
        pool._outqueue._writer.close()
        pool._result_handler.join(max(0.0, deadline - time.monotonic()))


def _pool_results(pool: _WorkerPool, pending: AsyncResult[list[Any]]) -> list[Any]:
    """`pending.get()`, or WorkerLostError when the pool has lost a worker while its results are awaited:
    the task it held would never be done. A worker lost with nothing unfinished (its results in) passes."""
    while True:
        pending.wait(_LOST_POLL_S)
        if pending.ready():
            return pending.get()
        lost = pool.lost()
        if lost is not None:
            raise WorkerLostError(*lost)


def _prune_and_tokenize(item: tuple[str, bytes]) -> tuple[str, str, list[int], int, bool, int] | str:
    """(id, raw html) -> (id, pruned, ids, full_length, truncated, text tokens), or an error reason."""
    from service.core.prune import PruneError, prune_html

    page_id, html = item
    assert _worker_tokenizer is not None
    try:
        pruned = prune_html(html)
    except PruneError as exc:
        return f"prune:{exc.code}"
    if not pruned.strip():
        # Nothing to learn from and nothing for the teacher to read ([CLS][SEP] and an empty text):
        # blank pages and empty 200 responses are common in crawls; the evaluation leaves them out too.
        return EMPTY_PAGE
    # The whole page is tokenized (as a bounded encode does anyway, to know `full_length`), so its text
    # length is the page's, not the first max_length tokens': the sampler bins pages by it, and counted
    # after the cut every page longer than the model's window landed in the top bin (and the documents
    # kept depended on --max-length).
    whole = _worker_tokenizer.encode(pruned)
    special = set(vars(_worker_tokenizer.special_ids).values())
    tags = set(_worker_tokenizer.tag_token_ids.values())
    text_tokens = sum(1 for t in whole.ids if t not in special and t not in tags)
    encoding = cut_to_length(whole, _worker_max_length, sep=_worker_tokenizer.special_ids.sep)
    return page_id, pruned, encoding.ids, encoding.full_length, encoding.truncated, text_tokens


def cut_to_length(whole: Encoding, max_length: int, *, sep: int) -> Encoding:
    """`whole` (a text's untruncated encoding) cut as `HtmlTokenizer.encode(text, max_length=)` cuts it:
    [CLS], the first `max_length - 2` content tokens, [SEP]; one tokenization gives both."""
    if len(whole.ids) <= max_length:
        return whole
    return Encoding(ids=[*whole.ids[: max_length - 1], sep], truncated=True, full_length=len(whole.ids))


def _extract_text(html: bytes, extractor: str) -> tuple[str, str]:
    """The teacher's plain text of a page and the extractor that produced it ("" when all failed)."""
    from service.core.extract import ExtractionError, extract

    try:
        result = extract(html, extractor)
    except ExtractionError:
        return "", NO_EXTRACTION
    return result.text, result.extractor


TOO_LARGE = str(ErrorCode.PAYLOAD_TOO_LARGE)  # the reason of a page over the pruner's byte cap
# The reader's error rows of pages no system could embed, passed to the caller to count and pass over: a
# page over the page cap, and one still compressed once what was declared is undone (binary noise).
_PASSED_OVER = frozenset({ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.UNSUPPORTED_MEDIA_TYPE})


def pages_within_cap(source: str | Path, *, limit: int | None = None) -> Iterator[Page]:
    """`iter_pages(source, limit=limit)`, except that a page over the page cap (the pruner's byte cap)
    comes back as its error row, `error_code` TOO_LARGE and no bytes, for the caller to count with the
    pruner's other refusals; so does a page still compressed once the reader has undone what was declared
    (`unsupported_media_type`: a WARC body gzipped without a Content-Encoding saying so, a zstd `.html`).

    The reader refuses such a page before the pruner sees it, and by default as an exception: one 17 MB
    page in a crawl stopped a whole `data prepare`, tokenizer or `tasks derive` run, where a page the
    pruner refuses for its nesting is counted and passed over. A row that cannot be read at all (not
    JSON, a corrupt file) still stops the run, as `iter_pages` does by default.
    """
    for page in iter_pages(source, limit=limit, bad_rows="report"):
        if page.error is not None and page.error_code not in _PASSED_OVER:
            if page.error_code == ErrorCode.INPUT_UNREADABLE:
                raise PageUnreadableError(page.error)
            raise PageSourceError(page.error, code=page.error_code)
        yield page


def _chunks(pages: Iterator[Page], size: int) -> Iterator[list[Page]]:
    chunk: list[Page] = []
    for page in pages:
        chunk.append(page)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@contextlib.contextmanager
def _worker_pool(
    context: BaseContext, workers: int, tokenizer_json: str, max_length: int
) -> Iterator[_WorkerPool]:
    """The prune-and-tokenize pool, started with the group's signals (`_WORKER_SIGNALS`: Ctrl-C, SIGHUP,
    SIGTERM) held off, and ended by its `with`.

    Held off in the workers until `_init_worker` has them ignored (a fork keeps the signal mask): one
    signalled as it started (a Ctrl-C to the group right after the start) died with a traceback. The
    pool's threads, started now too, keep them blocked for good, so the workers the pool starts later
    are born the same way. And held off in this process until the pool is in its `with`: raised in the
    middle of `Pool()` (Python raises it in the main thread whichever thread the kernel gave it to), it
    left a pool nothing ended, whose workers multiprocessing's exit then stopped with SIGTERM and
    waited for, while its thread started new ones.
    """
    caught: list[int] = []
    previous = {number: signal.getsignal(number) for number in _WORKER_SIGNALS}
    swap = threading.current_thread() is threading.main_thread() and None not in previous.values()
    if swap:
        for number in _WORKER_SIGNALS:
            signal.signal(number, lambda number, frame: caught.append(number))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _WORKER_SIGNALS)
    try:
        pool = _WorkerPool(workers, _init_worker, (tokenizer_json, max_length), context=context)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if swap:
            for number, handler in previous.items():
                signal.signal(number, handler)
    with pool:
        # Now, to the handler of the moment: it ends the pool as any Ctrl-C does. Each one caught, since
        # the first may be one the process ignores (a hang-up under nohup).
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)
        yield pool


def process_pages(
    source: str | Path,
    tokenizer: HtmlTokenizer,
    *,
    max_length: int = 4096,
    extractor: str = "union",
    workers: int = 2,
    limit: int | None = None,
    stats: PrepareStats | None = None,
    progress: bool = True,
) -> list[Document]:
    """Prune, tokenize and extract every page of `source`; pages that fail are counted, not raised."""
    stats = stats if stats is not None else PrepareStats()
    # fork where there is one: workers start in milliseconds and inherit the imported modules.
    context = get_context("fork") if hasattr(os, "fork") else get_context("spawn")
    docs: list[Document] = []
    bar = progress_bar(desc="prepare", unit="page", disable=not progress)
    with (
        _worker_pool(context, workers, tokenizer.to_json(), max_length) as pool,
        ThreadPoolExecutor(max_workers=max(1, workers)) as threads,
    ):
        for chunk in _chunks(pages_within_cap(source, limit=limit), 64):
            # A page over the cap is counted under the reason the pruner gives such a page, a page still
            # compressed under its own (`pages_within_cap`).
            passed_over = [page for page in chunk if page.error is not None]
            for page in passed_over:
                reason = f"prune:{page.error_code}"
                stats.skipped[reason] = stats.skipped.get(reason, 0) + 1
            stats.pages += len(passed_over)
            chunk = [page for page in chunk if page.error is None]
            pending = pool.map_async(_prune_and_tokenize, [(p.id, p.html) for p in chunk], chunksize=4)
            if extractor == NO_EXTRACTION:
                texts = [("", NO_EXTRACTION)] * len(chunk)
            else:  # overlaps with the pool: the extractor workers are separate processes
                texts = list(threads.map(lambda p: _extract_text(p.html, extractor), chunk))
            for page, result, (text, used) in zip(chunk, _pool_results(pool, pending), texts, strict=True):
                stats.pages += 1
                if isinstance(result, str):
                    stats.skipped[result] = stats.skipped.get(result, 0) + 1
                    continue
                _, pruned, ids, full_length, truncated, text_tokens = result
                cluster = page.meta.get("cluster")
                docs.append(
                    Document(
                        id=page.id,
                        url=page.url,
                        domain=domain_of(page.url) or _site_of_hint(page.meta.get("domain")),
                        cluster=None if cluster is None else str(cluster),
                        input_ids=ids,
                        length=len(ids),
                        full_length=full_length,
                        truncated=truncated,
                        text_length=text_tokens,
                        text=text,
                        extractor=used,
                        pruned=pruned,
                    )
                )
                stats.processed += 1
            bar.update(len(chunk) + len(passed_over))
    bar.close()
    return docs


# --- writing and reading ----------------------------------------------------------------------------


def ids_digest(ids: Sequence[str]) -> str:
    """A hash of a shard's row ids: teacher files record it, so a stale teacher cannot be misaligned."""
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


def write_shards(docs: Sequence[Document], out: Path, *, shard_size: int = 10_000) -> list[dict[str, Any]]:
    """Write `docs` as parquet shards of `shard_size` rows; returns the manifest's shard entries."""
    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for number, start in enumerate(range(0, len(docs), shard_size)):
        rows = docs[start : start + shard_size]
        columns = {name: [getattr(d, name) for d in rows] for name in SCHEMA.names}
        table = pa.Table.from_pydict(columns, schema=SCHEMA)
        name = f"shard-{number:05d}.parquet"
        pq.write_table(table, out / name, compression="zstd")
        entries.append({"file": name, "rows": len(rows), "ids_sha256": ids_digest([d.id for d in rows])})
    return entries


def prepare_shards(
    source: str | Path,
    out: str | Path,
    tokenizer_path: str | Path,
    *,
    max_length: int = 4096,
    sampling: SamplingConfig = SamplingConfig(),
    extractor: str = "union",
    workers: int = 2,
    shard_size: int = 10_000,
    limit: int | None = None,
    progress: bool = True,
) -> PrepareStats:
    """The whole `htmllm data prepare`: process, sample, split, write shards and the manifest.

    A run that fails (a page source that cannot be read, a worker killed, Ctrl-C, a full disk) leaves
    no output directory it made itself, nor its partial shards (`output_dir`; a manifest in place means
    complete). A preparation does not resume (its pages are held in memory until every one is read), so
    nothing a later run could go on from is lost."""
    from model_training.outputs import output_dir
    from service.core.pages import source_kind

    # Every option and path is checked before the first page is read: a run over a crawl must not fail
    # at the very end because its output directory cannot be written.
    if max_length < 8:
        raise DataError(f"max_length must be at least 8, got {max_length}")
    for name, value in (("workers", workers), ("shard_size", shard_size), ("limit", limit)):
        if value is not None and value < 1:
            raise DataError(f"{name} must be at least 1, got {value}")
    source_kind(Path(source))  # a source that does not exist, or of no kind iter_pages reads
    tokenizer = HtmlTokenizer.from_file(tokenizer_path)
    with output_dir(out, written=_RUN_FILE, complete=MANIFEST_FILE) as out_dir:
        return _prepare_into(
            source,
            out_dir,
            tokenizer,
            max_length=max_length,
            sampling=sampling,
            extractor=extractor,
            workers=workers,
            shard_size=shard_size,
            limit=limit,
            progress=progress,
        )


def _prepare_into(
    source: str | Path,
    out_dir: Path,
    tokenizer: HtmlTokenizer,
    *,
    max_length: int,
    sampling: SamplingConfig,
    extractor: str,
    workers: int,
    shard_size: int,
    limit: int | None,
    progress: bool,
) -> PrepareStats:
    """`prepare_shards` once its options are checked and `out_dir` exists."""
    from service.core.prune import PRUNE_VERSION

    stats = PrepareStats()
    docs = process_pages(
        source,
        tokenizer,
        max_length=max_length,
        extractor=extractor,
        workers=workers,
        limit=limit,
        stats=stats,
        progress=progress,
    )
    if not docs:
        raise DataError(f"no page of {source} could be prepared (skipped: {stats.skipped})")
    keep = sample_documents(docs, sampling)
    chosen = [docs[i] for i in keep]
    for doc in chosen:
        doc.split = holdout_split(doc.domain, doc.id, sampling.holdout_fraction)
    # The old manifest goes first: a run killed while writing shards must leave a directory that says it
    # is incomplete, not an old manifest over new shards (equal row counts pass every check but the ids).
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)
    entries = write_shards(chosen, out_dir, shard_size=shard_size)
    written = {str(entry["file"]) for entry in entries}
    for stale in out_dir.glob("shard-*.parquet"):  # left by an earlier, larger run into the same directory
        if stale.name not in written:
            stale.unlink()
    stats.written = len(chosen)
    stats.train = sum(d.split == TRAIN for d in chosen)
    stats.heldout = stats.written - stats.train
    stats.shards = len(entries)
    stats.tokens = sum(d.length for d in chosen)
    write_manifest(
        out_dir,
        tokenizer,
        entries,
        prune_version=PRUNE_VERSION,
        max_length=max_length,
        extra={
            "source": str(source),
            "extractor": extractor,
            "extraction_version": _extraction_version(extractor),
            "sampling": asdict(sampling),
            "stats": asdict(stats),
        },
    )
    return stats


def _extraction_version(extractor: str) -> str | None:
    """The extraction code's version the shards' texts came from (None without extraction): provenance
    for a reader comparing two preparations, since the extractor libraries' versions alone do not say."""
    if extractor == NO_EXTRACTION:
        return None
    from service.core.extract import EXTRACTION_VERSION

    return EXTRACTION_VERSION


def write_manifest(
    out: Path,
    tokenizer: HtmlTokenizer,
    entries: Sequence[Mapping[str, Any]],
    *,
    prune_version: str,
    max_length: int,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """manifest.json and tokenizer.json of a shards directory whose shards `write_shards` wrote."""
    tokenizer.save(out / TOKENIZER_FILE)
    manifest = {
        "format_version": SHARD_FORMAT_VERSION,
        "tokenizer_sha256": tokenizer.sha256,
        "prune_version": prune_version,
        "max_length": max_length,
        "stats": {},
        **(extra or {}),
        "shards": list(entries),
    }
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / MANIFEST_FILE)


# What a preparation writes into its output directory: nothing else is removed from one it made
# (`model_training.outputs.output_dir`).
_RUN_FILE = re.compile(
    rf"shard-\d{{5,}}\.parquet|{re.escape(TOKENIZER_FILE)}|{re.escape(MANIFEST_FILE)}\.tmp"
)


def writable_dir(out: str | Path) -> Path:
    """`out` as a directory that exists (created with its parents) and that files can be written to."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise DataError(f"output directory {path} is an existing file")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create output directory {path}: {exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise DataError(f"output directory {path} is not writable")
    return path


def read_json_file(file: Path) -> dict[str, Any]:
    """A JSON object from `file`; a truncated or corrupt file is a DataError naming it."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON or not UTF-8
        raise DataError(f"{file} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise DataError(f"{file} is not a JSON object")
    return data


def read_manifest(shards: str | Path) -> dict[str, Any]:
    """The shards directory's manifest.json, checked for the format version."""
    file = Path(shards) / MANIFEST_FILE
    if not file.is_file():
        raise DataError(f"{file} is missing: {shards} is not a shards directory (run `htmllm data prepare`)")
    manifest = read_json_file(file)
    if manifest.get("format_version") != SHARD_FORMAT_VERSION:
        raise DataError(f"{file}: unknown shard format version {manifest.get('format_version')!r}")
    return manifest


def read_shard(
    shards: str | Path, entry: Mapping[str, Any], columns: Sequence[str] | None = None
) -> pa.Table:
    """One shard as an Arrow table (only `columns` when given)."""
    path = Path(shards) / str(entry["file"])
    if not path.is_file():
        raise DataError(f"shard {path} listed in the manifest is missing")
    try:
        table = pq.read_table(path, columns=list(columns) if columns is not None else None)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"shard {path} cannot be read (re-run `htmllm data prepare`): {exc}") from exc
    if table.num_rows != entry["rows"]:
        raise DataError(f"shard {path} has {table.num_rows} rows, the manifest says {entry['rows']}")
    return table
