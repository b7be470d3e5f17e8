"""MODEL_CARD.md's figures are those of the run it describes: its pages and corpus, the curve where the
bundle copies it, the pretraining time named for what it is, and only figures the run measured. The card
had said "~1,000 pages" of the shared corpus, trained on 2 CPU cores, with the curve in docs/ for any
run, printed the last session's time as the run's, and 0.000 held-out losses for a run with no held-out
pages."""

from __future__ import annotations

import json
from pathlib import Path

from model_training import default_model
from model_training.pretrain import CURVE_FILE, SUMMARY_FILE
from service.core.checkpoint import read_meta, save_heads
from service.core.modeling import HeadSpec, TaskHead
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.test_pretrain import _build_run_inputs


def _run(root: Path, *, heads: bool = True) -> Path:
    """A finished run of `make default-model`'s layout, with figures no other run has."""
    run = root / "run"
    shards, _ = _build_run_inputs(run, documents=20)
    manifest = json.loads((shards / "manifest.json").read_text(encoding="utf-8"))
    manifest["source"] = "/corpora/shop-pages"
    manifest["stats"] = {"pages": 4321, "written": 4000, "train": 3800, "heldout": 200, "tokens": 123456}
    (shards / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    model = build_tiny_checkpoint(run / "pretrain" / "model", heads=False)
    dim = read_meta(model).embedding_dim
    for name, pages in (("topic", 1234), ("spam", 2345)) if heads else ():
        spec = HeadSpec(name=name, kind="regression", hidden=8, metrics={"r2": 0.5, "pages": pages})
        save_heads(model, {name: (spec, TaskHead(spec, dim))})
    summary = {"steps": 10, "seconds_this_session": 12.5, "heldout": {"documents": 200.0, "cosine": 0.5}}
    (run / "pretrain" / SUMMARY_FILE).write_text(json.dumps(summary), encoding="utf-8")
    (run / "pretrain" / CURVE_FILE).write_bytes(b"png")
    return run


def test_the_card_prints_the_runs_own_pages_corpus_curve_and_time(tmp_path: Path) -> None:
    run = _run(tmp_path)
    curve = tmp_path / "site" / "curve.png"
    card = default_model.bundle(run, tmp_path / "assets", curve=curve, eval_dir=None).read_text("utf-8")
    for fixed in ("~1,000", "about a thousand", "2 CPU cores", "2-core", "docs/training_curve.png", "~50"):
        assert fixed not in card
    assert "on the 4,321 pages of `/corpora/shop-pages`" in card
    assert "- Trained on 4,000 pages of `/corpora/shop-pages`." in card
    assert "Figures on 200 held-out pages and 1,234-2,345 labelled pages are noisy" in card
    assert f"The training curve is `{curve}`." in card and curve.read_bytes() == b"png"
    assert "pretraining 12.5; pretraining's is the session's that finished the run (a resumed run's " in card


def test_without_a_copied_curve_the_card_names_the_runs_own(tmp_path: Path) -> None:
    run = _run(tmp_path)
    card = default_model.bundle(run, tmp_path / "assets", curve=None, eval_dir=None).read_text("utf-8")
    assert f"The training curve is `{run / 'pretrain' / CURVE_FILE}`." in card
    (run / "pretrain" / CURVE_FILE).unlink()
    card = default_model.bundle(run, tmp_path / "assets", curve=tmp_path / "c.png", eval_dir=None).read_text(
        "utf-8"
    )
    assert "training curve" not in card and not (tmp_path / "c.png").exists()


def _summary(run: Path, **fields: object) -> None:
    (run / "pretrain" / SUMMARY_FILE).write_text(json.dumps({"steps": 10, **fields}), encoding="utf-8")


def _without_distillation(run: Path) -> None:
    """The run's model as a run with `loss_weights.distil = 0` records itself: no teacher read."""
    meta_file = run / "pretrain" / "model" / "htmllm.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    weights = {"bow": 1.0, "distil": 0.0, "mlm": 0.1}
    meta["training"] = {"teacher": None, "config": {"teacher": None, "loss_weights": weights}}
    meta_file.write_text(json.dumps(meta), encoding="utf-8")


def test_a_run_without_held_out_pages_has_no_held_out_figures_in_its_card(tmp_path: Path) -> None:
    """`--holdout-fraction 0`: the card printed "MLM / BOW / distillation loss, held out | 0.000 / 0.000
    / 0.000", a 0.000 cosine and top-1, and "Figures on ? held-out pages"."""
    run = _run(tmp_path)
    _summary(run, heldout={}, final_train={"mlm": 6.1, "bow": 5.9, "distil": 0.4})
    card = default_model.bundle(run, tmp_path / "assets", curve=None, eval_dir=None).read_text("utf-8")
    assert "No pages were held out (the shards have none: `htmllm data prepare --holdout-fraction 0`)" in card
    assert "| MLM / BOW / distillation loss, last training step | 6.100 / 5.900 / 0.400 |" in card
    assert "held out |" not in card and "Held-out pages |" not in card and "cosine" not in card
    assert "0.000" not in card and "Figures on ?" not in card
    assert "- Figures on 1,234-2,345 labelled pages are noisy;" in card

    run = _run(tmp_path / "bare", heads=False)
    _without_distillation(run)
    _summary(run, heldout={}, final_train={"mlm": 6.1, "bow": 5.9})
    card = default_model.bundle(run, tmp_path / "bare-assets", curve=None, eval_dir=None).read_text("utf-8")
    assert "| MLM / BOW loss, last training step | 6.100 / 5.900 |" in card
    assert "held out |" not in card and "0.000" not in card and "Figures on" not in card
    assert "- No pages were held out: the pretraining figures are training losses" in card


def test_a_card_without_distillation_gives_no_distillation_weight(tmp_path: Path) -> None:
    """ "(no distillation); weights {'bow': 1.0, 'distil': 0.0, 'mlm': 0.1}" named a loss never computed."""
    run = _run(tmp_path)
    _without_distillation(run)
    _summary(run, heldout={"documents": 200, "mlm_loss": 6.0, "bow_loss": 5.8}, final_train={"mlm": 6.1})
    card = default_model.bundle(run, tmp_path / "assets", curve=None, eval_dir=None).read_text("utf-8")
    assert "bag-of-words from [CLS] (no distillation); weights {'bow': 1.0, 'mlm': 0.1}, each" in card
    assert "distil'" not in card
    assert "| Held-out pages | 200 |" in card and "| MLM / BOW loss, held out | 6.000 / 5.800 |" in card
    # A figure the run did not record (the BOW loss of its last step) is left out, not printed as 0.
    assert "last training step" not in card
