"""Evaluation tasks derived from page metadata that pruning removes, for users without labels.

The pruned HTML the encoder sees has no `<meta>`, no `<script>` and no `lang` attribute, so these labels
are not copied from its input; the encoder must infer them from the page's content and structure:
- `page_kind`: the Open Graph `og:type` (article, website, ...);
- `schema_type`: the main schema.org `@type` declared in JSON-LD (NewsArticle, Article, BlogPosting,
  WebPage, ...);
- `language`: the primary subtag of `<html lang>`.
Classes with too few pages or sites are merged into `other`, or dropped when `other` is too small too.
Folds are assigned by site so no site is in both the training and the test folds.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from selectolax.lexbor import LexborHTMLParser

from model_training.data import pages_within_cap
from model_training.evaluation.cache import content_key
from model_training.evaluation.metrics import EvaluationError
from model_training.evaluation.tasks import TASK_SPEC_FILE, TaskSpec, assign_folds, write_task
from model_training.sites import site_of
from service.core.atomic_files import replaced_atomically
from service.core.decoding import decode_html
from service.core.pages import Page
from service.core.prune import respell_longer_references

OTHER = "other"
PAGES_DIR = "pages"
DERIVE_FILE = "derive.json"  # what each task got, or why it was skipped: written last

# The schema.org types that say what a page is, most specific first; a page declaring several (an
# Article inside a WebPage, with a BreadcrumbList) is labelled by the first of these it declares.
_SCHEMA_PRIORITY = (
    "NewsArticle",
    "BlogPosting",
    "Article",
    "Recipe",
    "Product",
    "Event",
    "VideoObject",
    "Review",
    "JobPosting",
    "FAQPage",
    "QAPage",
    "ProfilePage",
    "CollectionPage",
    "ItemPage",
    "AboutPage",
    "ContactPage",
    "SearchResultsPage",
    "WebPage",
    "WebSite",
    "Organization",
)
_LANG = re.compile(r"^([a-z]{2,3})(?:[-_].*)?$")


@dataclass(frozen=True)
class PageMetadata:
    og_type: str | None
    schema_types: frozenset[str]
    lang: str | None
    canonical_url: str | None


@dataclass
class DerivedTask:
    """What `derive_tasks` wrote for one task, or why it wrote nothing."""

    name: str
    description: str
    labels: list[str] = field(default_factory=list)  # most frequent first
    counts: dict[str, int] = field(default_factory=dict)
    merged: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    unlabelled: int = 0
    sites: int = 0
    path: Path | None = None
    skipped: str | None = None
    # Pages of the corpus passed over as no system could embed them (every task's): over the page cap, or
    # still compressed once what was declared is undone (`pages_within_cap`).
    too_large: int = 0
    pages: int = 0  # pages of the corpus labelled (every task's)


def _schema_type_names(value: Any) -> Iterator[str]:
    """Every `@type` in a JSON-LD document, through `@graph`, nested lists and nested objects."""
    if isinstance(value, list):
        for item in value:
            yield from _schema_type_names(item)
    elif isinstance(value, dict):
        declared = value.get("@type")
        for name in declared if isinstance(declared, list) else [declared]:
            if isinstance(name, str) and name.strip():
                # "schema:NewsArticle", "https://schema.org/NewsArticle" -> "NewsArticle"
                yield re.split(r"[/:#]", name.strip())[-1]
        for key, item in value.items():
            if key != "@type" and isinstance(item, list | dict):
                yield from _schema_type_names(item)


def page_metadata(html: bytes | str) -> PageMetadata:
    """The metadata the derived tasks are labelled with; malformed metadata reads as absent."""
    text = decode_html(html).text
    respelled = respell_longer_references(text)  # (a run of `&nGt;` corrupts Lexbor's heap)
    tree = LexborHTMLParser(text if respelled is None else respelled)
    og = tree.css_first('meta[property="og:type"], meta[name="og:type"]')
    og_type = (og.attributes.get("content") or "").strip().lower() if og is not None else ""
    types: set[str] = set()
    for script in tree.css('script[type="application/ld+json"]'):
        try:
            types.update(_schema_type_names(json.loads(script.text(deep=True) or "null", strict=False)))
        except (json.JSONDecodeError, RecursionError):
            continue
    root = tree.css_first("html")
    match = _LANG.match((root.attributes.get("lang") or "").strip().lower()) if root is not None else None
    canonical = tree.css_first('link[rel="canonical"]') or tree.css_first('meta[property="og:url"]')
    canonical_url = None
    if canonical is not None:
        canonical_url = canonical.attributes.get("href") or canonical.attributes.get("content")
    return PageMetadata(og_type or None, frozenset(types), match[1] if match else None, canonical_url)


def schema_label(types: frozenset[str]) -> str | None:
    """The page's main schema.org type; article subtypes fold into their parent (TechArticle -> Article)."""
    for name in _SCHEMA_PRIORITY:
        if name in types:
            return name
    if any(t.endswith("NewsArticle") for t in types):
        return "NewsArticle"
    if any(t.endswith("Article") for t in types):
        return "Article"
    return None


LABELLERS: dict[str, tuple[str, Callable[[PageMetadata], str | None]]] = {
    "page_kind": ("page kind from the Open Graph og:type meta tag", lambda m: m.og_type),
    "schema_type": ("main schema.org @type declared in JSON-LD", lambda m: schema_label(m.schema_types)),
    "language": ("page language from the primary subtag of <html lang>", lambda m: m.lang),
}


def merge_rare(
    labels: list[str | None], sites: list[str], *, min_pages: int, min_sites: int
) -> tuple[list[str | None], list[str], list[str]]:
    """Merge classes with fewer than `min_pages` pages or `min_sites` sites into `other`, or drop them."""
    pages_per: Counter[str] = Counter(label for label in labels if label is not None)
    sites_per: dict[str, set[str]] = {}
    for label, site in zip(labels, sites, strict=True):
        if label is not None:
            sites_per.setdefault(label, set()).add(site)
    rare = sorted(c for c in pages_per if pages_per[c] < min_pages or len(sites_per[c]) < min_sites)
    other_pages = sum(pages_per[c] for c in rare)
    other_sites = set().union(*(sites_per[c] for c in rare)) if rare else set()
    keep_other = other_pages >= min_pages and len(other_sites) >= min_sites and len(rare) > 1
    merged, dropped = (rare, []) if keep_other else ([], rare)
    out = [(OTHER if label in merged else None if label in dropped else label) for label in labels]
    return out, merged, dropped


def _store_page(out: Path, page: Page) -> str:
    """Write the page's raw bytes once, content-addressed, and return its path relative to a task dir."""
    digest = content_key(page.html)
    path = out / PAGES_DIR / f"{digest}.html.gz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or absent: a page cut short by Ctrl-C would be reused, as it is, by every later run.
        with replaced_atomically(path) as tmp:
            tmp.write_bytes(gzip.compress(page.html, compresslevel=6, mtime=0))
    return f"../{PAGES_DIR}/{path.name}"


def _remove_task(path: Path) -> None:
    """Remove the task directory an earlier run wrote for a task this run skips.

    Left in place, `heads train --tasks OUT` and `eval run` would pick it up as if this run had written
    it: a head trained for a task the run just said it skipped. Only a task directory (one with a
    task.json) is removed, never something else that happens to have the name.
    """
    if (path / TASK_SPEC_FILE).is_file():
        shutil.rmtree(path)


def derive_tasks(
    corpus: str | Path,
    out: str | Path,
    *,
    min_pages: int = 10,
    min_sites: int = 5,
    folds: int = 5,
    seed: int = 0,
    limit: int | None = None,
) -> list[DerivedTask]:
    """Label every page of `corpus` by each labeller and write one task directory per labeller."""
    # Checked before the corpus is read (a fold count of 1 used to fail at the end, in scikit-learn).
    if folds < 2:
        raise EvaluationError(f"cross-validation needs at least 2 folds, got {folds}")
    if min(min_pages, min_sites) < 1 or (limit is not None and limit < 1):
        raise EvaluationError(
            f"min_pages, min_sites and limit must be at least 1, got {min_pages}, {min_sites}, {limit}"
        )
    out = Path(out)
    files: list[str] = []
    urls: list[str | None] = []
    ids: list[str] = []
    sites: list[str] = []
    metas: list[PageMetadata] = []
    too_large = 0
    for page in pages_within_cap(corpus, limit=limit):
        if page.error is not None:  # over the page cap, or still compressed: no system could embed it
            too_large += 1  # (`pages_within_cap`)
            continue
        meta = page_metadata(page.html)
        ids.append(page.id)
        urls.append(page.url)
        files.append(_store_page(out, page))
        sites.append(site_of(page.url) or site_of(meta.canonical_url) or f"page:{page.id}")
        metas.append(meta)
    results: list[DerivedTask] = []
    for name, (description, labeller) in LABELLERS.items():
        raw = [labeller(m) for m in metas]
        labels, merged, dropped = merge_rare(raw, sites, min_pages=min_pages, min_sites=min_sites)
        counts = Counter(label for label in labels if label is not None)
        classes = sorted(counts, key=lambda c: (-counts[c], c))
        result = DerivedTask(
            name=name,
            description=description,
            labels=classes,
            counts=dict(counts),
            merged=merged,
            dropped=dropped,
            unlabelled=sum(label is None for label in raw),
            too_large=too_large,
            pages=len(metas),
        )
        results.append(result)
        index = [i for i, label in enumerate(labels) if label is not None]
        task_sites = {sites[i] for i in index}
        result.sites = len(task_sites)
        if len(classes) < 2:
            result.skipped = f"fewer than two classes with {min_pages} pages from {min_sites} sites"
        elif len(task_sites) < folds:
            result.skipped = f"fewer than {folds} sites"
        if result.skipped is not None:
            _remove_task(out / name)
            continue
        spec = TaskSpec(name, "classification", "f1_macro", classes, description)
        targets = np.asarray([classes.index(str(labels[i])) for i in index], dtype=np.int64)
        try:
            fold_of = assign_folds(
                targets, [sites[i] for i in index], kind="classification", k=folds, seed=seed
            )
        except EvaluationError as exc:  # every class smaller than the fold count
            result.skipped = str(exc)
            _remove_task(out / name)
            continue
        rows = [
            {
                "id": ids[i],
                "file": files[i],
                "url": urls[i],
                "label": labels[i],
                "group": sites[i],
                "fold": int(fold),
            }
            for i, fold in zip(index, fold_of.tolist(), strict=True)
        ]
        result.path = write_task(out / name, spec, rows)
    summary = [
        {
            "task": r.name,
            "description": r.description,
            "counts": r.counts,
            "merged_into_other": r.merged,
            "dropped": r.dropped,
            "unlabelled": r.unlabelled,
            "sites": r.sites,
            "skipped": r.skipped,
            "too_large_pages": r.too_large,
            "pages": r.pages,
        }
        for r in results
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / DERIVE_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return results


def require_a_task(results: list[DerivedTask], corpus: str | Path, out: str | Path) -> None:
    """Refuse a derivation that wrote no task (an empty corpus, or one too small for every task).

    It had exited 0, and `heads train` or `eval run` failed later on "no task directories", far from
    the cause; `tokenizer train` and `data prepare` refuse an empty corpus the same way. derive.json is
    written first, so the reasons stay on disk.
    """
    if any(r.path is not None for r in results):
        return
    pages = results[0].pages if results else 0
    too_large = results[0].too_large if results else 0
    if not pages:
        read = f"{corpus} holds no page to label" + (
            f" ({too_large} over the page cap or still compressed passed over)" if too_large else ""
        )
    else:
        read = f"every task was skipped on the {pages} page(s) of {corpus}"
    reasons = "; ".join(f"{r.name}: {r.skipped}" for r in results)
    raise EvaluationError(
        f"no task was derived: {read} ({reasons}); {Path(out) / DERIVE_FILE} records why. Derive from "
        "more pages (and sites), or lower --min-pages, --min-sites or --folds"
    )
