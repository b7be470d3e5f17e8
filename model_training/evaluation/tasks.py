"""Evaluation tasks as files, so a user can bring labels without writing code.

A task is a directory with two files:
- `task.json`: the spec, `{"name", "kind": "classification"|"regression", "metric":
  "f1_macro"|"accuracy"|"rmse", "labels": [...], "description"}` (`labels` is `[]` for regression);
- `pages.jsonl`: one row per page, `{"id", "html"|"file", "label"}`, optionally `url`, `group` (the site
  the page comes from; by default the registrable domain of `url`) and `fold` (0..k-1, the cross-validation
  fold). Rows are read with `service.core.pages.iter_pages`, so `file` is relative to the JSONL file.

Folds are always by group, so no site is in both the training and the test folds: a head that memorises
a site's template cannot score on its own pages.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_training.evaluation.cache import content_key
from model_training.evaluation.metrics import EvaluationError, get_metric
from model_training.sites import site_of
from service.core.errors import HtmllmError
from service.core.pages import iter_pages

TASK_SPEC_FILE = "task.json"
TASK_PAGES_FILE = "pages.jsonl"
KINDS = ("classification", "regression")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str
    metric: str
    labels: list[str] = field(default_factory=list)
    description: str = ""

    def __post_init__(self) -> None:
        # No '.': a task's name is its head's, which the model's ModuleDict cannot hold with one.
        if not re.fullmatch(r"[A-Za-z0-9_-]+", self.name):
            raise EvaluationError(f"task name {self.name!r} must be letters, digits, '_', '-'")
        if self.kind not in KINDS:
            raise EvaluationError(f"task {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind not in get_metric(self.metric).kinds:
            raise EvaluationError(f"task {self.name}: metric {self.metric} does not apply to {self.kind}")
        if self.kind == "classification" and len(set(self.labels)) < 2:
            raise EvaluationError(f"task {self.name}: a classification task needs at least two labels")
        if len(set(self.labels)) != len(self.labels):
            raise EvaluationError(f"task {self.name}: duplicate labels in {self.labels}")
        if self.kind == "regression" and self.labels:
            raise EvaluationError(f"task {self.name}: a regression task has no labels")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, origin: str) -> TaskSpec:
        if not isinstance(data, dict):
            raise EvaluationError(f"{origin}: the task spec is not a JSON object")
        unknown = set(data) - {"name", "kind", "metric", "labels", "description"}
        if unknown:
            raise EvaluationError(f"{origin}: unknown task spec fields {sorted(unknown)}")
        try:
            return cls(
                name=str(data["name"]),
                kind=str(data["kind"]),
                metric=str(data["metric"]),
                labels=[str(label) for label in data.get("labels", [])],
                description=str(data.get("description", "")),
            )
        except KeyError as exc:
            raise EvaluationError(f"{origin}: the task spec lacks {exc.args[0]!r}") from None


@dataclass
class Task:
    """A loaded task: the spec and, per page, its raw bytes, content hash, target, group and fold."""

    spec: TaskSpec
    path: Path
    ids: list[str]
    pages: list[bytes]
    keys: list[str]  # sha256 of each page's bytes: the embedding cache's key
    targets: np.ndarray  # (N,) int64 label indices, or float64 values for regression
    groups: list[str]
    folds: np.ndarray  # (N,) int64 fold of each page, group-disjoint

    @property
    def num_folds(self) -> int:
        return int(self.folds.max()) + 1

    def subset(self, keep: np.ndarray) -> Task:
        """The task restricted to the rows where `keep` is true; every fold must keep a page."""
        index = np.flatnonzero(keep)
        folds = self.folds[index]
        if len(set(folds.tolist())) != self.num_folds:
            raise EvaluationError(f"task {self.spec.name}: a fold lost all its pages")
        return Task(
            spec=self.spec,
            path=self.path,
            ids=[self.ids[i] for i in index],
            pages=[self.pages[i] for i in index],
            keys=[self.keys[i] for i in index],
            targets=self.targets[index],
            groups=[self.groups[i] for i in index],
            folds=folds,
        )


def assign_folds(
    targets: np.ndarray, groups: Sequence[str], *, kind: str, k: int = 5, seed: int = 0
) -> np.ndarray:
    """Group-disjoint folds, stratified by label for classification, so each fold sees every class."""
    from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

    if k < 2:
        raise EvaluationError(f"cross-validation needs at least 2 folds, got {k}")
    unique_groups = len(set(groups))
    if unique_groups < k:
        raise EvaluationError(
            f"{k}-fold cross-validation needs at least {k} groups (sites), got {unique_groups}"
        )
    if kind == "classification":
        counts = np.unique(targets, return_counts=True)[1]
        if counts.max(initial=0) < k:
            # scikit-learn's own refusal, a ValueError traceback: a fold could hold no page of any class.
            raise EvaluationError(
                f"{k}-fold cross-validation needs a class with at least {k} pages; the largest has "
                f"{counts.max(initial=0)} (use fewer folds)"
            )
    folds = np.full(len(targets), -1, dtype=np.int64)
    dummy = np.zeros((len(targets), 1))
    splitter: StratifiedGroupKFold | GroupKFold
    if kind == "classification":
        splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
        splits = splitter.split(dummy, targets, groups)
    else:
        splitter = GroupKFold(n_splits=k, shuffle=True, random_state=seed)
        splits = splitter.split(dummy, targets, groups)
    for fold, (_, test_index) in enumerate(splits):
        folds[test_index] = fold
    return folds


def task_sha256(task: Task) -> str:
    """A hash of what a task's figures were computed on: its spec, and per page (in order) the content
    hash, target, group and fold.

    Recorded in `eval run`'s report.json and in each served head's metrics, so figures made on other
    tasks or other folds (a re-derived task, a change of how sites group pages) can be told apart from
    today's by comparing it with a fresh `load_tasks` of the same directory.
    """
    rows = [
        [key, target, group, fold]
        for key, target, group, fold in zip(
            task.keys, task.targets.tolist(), task.groups, task.folds.tolist(), strict=True
        )
    ]
    payload = json.dumps({"spec": task.spec.to_json(), "rows": rows}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


HASH_METRIC = "tasks_sha256_48"  # a head's metrics hold numbers only: the hash's first 12 hex digits


def hash_metric(digest: str) -> int:
    """`task_sha256`'s first 48 bits as an integer (exact in a JSON number, unlike the whole hash);
    `format(value, "012x")` gives back the hex prefix shown in report.json."""
    return int(digest[:12], 16)


def _target(spec: TaskSpec, label: Any, origin: str) -> float | int:
    if spec.kind == "classification":
        if str(label) not in spec.labels:
            raise EvaluationError(f"{origin}: label {label!r} is not one of the task's labels {spec.labels}")
        return spec.labels.index(str(label))
    if isinstance(label, bool) or not isinstance(label, int | float) or not np.isfinite(label):
        raise EvaluationError(f"{origin}: regression label {label!r} is not a finite number")
    return float(label)


def load_task(
    path: str | Path, *, k: int = 5, seed: int = 0, interned: dict[str, bytes] | None = None
) -> Task:
    """Read and validate one task directory; folds come from the rows or are assigned by group.

    `interned` maps content hashes to page bytes shared between tasks, so pages that several tasks
    label are held in memory once.
    """
    # Refused even where the rows carry their folds (then k is not used): a `--folds 0` or `--folds 1`
    # had passed silently there, and failed only for the tasks that needed folds assigned.
    if k < 2:
        raise EvaluationError(f"cross-validation needs at least 2 folds, got {k}")
    path = Path(path)
    spec_path, pages_path = path / TASK_SPEC_FILE, path / TASK_PAGES_FILE
    if not spec_path.is_file() or not pages_path.is_file():
        raise EvaluationError(
            f"{path} is not a task directory (needs {TASK_SPEC_FILE} and {TASK_PAGES_FILE})"
        )
    try:
        spec = TaskSpec.from_json(json.loads(spec_path.read_text(encoding="utf-8")), str(spec_path))
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"{spec_path}: not JSON: {exc}") from exc
    interned = {} if interned is None else interned
    ids: list[str] = []
    pages: list[bytes] = []
    keys: list[str] = []
    targets: list[float | int] = []
    groups: list[str] = []
    folds: list[int | None] = []
    try:
        for index, page in enumerate(iter_pages(pages_path)):
            origin = f"{pages_path}: row {index + 1}"
            if "label" not in page.meta:
                raise EvaluationError(f"{origin} has no 'label'")
            key = content_key(page.html)
            ids.append(page.id)
            keys.append(key)
            pages.append(interned.setdefault(key, page.html))
            targets.append(_target(spec, page.meta["label"], origin))
            group = page.meta.get("group")
            groups.append(str(group) if group is not None else site_of(page.url) or f"page:{page.id}")
            fold = page.meta.get("fold")
            if fold is not None and (isinstance(fold, bool) or not isinstance(fold, int) or fold < 0):
                raise EvaluationError(f"{origin}: fold {fold!r} is not a non-negative integer")
            folds.append(fold)
    except EvaluationError:
        raise
    except HtmllmError as exc:
        raise EvaluationError(f"{pages_path}: {exc}") from exc
    if not ids:
        raise EvaluationError(f"{pages_path} has no rows")
    dtype = np.int64 if spec.kind == "classification" else np.float64
    target_array = np.asarray(targets, dtype=dtype)
    if spec.kind == "classification" and len(set(target_array.tolist())) < 2:
        # A head fit on one class predicts it everywhere and scores a perfect 1.0: a figure that would be
        # written into the served checkpoint as if the head had learned something.
        raise EvaluationError(
            f"{pages_path}: every row has the label {spec.labels[int(target_array[0])]!r}; "
            f"a classification task needs pages of at least two classes"
        )
    if all(f is not None for f in folds):
        fold_array = np.asarray(folds, dtype=np.int64)
        _check_folds(spec.name, fold_array, groups)
    elif any(f is not None for f in folds):
        raise EvaluationError(f"{pages_path}: either every row has a 'fold' or none does")
    else:
        fold_array = assign_folds(target_array, groups, kind=spec.kind, k=k, seed=seed)
    return Task(spec, path, ids, pages, keys, target_array, groups, fold_array)


def _check_folds(name: str, folds: np.ndarray, groups: Sequence[str]) -> None:
    if len(set(folds.tolist())) < 2 or set(folds.tolist()) != set(range(int(folds.max()) + 1)):
        raise EvaluationError(
            f"task {name}: folds must be 0..k-1 with k >= 2, got {sorted(set(folds.tolist()))}"
        )
    fold_of: dict[str, int] = {}
    for group, fold in zip(groups, folds.tolist(), strict=True):
        if fold_of.setdefault(group, fold) != fold:
            raise EvaluationError(f"task {name}: group {group!r} is in folds {fold_of[group]} and {fold}")


def load_tasks(path: str | Path, *, k: int = 5, seed: int = 0) -> list[Task]:
    """One task directory, or every task directory directly under `path`, in name order."""
    path = Path(path)
    if (path / TASK_SPEC_FILE).is_file():
        return [load_task(path, k=k, seed=seed)]
    if not path.is_dir():
        raise EvaluationError(f"task path {path} does not exist")
    dirs = sorted(p for p in path.iterdir() if (p / TASK_SPEC_FILE).is_file())
    if not dirs:
        raise EvaluationError(f"no task directories (with {TASK_SPEC_FILE}) under {path}")
    interned: dict[str, bytes] = {}
    return [load_task(d, k=k, seed=seed, interned=interned) for d in dirs]


def write_task(path: str | Path, spec: TaskSpec, rows: Iterable[dict[str, Any]]) -> Path:
    """Write a task directory; rows are written as given (each needs `id`, `html` or `file`, `label`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / TASK_SPEC_FILE).write_text(json.dumps(spec.to_json(), indent=2) + "\n", encoding="utf-8")
    with (path / TASK_PAGES_FILE).open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
