"""Raw HTML pages for the API tests, generated in-process (never read from the shared corpus)."""

from __future__ import annotations

import random

from tests.factories.tokenizer import WORDS

# Czech has letters (ř, ů, ž, ť) whose windows-1250 bytes mean something else in windows-1252 and are
# invalid UTF-8, so only a decoder told the charset reads this page right.
CZECH_TEXT = "Příliš žluťoučký kůň úpěl ďábelské ódy"
WINDOWS_1250_PAGE = (
    "<!DOCTYPE html><html><head><title>Zprávy</title></head><body>"
    f"<h1>{CZECH_TEXT}</h1><p>Počasí v Praze: řeka, město, článek.</p></body></html>"
).encode("windows-1250")


def page(seed: int, *, paragraphs: int = 3) -> str:
    """A small page with boilerplate the pruner removes (script, style, attributes) and real text."""
    rng = random.Random(seed)
    body = "".join(
        f'<p class="c{i}">{" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30)))}</p>'
        for i in range(paragraphs)
    )
    return (
        f"<html><head><title>Page {seed}</title><style>p {{color: red}}</style>"
        f"<script>var x = {seed};</script></head><body><div id='main'>{body}</div></body></html>"
    )


def long_page(words: int = 2000) -> str:
    """A page far longer than the tiny model's 128 tokens."""
    rng = random.Random(7)
    return (
        "<html><body>"
        + "".join(f"<p>{rng.choice(WORDS)} {rng.choice(WORDS)}</p>" for _ in range(words))
        + "</body></html>"
    )


def slow_to_extract_page(paragraphs: int = 45_000) -> str:
    """Tens of thousands of tiny paragraphs inside 40 `<div>`s: within the extractors' structural limits
    (`service.core.extract.limits`), yet jusText takes about 1.7 s on it."""
    return "<html><body>" + "<div>" * 40 + "<p>alpha beta\n" * paragraphs + "</body></html>"
