"""An LRU of finished documents keyed by their exact input, so a page seen again skips the model.

Crawls fetch the same bytes over and over: error and parked-domain pages, mirrors, unchanged pages on
a re-crawl. With the same bytes, the same declared encoding and the same truncation policy, pruning and
tokenization give the same ids, and the model gives the same row (to the 1e-5 that batching already
allows), so the row is reused: no prune, no tokenize, no queue, no forward pass. An entry holds the raw
(unnormalised) embedding, every head's output and the token count, about 4 bytes per dimension and
class plus 100 bytes of bookkeeping; only documents that succeeded are kept. The key is a 128-bit
BLAKE2b digest of the input, so the cache keeps no page text.

A page that arrives while the same page is still being embedded waits for that answer instead of
running a second time (`settled`, `claim`, `release`): a crawler's retries and fan-out send copies
within milliseconds of each other. When that attempt fails on the page itself (it cannot be pruned, it
is over the token limit), the copies get the same failure rather than trying in turn. The Engine
reads and writes the cache on the event loop only, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from service.core.errors import HtmllmError
from service.engine.types import Document


@dataclass(frozen=True)
class CachedRow:
    embedding: np.ndarray  # float32 (D,), before normalisation
    scores: dict[str, np.ndarray]  # every head's output
    tokens: int
    truncated: bool

    def copy(self) -> CachedRow:
        """A row with arrays of its own: a batch's rows are views of one buffer, which the cache must
        not pin (nor share with the callers it answers)."""
        scores = {name: np.array(value) for name, value in self.scores.items()}
        return CachedRow(np.array(self.embedding, dtype=np.float32), scores, self.tokens, self.truncated)


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
