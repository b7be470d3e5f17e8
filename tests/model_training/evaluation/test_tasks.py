"""Task files: the format round-trips, bad rows are typed errors, folds never split a site."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model_training.evaluation.metrics import EvaluationError
from model_training.evaluation.tasks import TaskSpec, assign_folds, load_task, load_tasks, write_task
from model_training.sites import site_of


def rows(n: int = 20, sites: int = 10) -> list[dict[str, object]]:
    return [
        {
            "id": f"p{i}",
            "html": f"<p>page {i}</p>",
            "url": f"https://www.s{i % sites}.org/{i}",
            "label": "a" if i % 2 else "b",
        }
        for i in range(n)
    ]


def test_round_trip_and_group_disjoint_folds(tmp_path: Path) -> None:
    spec = TaskSpec("kind", "classification", "f1_macro", ["a", "b"], "test task")
    write_task(tmp_path / "kind", spec, rows())
    task = load_task(tmp_path / "kind", k=5)
    assert task.spec == spec
    assert task.ids[:2] == ["p0", "p1"]
    assert task.targets.tolist()[:4] == [1, 0, 1, 0]
    assert task.num_folds == 5
    fold_of: dict[str, set[int]] = {}
    for group, fold in zip(task.groups, task.folds.tolist(), strict=True):
        fold_of.setdefault(group, set()).add(fold)
    assert all(len(f) == 1 for f in fold_of.values())
    assert len(set(task.keys)) == 20


def test_load_tasks_reads_every_task_dir_and_shares_page_bytes(tmp_path: Path) -> None:
    for name in ("t1", "t2"):
        write_task(tmp_path / name, TaskSpec(name, "classification", "accuracy", ["a", "b"]), rows())
    (tmp_path / "pages").mkdir()  # not a task: ignored
    one, two = load_tasks(tmp_path)
    assert [one.spec.name, two.spec.name] == ["t1", "t2"]
    assert one.pages[3] is two.pages[3]


def test_stored_folds_are_checked(tmp_path: Path) -> None:
    bad = [dict(r, fold=i % 2) for i, r in enumerate(rows(sites=2))]  # s0 in fold 0, s1 in fold 1
    bad[0]["url"] = "https://www.s1.org/x"  # s1 now in fold 0 and fold 1
    write_task(tmp_path / "t", TaskSpec("t", "classification", "accuracy", ["a", "b"]), bad)
    with pytest.raises(EvaluationError, match="is in folds"):
        load_task(tmp_path / "t")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "x", "html": "<p>x</p>", "label": "zzz"}, "not one of"),
        ({"id": "x", "html": "<p>x</p>"}, "no 'label'"),
        ({"id": "x", "label": "a"}, "neither"),
    ],
)
def test_bad_rows_are_typed_errors(tmp_path: Path, row: dict[str, object], message: str) -> None:
    write_task(tmp_path / "t", TaskSpec("t", "classification", "accuracy", ["a", "b"]), [*rows(), row])
    with pytest.raises(EvaluationError, match=message):
        load_task(tmp_path / "t")


def test_regression_labels_must_be_numbers(tmp_path: Path) -> None:
    good = [dict(r, label=float(i)) for i, r in enumerate(rows())]
    write_task(tmp_path / "r", TaskSpec("r", "regression", "rmse"), good)
    assert load_task(tmp_path / "r").targets.dtype == np.float64
    write_task(
        tmp_path / "r", TaskSpec("r", "regression", "rmse"), [*good, {"id": "x", "html": "x", "label": "1"}]
    )
    with pytest.raises(EvaluationError, match="finite number"):
        load_task(tmp_path / "r")


def test_bad_specs_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError):
        TaskSpec("t", "classification", "rmse", ["a", "b"])
    with pytest.raises(EvaluationError):
        TaskSpec("t", "regression", "rmse", ["a"])
    with pytest.raises(EvaluationError):
        TaskSpec("t/x", "classification", "accuracy", ["a", "b"])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.json").write_text(json.dumps({"name": "t", "kind": "classification"}))
    (tmp_path / "t" / "pages.jsonl").write_text("")
    with pytest.raises(EvaluationError, match="lacks"):
        load_task(tmp_path / "t")


def test_too_few_sites_for_the_folds() -> None:
    with pytest.raises(EvaluationError, match="at least 5 groups"):
        assign_folds(np.zeros(8, dtype=np.int64), ["a", "b", "c", "d"] * 2, kind="classification", k=5)


@pytest.mark.parametrize(
    ("url", "site"),
    [
        ("https://www.bbc.co.uk/news/1", "bbc.co.uk"),
        ("https://en.blog.wordpress.com/2020/x", "blog.wordpress.com"),  # blogs are sites of their own
        ("https://de.creativecommons.org/x", "creativecommons.org"),
        ("http://192.168.1.20/x", "192.168.1.20"),
        ("https://web.archive.org/web/2019id_/https://www.spiegel.de/a", "spiegel.de"),
        ("http://localhost:8000/x", "localhost"),
        (None, None),
        ("not a url", None),
    ],
)
def test_site_of(url: str | None, site: str | None) -> None:
    assert site_of(url) == site


def test_a_classification_task_whose_pages_have_one_class_is_refused(tmp_path: Path) -> None:
    # It used to train and record accuracy 1.0 ± 0.0 in the served checkpoint for a constant head.
    spec = TaskSpec("one", "classification", "accuracy", ["a", "b"])
    write_task(tmp_path / "one", spec, [{**row, "label": "a"} for row in rows()])
    with pytest.raises(EvaluationError, match="at least two classes"):
        load_task(tmp_path / "one")


def test_one_fold_is_a_typed_error() -> None:
    with pytest.raises(EvaluationError, match="at least 2 folds"):
        assign_folds(np.zeros(6), [f"s{i}" for i in range(6)], kind="regression", k=1)


def test_task_hash_follows_pages_labels_and_folds(tmp_path: Path) -> None:
    """Figures recorded with the hash of their tasks and folds can be told apart from today's: sites.py
    regrouping shared-host pages had changed the folds while the published figures stayed."""
    from model_training.evaluation.tasks import hash_metric, task_sha256

    spec = TaskSpec("kind", "classification", "f1_macro", ["a", "b"])
    write_task(tmp_path / "kind", spec, rows())
    task = load_task(tmp_path / "kind", k=5)
    digest = task_sha256(task)
    assert len(digest) == 64 and digest == task_sha256(load_task(tmp_path / "kind", k=5))
    assert task_sha256(load_task(tmp_path / "kind", k=5, seed=1)) != digest  # other folds
    assert task_sha256(load_task(tmp_path / "kind", k=4)) != digest
    relabelled = [{**row, "label": "a"} if row["id"] == "p0" else row for row in rows()]
    write_task(tmp_path / "relabelled", spec, relabelled)
    assert task_sha256(load_task(tmp_path / "relabelled", k=5)) != digest
    regrouped = [{**row, "group": "one-site"} if row["id"] in ("p0", "p1") else row for row in rows()]
    write_task(tmp_path / "regrouped", spec, regrouped)
    assert task_sha256(load_task(tmp_path / "regrouped", k=5)) != digest
    # The number stored in a head's metrics (numbers only) gives back the hash's first 12 hex digits.
    value = hash_metric(digest)
    assert isinstance(value, int) and float(value) == value and f"{value:012x}" == digest[:12]


def test_scikit_learn_pin_has_the_fold_splitters_assign_folds_uses() -> None:
    """GroupKFold(shuffle=True) exists from scikit-learn 1.6 (1.5: a TypeError traceback), and 1.5's
    StratifiedGroupKFold gives other folds for the same seed: the pin had allowed >=1.4."""
    import re
    import tomllib
    from importlib.metadata import version

    from packaging.version import Version

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    requirements = [
        r for group in data["project"]["optional-dependencies"].values() for r in group if "scikit-learn" in r
    ] + [r for r in data["project"].get("dependencies", []) if "scikit-learn" in r]
    assert requirements
    for requirement in requirements:
        match = re.fullmatch(r"scikit-learn>=([0-9.]+)", requirement.replace(" ", ""))
        assert match, requirement
        assert Version(match.group(1)) >= Version("1.6"), requirement
    assert Version(version("scikit-learn")) >= Version("1.6")
    targets = np.asarray([0.5 * i for i in range(20)])
    groups = [f"s{i % 10}" for i in range(20)]
    folds = assign_folds(targets, groups, kind="regression", k=5)
    assert sorted(set(folds.tolist())) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("name", ["quality.v2", "page_kind.probs"])
def test_a_task_name_with_a_dot_is_refused(name: str) -> None:
    """A task's name is its head's, a module of the model's ModuleDict, which torch refuses with a '.':
    `heads train` had saved such a head, and then no command could load the checkpoint."""
    with pytest.raises(EvaluationError, match="must be letters, digits, '_', '-'"):
        TaskSpec(name, "classification", "f1_macro", ["a", "b"])
