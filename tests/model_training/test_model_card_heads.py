"""MODEL_CARD.md's heads after `htmllm heads train`: rewritten from htmllm.json, or said to be stale.

A published checkpoint's card (`make default-model` writes one) had gone on listing the heads it was
bundled with after `heads train` added or replaced some, while htmllm.json and /info listed the new
ones. The card's heads section is generated (between two comment lines; the bundled card's, written
before them, by its heading and table) and is rewritten; the rest, which a user may have edited by hand,
is kept; a card with no such section is left as it is, with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from model_training import default_model
from model_training.default_model import (
    CARD_FILE,
    HEADS_BEGIN,
    HEADS_END,
    heads_line,
    heads_section,
    update_card_heads,
)
from model_training.evaluation.derive import derive_tasks
from service.api.settings import default_model_path
from service.core.checkpoint import read_meta
from service.core.modeling import HeadSpec
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.evaluation.pagegen import write_corpus
from tests.model_training.evaluation.test_runner import fake_engine

SPAM = HeadSpec(
    name="spam", kind="classification", labels=["no", "yes"], hidden=8, metrics={"f1_macro": 0.75}
)


def _row(spec: HeadSpec) -> str:
    figures = default_model._format_metrics(spec.metrics)
    return f"| {spec.name} | {spec.kind} | {len(spec.labels) or '-'} | {figures} |"


def test_the_bundled_cards_section_written_before_the_markers_is_rewritten_and_the_rest_kept() -> None:
    bundle = default_model_path()
    text = (bundle / CARD_FILE).read_text(encoding="utf-8")
    before = read_meta(bundle).heads
    after = [*before, SPAM]
    updated = update_card_heads(text, before, after)
    assert updated is not None
    assert heads_line(after) in updated and heads_line(before) not in updated
    assert all(_row(spec) in updated for spec in after)
    assert updated.count(HEADS_BEGIN) == 1 and updated.count(HEADS_END) == 1
    # What lies outside the section (the card's hand edits included) is kept as it was.
    start, end = text.index(default_model.HEADS_HEADING), text.index("### Frozen-encoder evaluation")
    prefix = text[:start].replace(heads_line(before), heads_line(after))
    assert updated[: updated.index(HEADS_BEGIN)] == prefix
    assert updated[updated.index(HEADS_END) + len(HEADS_END) :].lstrip("\n") == text[end:]
    assert "trained on version 2" in updated
    # Written once with markers, the card is rewritten between them the next time.
    again = update_card_heads(updated, after, before)
    assert again is not None and _row(SPAM) not in again and heads_line(before) in again
    assert update_card_heads(again, before, before) == again


def test_a_card_with_windows_line_ends_keeps_them_and_its_heads_line_is_rewritten() -> None:
    """A card saved with CRLF line ends had kept its stale "- Heads:" line (its `\\r` failed the match)
    and got the new table in LF lines among CRLF ones."""
    bundle = default_model_path()
    text = (bundle / CARD_FILE).read_text(encoding="utf-8").replace("\n", "\r\n")
    before = read_meta(bundle).heads
    after = [*before, SPAM]
    updated = update_card_heads(text, before, after)
    assert updated is not None
    assert heads_line(after) + "\r\n" in updated and heads_line(before) not in updated
    assert "\n" not in updated.replace("\r\n", "")


def test_a_card_generated_without_heads_gets_them() -> None:
    """render_card writes the markers even with no head, for a later `heads train` to fill."""
    text = "\n".join(["# m", "", heads_line([]), "", *heads_section([]), "", "## Limits", ""])
    updated = update_card_heads(text, [], [SPAM])
    assert updated is not None
    assert heads_line([SPAM]) in updated and _row(SPAM) in updated
    assert updated.index(_row(SPAM)) < updated.index("## Limits")


@pytest.mark.parametrize(
    "text",
    [
        "# my model\n\nHeads: spam (f1 0.7).\n",  # written by hand
        f"# m\n\n{HEADS_BEGIN}\n### Task heads\n",  # its end marker lost: which lines are ours is a guess
        f"# m\n\n{default_model.HEADS_HEADING}\n\nA table we took out.\n",  # the table gone
    ],
)
def test_a_card_without_a_recognisable_section_is_not_rewritten(text: str) -> None:
    assert update_card_heads(text, [], [SPAM]) is None


@pytest.fixture
def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    args = ["heads", "train", "--checkpoint", str(ckpt), "--tasks", str(tmp_path / "tasks"), "--cache", ""]
    args += ["--hidden", "8", "--max-epochs", "2", "--patience", "1", "--folds", "3"]
    return ckpt, args


def test_heads_train_rewrites_the_cards_heads_from_htmllm_json(trained: tuple[Path, list[str]]) -> None:
    from service.cli import main

    ckpt, args = trained
    before = read_meta(ckpt).heads
    lines = ["# tiny", "", "- Encoder: hand-edited.", heads_line(before), "", *heads_section(before), ""]
    (ckpt / CARD_FILE).write_text("\n".join([*lines, "## Limits", "- Mine.", ""]), encoding="utf-8")
    assert main(args) == 0
    card = (ckpt / CARD_FILE).read_text(encoding="utf-8")
    after = read_meta(ckpt).heads
    assert [s.name for s in after] == ["page_type", "quality", "page_kind", "schema_type"]
    assert heads_line(after) in card and all(_row(spec) in card for spec in after)
    assert "- Encoder: hand-edited." in card and "- Mine." in card


def test_heads_train_says_a_card_it_cannot_rewrite_is_stale(
    trained: tuple[Path, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    from service.cli import main

    ckpt, args = trained
    text = "# tiny\n\nOur heads: page_type and quality.\n"
    (ckpt / CARD_FILE).write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="model_training.commands.heads"):
        assert main(args) == 0
    assert (ckpt / CARD_FILE).read_text(encoding="utf-8") == text
    warned = [r.getMessage() for r in caplog.records if CARD_FILE in r.getMessage()]
    assert len(warned) == 1 and "page_kind" in warned[0] and "by hand" in warned[0], warned
