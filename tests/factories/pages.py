"""Raw HTML pages generated from the tiny tokenizer's words."""

from __future__ import annotations

import random

from tests.factories.tokenizer import WORDS


def make_pages(n: int, *, seed: int = 0, min_words: int = 1, max_words: int = 60) -> list[str]:
    """Raw HTML pages whose lengths vary a lot, so batches carry real padding."""
    rng = random.Random(seed)
    pages = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
        head = f"<head><title>Page {i}</title><script>x()</script></head>"
        pages.append(f"<html>{head}<body><p>{words}</p></body></html>")
    return pages
