"""The default-model bundler: what it copies from a run into the service's assets."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from model_training import default_model
from service.core.checkpoint import load_checkpoint, read_meta, save_heads
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint


class _Killed(BaseException):
    """A kill, as far as the code under test can tell."""


def _save_heads_killed_after(source: Path, renames: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `save_heads` adding head "topic", killed at its `renames`+1-th rename (2: just after its commit)."""
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8)
    head = TaskHead(topic, read_meta(source).embedding_dim)
    real, done = os.replace, [0]

    def replace(src: Any, dst: Any) -> None:
        if done[0] >= renames:
            raise _Killed
        done[0] += 1
        real(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", replace)
        with pytest.raises(_Killed):
            save_heads(source, {"topic": (topic, head)})


@pytest.mark.parametrize(
    ("renames", "heads"), [(2, ["page_type", "quality", "topic"]), (1, ["page_type", "quality"])]
)
def test_bundle_completes_a_committed_stage_in_the_run_and_never_copies_a_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renames: int, heads: list[str]
) -> None:
    """heads/.pending was copied into the assets as it was (and a committed one stayed in the run)."""
    source = build_tiny_checkpoint(tmp_path / "run" / "pretrain" / "model")
    _save_heads_killed_after(source, renames, monkeypatch)
    assert (source / "heads" / ".pending").is_dir()
    monkeypatch.setattr(default_model, "render_card", lambda run, out, eval_dir, curve=None: "card\n")
    out = tmp_path / "assets"
    default_model.bundle(tmp_path / "run", out, curve=None, eval_dir=None)
    assert not list(out.rglob(".pending*"))
    assert not (source / "heads" / ".pending" / "htmllm.json").exists()  # completed in the run itself
    assert [spec.name for spec in load_checkpoint(out).meta.heads] == heads
    assert not list(out.rglob(".pending*"))  # loading the bundle found nothing to complete either


def test_bundle_overtaken_by_a_save_heads_copies_the_new_heads_under_their_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle copied htmllm.json and then heads/ without the heads lock: a `save_heads` between the
    two gave the assets the old labels over the new weights. It is copied as a load reads, again when a
    save overtakes it."""
    from service.core import checkpoint as checkpoint_module

    source = build_tiny_checkpoint(tmp_path / "run" / "pretrain" / "model")
    topic = HeadSpec(name="topic", kind="classification", labels=["a", "b"], hidden=8)
    head = TaskHead(topic, read_meta(source).embedding_dim)
    real_copy, saved = checkpoint_module._copy_file, []

    def copy_file(file: Path, destination: Path) -> None:
        real_copy(file, destination)
        if destination.name == "htmllm.json" and not saved:  # the old labels copied, no head file yet
            saved.append(True)
            save_heads(source, {"topic": (topic, head)})

    monkeypatch.setattr(checkpoint_module, "_copy_file", copy_file)
    monkeypatch.setattr(default_model, "render_card", lambda run, out, eval_dir, curve=None: "card\n")
    out = tmp_path / "assets"
    default_model.bundle(tmp_path / "run", out, curve=None, eval_dir=None)
    assert saved
    assert [spec.name for spec in load_checkpoint(out).meta.heads] == ["page_type", "quality", "topic"]
    assert sorted(path.name for path in (out / "heads").iterdir()) == sorted(
        path.name for path in (source / "heads").glob("*.safetensors")
    )  # the lock file stays in the run


def test_a_bundle_that_fails_leaves_the_previous_bundle_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle was deleted first and copied in place: a copy that failed half way (a disk full, a
    checkpoint that kept changing) left the service's assets a half-written model."""
    from service.core import checkpoint as checkpoint_module

    build_tiny_checkpoint(tmp_path / "run" / "pretrain" / "model")
    monkeypatch.setattr(default_model, "render_card", lambda run, out, eval_dir, curve=None: "card\n")
    out = tmp_path / "assets" / "default-model"
    default_model.bundle(tmp_path / "run", out, curve=None, eval_dir=None)
    before = sorted(path.relative_to(out) for path in out.rglob("*"))

    def disk_full(source: Path, destination: Path) -> None:
        if destination.name == "htmllm.json":
            raise OSError(28, "No space left on device")
        shutil.copyfile(source, destination)

    monkeypatch.setattr(checkpoint_module, "_copy_file", disk_full)
    with pytest.raises(SystemExit, match="No space left"):
        default_model.bundle(tmp_path / "run", out, curve=None, eval_dir=None)
    assert sorted(path.relative_to(out) for path in out.rglob("*")) == before
    load_checkpoint(out)
    monkeypatch.undo()
    monkeypatch.setattr(default_model, "render_card", lambda run, out, eval_dir, curve=None: "card\n")
    default_model.bundle(tmp_path / "run", out, curve=None, eval_dir=None)  # a leftover does not stop a rerun
    assert sorted(path.relative_to(out) for path in out.rglob("*")) == before
    assert sorted(path.name for path in out.parent.iterdir()) == ["default-model"]
    assert all(path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644) for path in out.rglob("*"))


def test_the_bundled_model_records_the_current_prune_version_and_the_docs_name_no_number() -> None:
    """docs/training.md says the bundle's htmllm.json is moved along with each prune version that leaves
    the corpus's pruned output as it was, and so records the current one. It had quoted the number, 8,
    which went stale at 9: it names the constant now, and this keeps the bundle at it."""
    from service.api.settings import default_model_path
    from service.core.prune import PRUNE_VERSION

    assert read_meta(default_model_path()).prune_version == PRUNE_VERSION
    docs = Path(__file__).resolve().parents[2] / "docs" / "training.md"
    text = " ".join(docs.read_text(encoding="utf-8").split())
    assert "records the current `PRUNE_VERSION` (in `service/core/prune.py`" in text
    assert not re.search(r"`PRUNE_VERSION`,? \d", text), "docs/training.md quotes a prune version number"


def test_the_card_prints_the_tasks_hash_of_each_head_in_hex() -> None:
    from model_training.evaluation.tasks import HASH_METRIC, hash_metric

    digest = "0ca3e52505dc" + "0" * 52
    metrics = {
        "f1_macro": 0.5,
        "f1_macro_std": 0.1,
        "pages": 40,
        "cv_folds": 5,
        HASH_METRIC: hash_metric(digest),
    }
    assert default_model._format_metrics(metrics) == (
        "f1_macro 0.500 ± 0.100, 40 pages, 5-fold CV, tasks sha256 0ca3e52505dc"
    )
    # The length a head was measured at (`heads train` records it) is no score: "at N tokens".
    assert default_model._format_metrics({**metrics, "max_length": 256}) == (
        "f1_macro 0.500 ± 0.100, 40 pages, 5-fold CV, at 256 tokens, tasks sha256 0ca3e52505dc"
    )


def test_the_bundled_heads_record_their_tasks_hash_and_the_card_shows_their_figures() -> None:
    """The bundle's head figures had outlived a change of the folds (sites.py, commit bba8173) unnoticed:
    each head records the hash of the tasks and folds it was scored on, and the card shows the figures
    and the hash htmllm.json records."""
    from model_training.evaluation.tasks import HASH_METRIC
    from service.api.settings import default_model_path

    bundle = default_model_path()
    card = (bundle / default_model.CARD_FILE).read_text(encoding="utf-8")
    heads = read_meta(bundle).heads
    assert heads
    for spec in heads:
        assert isinstance(spec.metrics.get(HASH_METRIC), int), spec.name
        figures = default_model._format_metrics(spec.metrics)
        row = f"| {spec.name} | {spec.kind} | {len(spec.labels) or '-'} | {figures} |"
        assert row in card, row


def test_the_service_docs_quote_the_bundled_heads_figures() -> None:
    """docs/service.md quotes each bundled head's f1_macro to two places: it had kept 0.60 and 0.31
    after the heads were retrained (0.611, 0.327)."""
    from service.api.settings import default_model_path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text(encoding="utf-8")
    paragraph = docs[docs.index("The bundled heads show the mechanism") :][:600]
    quoted = dict(re.findall(r"`(\w+)`[^(]*\((?:f1_macro )?(\d\.\d\d) over", paragraph))
    heads = {spec.name: spec.metrics["f1_macro"] for spec in read_meta(default_model_path()).heads}
    assert quoted.keys() == heads.keys()
    for name, value in heads.items():
        assert quoted[name] == f"{value:.2f}", name
