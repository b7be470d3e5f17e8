"""Tiny tokenizers for tests: trained in-process on generated pruned-HTML-like pages, cached per process.

`build_tiny_tokenizer()` is what other tests call when they need a real `HtmlTokenizer` (models, engine,
API); it takes a fraction of a second and never touches the shared corpus. Its vocabulary size, special
ids and tag ids are the same in every process; the ids of ordinary word pieces may differ between
processes (the `tokenizers` trainer breaks ties in hash-map order), so tests must not hard-code them.
"""

from __future__ import annotations

import random
from functools import lru_cache

import pytest

from model_training.tokenizer_training import train_tokenizer
from service.core.tokenizer import HtmlTokenizer

WORDS: tuple[str, ...] = (
    "the", "page", "news", "article", "home", "about", "contact", "price", "product", "search", "login",
    "weather", "today", "city", "market", "report", "sport", "music", "video", "photo", "shop", "cart",
    "Prague", "Brno", "Monday", "Tuesday", "January", "HTML", "Python", "data", "model", "service",
    "zprávy", "počasí", "město", "článek", "domů", "hledat", "cena", "obchod", "Praha", "úterý", "řeka",
    "2024", "15", "100", "3.5", "&amp;", "&lt;", "&gt;", "(new)", "info@example.com", "e-mail", "50%",
)  # fmt: skip

# Block tags, inline tags and void tags, in roughly the frequencies pruned pages show.
BLOCK_TAGS: tuple[str, ...] = ("div", "div", "div", "p", "p", "li", "td", "h2", "section", "article")
INLINE_TAGS: tuple[str, ...] = ("a", "a", "span", "b", "i", "strong", "em")
VOID_TAGS: tuple[str, ...] = ("br", "img", "hr", "input")


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
    words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words) + rng.choice((".", "", "!", "?", ":"))


def _inline(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.25:
            tag = rng.choice(INLINE_TAGS)
            parts.append(f"<{tag}>{_sentence(rng)}</{tag}>")
        elif roll < 0.35:
            parts.append(f"<{rng.choice(VOID_TAGS)}>")
        else:
            parts.append(_sentence(rng))
    return " ".join(parts)


def generate_pruned_page(rng: random.Random) -> str:
    """One page shaped like `prune_html` output: no attributes, collapsed whitespace, nested blocks."""
    blocks: list[str] = []
    for _ in range(rng.randint(3, 12)):
        tag = rng.choice(BLOCK_TAGS)
        if tag == "li":
            items = "".join(f"<li>{_inline(rng)}</li>" for _ in range(rng.randint(2, 5)))
            blocks.append(f"<ul>{items}</ul>")
        elif tag == "td":
            cells = "".join(f"<td>{_sentence(rng)}</td>" for _ in range(rng.randint(2, 4)))
            blocks.append(f"<table><tr>{cells}</tr></table>")
        else:
            blocks.append(f"<{tag}>{_inline(rng)}</{tag}>")
    nav = "".join(f"<a>{rng.choice(WORDS)}</a>" for _ in range(rng.randint(2, 6)))
    title = _sentence(rng)
    return (
        f"<html><head><title>{title}</title></head><body><nav>{nav}</nav><h1>{title}</h1>"
        f"{' '.join(blocks)}<footer>{_sentence(rng)}</footer></body></html>"
    )


def generate_pruned_pages(n: int, *, seed: int = 0) -> list[str]:
    """`n` deterministic pruned-HTML-like pages."""
    rng = random.Random(seed)
    return [generate_pruned_page(rng) for _ in range(n)]


@lru_cache(maxsize=8)
def build_tiny_tokenizer(vocab_size: int = 512, tags: int = 24) -> HtmlTokenizer:
    """A real WordPiece `HtmlTokenizer` trained on 48 generated pages (cached: build it freely)."""
    return train_tokenizer(generate_pruned_pages(48), vocab_size=vocab_size, min_frequency=2, tags=tags)


def record_reads(tok: HtmlTokenizer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the texts `tok` hands to `tokenizers` from now on (its one way in there), to
    check how much of a text a bounded encode reads."""
    read: list[int] = []
    encode_one = tok._encode_one

    def counting(prefix: str) -> object:
        read.append(len(prefix))
        return encode_one(prefix)

    monkeypatch.setattr(tok, "_encode_one", counting)
    return read
