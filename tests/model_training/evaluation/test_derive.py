"""Derived tasks: labels come from the metadata, rare classes merge, and no site spans two folds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model_training.evaluation.derive import derive_tasks, merge_rare, page_metadata, schema_label
from model_training.evaluation.metrics import EvaluationError
from model_training.evaluation.tasks import assign_folds, load_tasks
from tests.model_training.evaluation.pagegen import write_corpus


def test_page_metadata_reads_og_jsonld_and_lang() -> None:
    html = (
        '<html lang="de-AT"><head><meta property="og:type" content=" Article ">'
        '<link rel="canonical" href="https://www.example.at/x">'
        '<script type="application/ld+json">{"@graph": [{"@type": ["schema:NewsArticle"]}, '
        '{"@type": "BreadcrumbList", "itemListElement": [{"@type": "ListItem"}]}]}</script>'
        '<script type="application/ld+json">{not json</script></head><body><p>x</p></body></html>'
    )
    meta = page_metadata(html.encode())
    assert meta.og_type == "article"
    assert meta.lang == "de"
    assert meta.schema_types == {"NewsArticle", "BreadcrumbList", "ListItem"}
    assert meta.canonical_url == "https://www.example.at/x"
    assert schema_label(meta.schema_types) == "NewsArticle"


def test_missing_metadata_reads_as_absent() -> None:
    meta = page_metadata(b"<p>no head at all")
    assert (meta.og_type, meta.lang, meta.schema_types) == (None, None, frozenset())
    assert schema_label(frozenset({"TechArticle", "Person"})) == "Article"
    assert schema_label(frozenset({"ListItem"})) is None


def test_merge_rare_merges_then_drops() -> None:
    labels: list[str | None] = ["a"] * 6 + ["b"] * 2 + ["c"] * 2 + [None]
    sites = [f"s{i}" for i in range(11)]
    merged, into_other, dropped = merge_rare(labels, sites, min_pages=4, min_sites=3)
    assert into_other == ["b", "c"] and not dropped
    assert merged == ["a"] * 6 + ["other"] * 4 + [None]
    merged, into_other, dropped = merge_rare(labels, sites, min_pages=5, min_sites=3)
    assert dropped == ["b", "c"] and not into_other
    assert merged == ["a"] * 6 + [None] * 5


def test_derived_tasks_never_share_a_site_across_folds(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=15, pages_per_site=4)
    results = derive_tasks(corpus, tmp_path / "tasks", min_pages=6, min_sites=3, folds=3)
    written = {r.name: r for r in results if r.path is not None}
    assert set(written) == {"page_kind", "schema_type", "language"}
    assert written["language"].labels == ["de", "en", "es"]
    assert set(written["schema_type"].labels) == {"NewsArticle", "WebPage", "BlogPosting"}
    tasks = load_tasks(tmp_path / "tasks")
    assert [t.spec.name for t in tasks] == ["language", "page_kind", "schema_type"]
    for task in tasks:
        assert len(task.ids) == 60 and task.num_folds == 3
        folds_of_site: dict[str, set[int]] = {}
        for group, fold in zip(task.groups, task.folds.tolist(), strict=True):
            folds_of_site.setdefault(group, set()).add(fold)
        assert all(len(f) == 1 for f in folds_of_site.values()), folds_of_site
        # Sites are registrable domains, not hosts: www.site3.com and blog.site3.com are one site.
        assert len(folds_of_site) == 15
    summary = json.loads((tmp_path / "tasks" / "derive.json").read_text())
    assert {row["task"] for row in summary} == set(written)
    # Pages are stored once, content-addressed, and byte-identical to the source.
    assert len(list((tmp_path / "tasks" / "pages").iterdir())) == 60


def test_tasks_without_enough_classes_are_skipped(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=2)
    results = derive_tasks(corpus, tmp_path / "tasks", min_pages=100, min_sites=3, folds=3)
    assert all(r.path is None and r.skipped for r in results)
    with pytest.raises(Exception, match="no task directories"):
        load_tasks(tmp_path / "tasks")


def test_derive_refuses_impossible_options_before_reading_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=3, pages_per_site=2)
    # --folds 1 used to end in scikit-learn's ValueError traceback after every page was read.
    assert (
        main(["tasks", "derive", "--corpus", str(corpus), "--out", str(tmp_path / "t"), "--folds", "1"]) == 1
    )
    assert "at least 2 folds" in capsys.readouterr().err
    assert not (tmp_path / "t" / "pages").exists()
    assert main(["tasks", "derive", "--corpus", str(corpus), "--out", str(corpus)]) == 1
    assert "is an existing file" in capsys.readouterr().err


def test_page_metadata_survives_references_that_decode_longer() -> None:
    """A run of `&nGt;` made Lexbor write past its buffer and abort the process: read in a child."""
    code = (
        "from model_training.evaluation.derive import page_metadata\n"
        "meta = page_metadata(b'<html lang=cs><p title=\"' + b'&nGt;' * 5000 + b'\">' + b'&nLt;' * 5000)\n"
        "print(meta.lang)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "cs"


def test_a_second_run_that_skips_a_task_leaves_no_stale_task_behind(tmp_path: Path) -> None:
    """The first run's page_kind/ used to stay after the second run said "skipped", and `heads train
    --tasks` then trained a head for it."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=15, pages_per_site=4)
    out = tmp_path / "tasks"
    assert all(r.path is not None for r in derive_tasks(corpus, out, min_pages=6, min_sites=3, folds=3))
    (out / "mine").mkdir()  # not a task directory: never removed
    results = derive_tasks(corpus, out, min_pages=100, min_sites=3, folds=3)
    assert all(r.skipped for r in results)
    assert sorted(p.name for p in out.iterdir()) == ["derive.json", "mine", "pages"]
    with pytest.raises(EvaluationError, match="no task directories"):
        load_tasks(out)


def test_more_folds_than_any_class_has_pages_skips_the_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--folds above every class's page count (but not the site count) had been scikit-learn's ValueError
    traceback, with the tasks derived before it left on disk."""
    from service.cli import main

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=12, pages_per_site=1)  # 6 pages per class
    out = tmp_path / "tasks"
    args = ["tasks", "derive", "--corpus", str(corpus), "--out", str(out), "--min-pages", "2"]
    assert main([*args, "--min-sites", "2", "--folds", "8"]) == 1  # no task left: refused, reasons printed
    captured = capsys.readouterr()
    assert captured.out.count("skipped (8-fold cross-validation needs a class with at least 8 pages") == 3
    assert "no task was derived" in captured.err and "Traceback" not in captured.err
    assert sorted(p.name for p in out.iterdir()) == ["derive.json", "pages"]
    with pytest.raises(EvaluationError, match="needs a class with at least 8 pages; the largest has 6"):
        assign_folds(np.asarray([0] * 6 + [1] * 6), [f"s{i}" for i in range(12)], kind="classification", k=8)


def test_a_page_over_the_page_cap_is_counted_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One page over the cap used to stop the whole run (payload_too_large, exit 1)."""
    from service.core import pages

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=15, pages_per_site=4)
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write(
            json.dumps({"id": "huge", "url": "https://huge.example/", "html": "<p>x</p>" * 5000}) + "\n"
        )
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 20_000)  # the generated pages are under 5 kB
    results = derive_tasks(corpus, tmp_path / "tasks", min_pages=6, min_sites=3, folds=3)
    assert all(r.path is not None and r.too_large == 1 for r in results)
    assert len(load_tasks(tmp_path / "tasks")[0].ids) == 60
    summary = json.loads((tmp_path / "tasks" / "derive.json").read_text())
    assert all(row["too_large_pages"] == 1 for row in summary)
