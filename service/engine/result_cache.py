"""An LRU of finished documents keyed by their exact input, so a page seen again skips the model.

Crawls fetch the same bytes over and over: error and parked-domain pages, mirrors, unchanged pages on
a re-crawl. With the same bytes, the same declared encoding and the same truncation policy, pruning and
tokenization give the same ids, and the model gives the same row (to the 1e-5 that batching already
allows), so the row is reused: no prune, no tokenize, no queue, no forward pass. An entry holds the raw
(unnormalised) embedding, every head's output and the token count; only documents that succeeded are
kept. The key is a 128-bit BLAKE2b digest of the input, so the cache keeps no page text.

Memory: 4 bytes per dimension and per head output (a class's probability, a regression value) plus
about 300 bytes of bookkeeping (the array's header, the row, the key, the LRU's link), whatever the
number of heads: the floats are one buffer per entry, laid out as `RowLayout` says, which every entry of
one model shares. Measured with tracemalloc over 20,000 entries: 1,906 bytes for the bundled model (384
dimensions, three heads of 16 classes in all: 1,600 bytes of floats). An array per head in a dict had
cost 2,459 bytes there (860 beyond the floats, and about 100 more with each further head), where this
docstring had said 1,700.

A page that arrives while the same page is still being embedded waits for that answer instead of
running a second time (`settled`, `claim`, `release`): a crawler's retries and fan-out send copies
within milliseconds of each other. When that attempt fails on the page itself (it cannot be pruned, it
is over the token limit), the copies get the same failure rather than trying in turn. The Engine
reads and writes the cache on the event loop only, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from service.core.errors import HtmllmError
from service.engine.types import Document


@dataclass(frozen=True)
class RowLayout:
    """Where a row's parts lie in its buffer: the embedding first, then each head's outputs."""

    embedding_dim: int
    heads: tuple[tuple[str, int, int, tuple[int, ...]], ...]  # (name, start, end, shape) per head


@functools.lru_cache(maxsize=64)
def _layout(embedding_dim: int, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> RowLayout:
    """One layout object per model, shared by all its rows (cached: a layout per row would cost what
    the flat buffer saves)."""
    heads = []
    start = embedding_dim
    for name, shape in shapes:
        end = start + int(np.prod(shape, dtype=np.int64))
        heads.append((name, start, end, shape))
        start = end
    return RowLayout(embedding_dim, tuple(heads))


@dataclass(frozen=True, slots=True)
class CachedRow:
    """A finished document: its embedding (float32, before normalisation) and every head's output, in
    one float32 buffer of its own (`of`)."""

    values: np.ndarray  # float32 (D + all heads' outputs,)
    layout: RowLayout
    tokens: int
    truncated: bool

    @classmethod
    def of(
        cls, embedding: np.ndarray, scores: Mapping[str, np.ndarray], tokens: int, truncated: bool
    ) -> CachedRow:
        """A row copied into a buffer of its own: a batch's rows are views of one buffer, which the
        cache must not pin (nor share with the callers it answers). Head outputs are float32, as every
        runner answers them."""
        layout = _layout(int(embedding.shape[0]), tuple((name, np.shape(v)) for name, v in scores.items()))
        values = np.concatenate(
            [np.ravel(embedding), *(np.ravel(value) for value in scores.values())], dtype=np.float32
        )
        return cls(values, layout, tokens, truncated)

    @property
    def embedding(self) -> np.ndarray:
        """A view of the float32 (D,) embedding."""
        return self.values[: self.layout.embedding_dim]

    def score(self, name: str) -> np.ndarray:
        """A view of head `name`'s output: (C,) probabilities or a () value."""
        for head, start, end, shape in self.layout.heads:
            if head == name:
                return self.values[start:end].reshape(shape)
        raise KeyError(name)

    @property
    def scores(self) -> dict[str, np.ndarray]:
        """Every head's output (views)."""
        return {name: self.values[start:end].reshape(shape) for name, start, end, shape in self.layout.heads}


def cache_key(doc: Document, truncate: bool) -> bytes:
    """The digest of everything a document's result depends on within one Engine."""
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(doc.html, str):
        # Text is taken as it is, bytes go through the decoder: the same characters may differ.
        digest.update(b"s" + doc.html.encode("utf-8", errors="surrogatepass"))
    else:
        digest.update(b"b" + doc.html)
    digest.update(b"\0" + (doc.encoding or "").encode("utf-8", errors="surrogatepass"))
    digest.update(b"\0t" if truncate else b"\0f")
    return digest.digest()


class ResultCache:
    """At most `capacity` rows, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a result cache needs a capacity of at least 1")
        self.capacity = capacity
        self._rows: OrderedDict[bytes, CachedRow] = OrderedDict()
        # Keys being embedded now; the future ends with the row, the page's own failure (which every copy
        # would meet), or None when that attempt failed for another reason (a deadline, the backend).
        self._pending: dict[bytes, asyncio.Future[CachedRow | HtmllmError | None]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes) -> CachedRow | None:
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def put(self, key: bytes, row: CachedRow) -> None:
        """Keep `row`, and hand it to whoever waits for `key`."""
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        self._finish(key, row)

    async def settled(self, key: bytes) -> CachedRow | HtmllmError | None:
        """The row for `key`: kept, or awaited from the caller embedding it now; that caller's failure
        when it failed on the page itself (`release`); None when nobody has it and this caller should
        embed it (and `claim` it first).

        The wait is shielded, so this caller's deadline or disconnect does not cancel the other's
        attempt; if that attempt fails for another reason, the row is looked for again.
        """
        while (row := self.get(key)) is None:
            waiting = self._pending.get(key)
            if waiting is None:
                return None
            if (outcome := await asyncio.shield(waiting)) is not None:
                return outcome
        return row

    def claim(self, key: bytes) -> None:
        """The caller embeds `key` now; others who find it in flight wait for its answer."""
        if key not in self._pending:
            self._pending[key] = asyncio.get_running_loop().create_future()

    def release(self, key: bytes, failure: HtmllmError | None = None) -> None:
        """The claim ends. If no row was put, the waiters get `failure`, the page's own (a retry would
        meet it again; it is never kept), or without one None, and embed the page themselves."""
        self._finish(key, failure)

    def _finish(self, key: bytes, outcome: CachedRow | HtmllmError | None) -> None:
        future = self._pending.pop(key, None)
        if future is not None and not future.done():
            future.set_result(outcome)
