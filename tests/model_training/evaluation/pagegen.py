"""Generated pages with the metadata the derived tasks label: og:type, JSON-LD @type, <html lang>."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = {
    "en": [
        "the",
        "news",
        "today",
        "report",
        "city",
        "council",
        "market",
        "weather",
        "people",
        "school",
        "music",
        "film",
    ],
    "de": [
        "die",
        "nachrichten",
        "heute",
        "bericht",
        "stadt",
        "markt",
        "wetter",
        "menschen",
        "schule",
        "musik",
        "film",
    ],
    "es": [
        "las",
        "noticias",
        "hoy",
        "informe",
        "ciudad",
        "mercado",
        "tiempo",
        "gente",
        "escuela",
        "musica",
        "cine",
    ],
}
KINDS = {"article": "NewsArticle", "website": "WebPage"}


def page_html(*, lang: str, kind: str, seed: int, extra_type: str | None = None) -> str:
    """One page: an article has a long body of paragraphs, a website a navigation list."""
    rng = random.Random(seed)
    words = WORDS[lang]
    schema = extra_type or KINDS[kind]
    ld = {"@context": "https://schema.org", "@graph": [{"@type": schema}, {"@type": "BreadcrumbList"}]}
    if kind == "article":
        body = "".join(
            f"<p>{' '.join(rng.choice(words) for _ in range(rng.randint(15, 30)))}.</p>" for _ in range(4)
        )
        body = f"<article><h1>{rng.choice(words).title()}</h1>{body}</article>"
    else:
        body = (
            "<ul>" + "".join(f"<li><a href='/{i}'>{rng.choice(words)}</a></li>" for i in range(12)) + "</ul>"
        )
    return (
        f'<!doctype html><html lang="{lang}-XX"><head><meta charset="utf-8">'
        f'<meta property="og:type" content="{kind}"><title>{rng.choice(words)}</title>'
        f'<script type="application/ld+json">{json.dumps(ld)}</script></head>'
        f"<body><nav><a href='/'>home</a></nav>{body}<footer>(c) site</footer></body></html>"
    )


def write_corpus(path: Path, *, sites: int = 12, pages_per_site: int = 4, seed: int = 0) -> Path:
    """A JSONL page source: every site has one language and a mix of articles and website pages."""
    rng = random.Random(seed)
    langs = list(WORDS)
    rows = []
    for s in range(sites):
        lang = langs[s % len(langs)]
        for p in range(pages_per_site):
            kind = "article" if (p + s) % 2 == 0 else "website"
            extra = "BlogPosting" if kind == "article" and s % 4 == 0 else None
            # Hosts of one site differ (www., blog.); the site is the registrable domain.
            host = f"{'www' if p % 2 else 'blog'}.site{s}.{'com' if s % 3 else 'co.uk'}"
            rows.append(
                {
                    "id": f"s{s}p{p}",
                    "url": f"https://{host}/{p}",
                    "html": page_html(lang=lang, kind=kind, seed=rng.randrange(1 << 30), extra_type=extra),
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
