"""Synthetic web pages whose sizes follow the size distribution of real crawled HTML.

A load test is only as honest as its payloads: per-request cost here is dominated by pruning (linear in
raw bytes) and the forward pass (bounded by the model's max length), so the page-size distribution sets
both the work per request and the bytes on the wire. Raw HTML sizes are close to log-normal. The
parameters below were fitted to the 1,033 pages of the project's shared evaluation corpus (raw,
uncompressed bytes; median 94 KB, p10 36 KB, p90 301 KB, p99 735 KB, max 1.6 MB; log-space
sigma 0.86): a median around a hundred kilobytes with a long tail of multi-hundred-kilobyte pages.

The pages are shaped like real ones so the pruner does real work: inline scripts, styles, JSON-LD,
navigation and teaser markup that pruning removes or shrinks, around an article of paragraphs, headings,
lists and tables, in the byte shares measured on the same corpus (`BYTE_SHARES`). Generation is
deterministic for a given seed.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

# Fitted to the shared corpus (see the module docstring): log-normal in raw bytes.
SIZE_MEDIAN_BYTES = 94_000
SIZE_LOG_SIGMA = 0.86
# Below this even an empty template with a head is larger; above it pages are rare outliers (the
# corpus maximum is 1.6 MB) that would dominate a short run's tail latency on their own.
SIZE_MIN_BYTES = 2_000
SIZE_MAX_BYTES = 2_000_000

_WORD_LIST = (
    "the of and to in is for on that with as was by at from this are be or an it which have has not "
    "page article news report city market price data research service customer product review season "
    "water energy school health travel music history science family game team policy model system "
    "design garden kitchen recipe weather election council museum library festival railway station "
    "company results quarter growth analysis community project software release update support guide "
    "question answer forum thread comment author editor published updated minutes reading share follow "
    "über und der die das für mit von zum auf ist eine nicht auch sich werden ville avec pour dans une "
    "sur les des est pas plus según para una por los del como más"
)
_WORDS = tuple(_WORD_LIST.split())
_NAV = ("Home", "News", "Sport", "Business", "Culture", "Travel", "About", "Contact", "Shop", "Help")
_TAGS = ("Politics", "Science", "Technology", "Health", "Opinion", "Local", "World", "Video")


def draw_size(rng: random.Random) -> int:
    """A page size in raw bytes, from the fitted log-normal, clipped to the plausible range."""
    size = rng.lognormvariate(math.log(SIZE_MEDIAN_BYTES), SIZE_LOG_SIGMA)
    return int(min(max(size, SIZE_MIN_BYTES), SIZE_MAX_BYTES))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _sentence(rng: random.Random) -> str:
    text = _words(rng, rng.randint(6, 24))
    return text[:1].upper() + text[1:] + rng.choice((".", ".", ".", "?", "!"))


def _paragraph(rng: random.Random) -> str:
    return "<p>" + " ".join(_sentence(rng) for _ in range(rng.randint(2, 7))) + "</p>\n"


def _script(rng: random.Random) -> str:
    """Minified-looking inline JavaScript. Comparisons are mostly against numbers; about one in twenty
    compares with an identifier (`r<n.length`), which puts `<` before a letter about as often as in
    the corpus's inline scripts (median 0.15, p90 1.3 per KB)."""
    parts = []
    for i in range(rng.randint(10, 60)):
        name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 3)))
        bound = "n.length" if rng.random() < 0.05 else str(rng.randint(2, 64))
        parts.append(
            f"function {name}{i}(e,t){{var n=e.querySelectorAll('[data-{name}]');"
            f"for(var r=0;r<{bound};r++){{n[r]&&n[r].setAttribute('aria-hidden',t?'true':'false')}}"
            f"return n.length*{rng.randint(1, 999)}}}"
        )
    return "<script>" + ";".join(parts) + "</script>\n"


def _style(rng: random.Random) -> str:
    rules = []
    for i in range(rng.randint(20, 150)):
        rules.append(
            f".c{i}-{rng.randint(0, 99)}{{margin:{rng.randint(0, 40)}px {rng.randint(0, 40)}px;"
            f"color:#{rng.randrange(0xFFFFFF):06x};font-size:{rng.randint(10, 32)}px;display:flex}}"
        )
    return "<style>" + "".join(rules) + "</style>\n"


def _json_ld(rng: random.Random, title: str) -> str:
    data = {
        "@context": "https://schema.org",
        "@type": "NewsArticle",
        "headline": title,
        "datePublished": f"20{rng.randint(10, 25)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "author": {"@type": "Person", "name": _words(rng, 2).title()},
        "keywords": [rng.choice(_TAGS) for _ in range(5)],
    }
    return f'<script type="application/ld+json">{json.dumps(data)}</script>\n'


def _nav(rng: random.Random) -> str:
    items = "".join(
        f'<li class="nav-item"><a class="nav-link" href="/{label.lower()}/{rng.randint(1, 999)}">'
        f"{label}</a></li>"
        for label in rng.sample(_NAV, k=len(_NAV))
    )
    return f'<nav class="site-nav" aria-label="main"><ul class="nav-list">{items}</ul></nav>\n'


def _related(rng: random.Random) -> str:
    links = "".join(
        f'<li><a href="/story/{rng.randint(10_000, 99_999)}"><img src="/img/{rng.randint(1, 9999)}.jpg" '
        f'alt="" loading="lazy" width="120" height="80">'
        f"<span>{_words(rng, rng.randint(4, 9))}</span></a></li>"
        for _ in range(rng.randint(4, 12))
    )
    return f'<aside class="related"><h3>Related</h3><ul>{links}</ul></aside>\n'


def _table(rng: random.Random) -> str:
    rows = "".join(
        "<tr>" + "".join(f"<td>{rng.randint(0, 9999)}</td>" for _ in range(4)) + "</tr>"
        for _ in range(rng.randint(3, 12))
    )
    head = "".join(f"<th>{rng.choice(_WORDS).title()}</th>" for _ in range(4))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>\n"


def _cards(rng: random.Random) -> str:
    """A teaser grid: nested wrappers with utility classes, the markup most of a page's bytes are."""
    cards = []
    for _ in range(rng.randint(3, 10)):
        story = rng.randint(10_000, 99_999)
        badge = rng.choice(("primary", "info", "dark"))
        date = f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
        cards.append(
            f'<div class="col-12 col-md-6 col-lg-4 mb-{rng.randint(1, 5)}">'
            '<div class="card h-100 shadow-sm">'
            f'<a class="card-link stretched-link" href="/story/{story}" data-track="teaser-{story}">'
            f'<picture><source srcset="/img/{story}.webp" type="image/webp">'
            f'<img class="card-img-top" src="/img/{story}.jpg" alt="" loading="lazy"></picture></a>'
            f'<div class="card-body d-flex flex-column"><span class="badge bg-{badge}">'
            f'{rng.choice(_TAGS)}</span><h3 class="card-title h5">{_words(rng, rng.randint(4, 9))}</h3>'
            f'<div class="card-meta text-muted small"><time datetime="{date}">'
            f"{rng.randint(1, 59)} min</time></div></div></div></div>"
        )
    grid = "".join(cards)
    return (
        f'<section class="teasers"><div class="container"><div class="row g-3">{grid}</div></div></section>\n'
    )


def _article_block(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.70:
        return _paragraph(rng)
    if roll < 0.82:
        return f"<h2>{_sentence(rng).rstrip('.?!')}</h2>\n"
    if roll < 0.92:
        items = "".join(f"<li>{_words(rng, rng.randint(3, 12))}</li>" for _ in range(rng.randint(3, 8)))
        return f"<ul>{items}</ul>\n"
    return _table(rng)


# Shares of a page's bytes, from the shared corpus (lexbor over 300 pages): inline scripts 16 % and
# styles 6 % on average, visible text about 19 % (the article blocks below are mostly text), and markup
# (tags and attributes of navigation, teasers, wrappers) the rest.
BYTE_SHARES = {"script": 0.16, "style": 0.06, "article": 0.22, "markup": 0.56}


def generate_page(rng: random.Random, size: int) -> bytes:
    """One UTF-8 page of about `size` bytes (at least `size`, overshooting by at most a few blocks).

    Each kind of content (inline scripts, styles, article, markup) gets its share of the bytes
    (`BYTE_SHARES`), laid out as a page is: scripts and styles in the head and at the end of the body,
    navigation and teasers around the article.
    """
    title = _sentence(rng).rstrip(".?!")
    head = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        f"<title>{title}</title>\n",
        f'<meta name="description" content="{_words(rng, 20)}">\n',
        f'<link rel="canonical" href="https://www.example.org/story/{rng.randint(1, 10**6)}">\n',
        _json_ld(rng, title),
    ]
    footer = (
        '<footer class="site-footer"><p>&copy; Example Media. All rights reserved.</p>'
        '<a href="/privacy">Privacy</a> <a href="/terms">Terms</a></footer>\n'
    )
    fixed = sum(len(s.encode()) for s in head) + len(footer) + 200
    makers = {
        "script": lambda: _script(rng),
        "style": lambda: _style(rng),
        "article": lambda: _article_block(rng),
        "markup": lambda: rng.choice((_nav, _related, _cards, _cards))(rng),
    }
    blocks: dict[str, list[str]] = {kind: [] for kind in BYTE_SHARES}
    blocks["article"] = [f"<h1>{title}</h1>\n", _paragraph(rng)]
    blocks["markup"] = [_nav(rng)]
    filled = {kind: sum(len(b.encode()) for b in blocks[kind]) for kind in BYTE_SHARES}
    budget = max(size - fixed, 0)
    for kind, share in BYTE_SHARES.items():
        while filled[kind] < share * budget:
            block = makers[kind]()
            blocks[kind].append(block)
            filled[kind] += len(block.encode())
    while fixed + sum(filled.values()) < size:  # rounding: top up with article text
        block = _paragraph(rng)
        blocks["article"].append(block)
        filled["article"] += len(block.encode())
    scripts = blocks["style"] + blocks["script"]
    split = len(blocks["style"]) + len(blocks["script"]) // 2
    markup = blocks["markup"]
    page = (
        "".join(head)
        + "".join(scripts[:split])
        + '</head>\n<body class="article-page">\n<header class="site-header">'
        + markup[0]
        + "</header>\n<main><article>\n"
        + "".join(blocks["article"])
        + "</article>\n"
        + "".join(markup[1:])
        + "</main>\n"
        + footer
        + "".join(scripts[split:])
        + "</body></html>\n"
    )
    return page.encode("utf-8")


@dataclass(frozen=True)
class SyntheticPage:
    id: str
    html: bytes


def synthetic_pages(seed: int = 0) -> Iterator[SyntheticPage]:
    """An endless, deterministic stream of pages with sizes drawn from the fitted distribution."""
    rng = random.Random(seed)
    index = 0
    while True:
        yield SyntheticPage(id=f"synthetic-{seed}-{index}", html=generate_page(rng, draw_size(rng)))
        index += 1
