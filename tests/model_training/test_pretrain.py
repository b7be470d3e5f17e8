"""Pretraining end to end on CPU with the tiny preset: checkpoints, exact resume, schedule, config."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from model_training.batches import collate, load_splits
from model_training.data import HELDOUT, TRAIN, Document, domain_of, write_manifest, write_shards
from model_training.default_model import bundle
from model_training.heldout_eval import evaluate
from model_training.objectives import (
    IGNORE_INDEX,
    MaskingConfig,
    bow_counts,
    bow_loss,
    linear_cross_entropy,
    mask_tokens,
    weighted_contrastive_distillation,
)
from model_training.pretrain import train, trapezoid_lr
from model_training.pretraining_model import PretrainingModel, all_special_ids
from model_training.teacher import TeacherMeta, write_teacher
from model_training.tokenizer_training import train_tokenizer
from model_training.train_config import TrainConfig, load_config
from model_training.train_logs import read_metrics, truncate_metrics
from model_training.training_checkpoints import STATE_FILE, latest_checkpoint
from service.core.checkpoint import load_checkpoint
from service.core.errors import HtmllmError
from service.core.modeling import HtmlEncoderModel, build_config
from service.core.tokenizer import HtmlTokenizer
from service.engine import Engine, EngineConfig
from tests.factories.tokenizer import build_tiny_tokenizer, generate_pruned_pages

TEACHER_DIM = 12


def _five(tokenizer: HtmlTokenizer) -> list[int]:
    """The five named special ids ([PAD] [UNK] [CLS] [SEP] [MASK])."""
    special = tokenizer.special_ids
    return [special.pad, special.unk, special.cls, special.sep, special.mask]


def _build_shards(root: Path, *, documents: int = 40) -> tuple[Path, list[Document], HtmlTokenizer]:
    """Shards of generated pruned pages in `root/shards`, every tenth page held out: no teacher."""
    tokenizer = build_tiny_tokenizer()
    pages = generate_pruned_pages(documents, seed=11)
    docs: list[Document] = []
    for i, page in enumerate(pages):
        encoding = tokenizer.encode(page, max_length=96)
        url = f"https://site{i % 10}.example/page/{i}"
        docs.append(
            Document(
                id=f"doc{i}",
                url=url,
                domain=domain_of(url),
                cluster=None,
                input_ids=encoding.ids,
                length=len(encoding.ids),
                full_length=encoding.full_length,
                truncated=encoding.truncated,
                text_length=len(encoding.ids) - 2,
                pruned=page,
                split=HELDOUT if i % 10 == 0 else TRAIN,
            )
        )
    shards = root / "shards"
    entries = write_shards(docs, shards, shard_size=16)
    write_manifest(shards, tokenizer, entries, prune_version="test-prune", max_length=96)
    return shards, docs, tokenizer


def _build_run_inputs(root: Path, *, documents: int = 40) -> tuple[Path, Path]:
    """Shards of generated pruned pages and teacher vectors that depend on each page's words.

    The teacher is a fixed random projection of the page's bag of tokens: pages sharing vocabulary get
    similar vectors, so distillation has something learnable, without loading an embedding model.
    """
    shards, docs, tokenizer = _build_shards(root, documents=documents)
    projection = np.random.default_rng(0).standard_normal((tokenizer.vocab_size, TEACHER_DIM))
    arrays = []
    for start in range(0, len(docs), 16):
        rows = docs[start : start + 16]
        counts = np.zeros((len(rows), tokenizer.vocab_size))
        for r, doc in enumerate(rows):
            np.add.at(counts[r], doc.input_ids[1:-1], 1.0)
        vectors = counts @ projection
        arrays.append((vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32))
    teacher = root / "teacher"
    meta = TeacherMeta(
        model="bag-of-tokens projection",
        model_path="",
        dim=TEACHER_DIM,
        view="pruned",
        max_seq_length=96,
        normalized=True,
        shards_tokenizer_sha256=tokenizer.sha256,
    )
    write_teacher(teacher, shards, arrays, meta)
    return shards, teacher


def _config(root: Path, out: str, **overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "shards": str(root / "shards"),
        "teacher": str(root / "teacher"),
        "out": str(root / out),
        "name": "htmllm-test",
        "preset": "tiny",
        "max_length": 64,
        "batch_size": 4,
        "grad_accum": 2,
        "max_steps": 6,
        "lr": 3e-3,
        "distil_rank": 8,
        "log_every": 1,
        "eval_every": 3,
        "checkpoint_every": 0,
        "device": "cpu",
        "progress": False,
        "tensorboard": False,
        "seed": 5,
    }
    values.update(overrides)
    return TrainConfig.from_dict(values)


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pretrain")
    _build_run_inputs(root)
    return root


def _train_losses(out: Path) -> list[tuple[int, float, float, float]]:
    return [
        (r["step"], r["mlm"], r["bow"], r["distil"])
        for r in read_metrics(out / "metrics.jsonl")
        if r["split"] == "train"
    ]


@pytest.mark.slow
async def test_three_step_tiny_run_writes_a_checkpoint_the_service_loads(run_inputs: Path) -> None:
    config = _config(
        run_inputs, "pretrain", max_steps=3, tensorboard=True, checkpoint_every=2, export_dtype="float16"
    )
    result = train(config)
    assert result.steps == 3
    assert result.model_dir is not None
    from safetensors import safe_open

    with safe_open(str(result.model_dir / "model.safetensors"), "pt") as weights:
        assert all(weights.get_tensor(k).dtype == torch.float16 for k in weights.keys())  # noqa: SIM118
    checkpoint = load_checkpoint(result.model_dir)
    assert checkpoint.meta.name == "htmllm-test"
    assert checkpoint.meta.training["config"]["preset"] == "tiny"
    assert checkpoint.meta.training["steps"] == 3
    assert checkpoint.meta.prune_version == "test-prune"  # the shards' provenance, not a guess
    heldout = checkpoint.meta.training["heldout"]
    assert -1.0 <= heldout["cosine"] <= 1.0 and 0.0 <= heldout["top1"] <= 1.0

    # The served model embeds a page (the pretraining-only heads are gone from the checkpoint).
    page = generate_pruned_pages(1, seed=99)[0]
    ids = torch.tensor([checkpoint.tokenizer.encode(page, max_length=64).ids])
    with torch.no_grad():
        embedding = checkpoint.model.embed(ids, torch.ones_like(ids))
    assert embedding.shape == (1, 32)
    assert torch.isfinite(embedding).all()

    # And the service's Engine serves it: raw HTML in, a normalised embedding out.
    raw = "<html><head><title>Weather</title></head><body><p>Rain in <b>Prague</b> today.</p></body></html>"
    async with Engine.from_checkpoint(result.model_dir, EngineConfig(preprocess_workers=1)) as engine:
        (served,) = await engine.embed([raw])
    assert served.embedding.shape == (32,)
    assert np.linalg.norm(served.embedding) == pytest.approx(1.0, abs=1e-4)
    assert served.tokens > 5

    losses = _train_losses(Path(config.out))
    assert [step for step, *_ in losses] == [1, 2, 3]
    assert all(np.isfinite(v) for _, *values in losses for v in values)
    assert latest_checkpoint(config.out) is not None
    assert (Path(config.out) / "checkpoints" / "step-00000002" / STATE_FILE).is_file()
    assert any((Path(config.out) / "tensorboard").iterdir())
    assert (Path(config.out) / "training_curve.png").stat().st_size > 1000

    # The default-model bundler turns the run into a served asset with a model card.
    card = bundle(run_inputs, run_inputs / "bundle", curve=run_inputs / "curve.png", eval_dir=None)
    text = card.read_text(encoding="utf-8")
    assert f"{heldout['cosine']:.3f}" in text and "htmllm-test" in text and "demo-quality" in text
    assert load_checkpoint(run_inputs / "bundle").meta.training["steps"] == 3
    assert (run_inputs / "curve.png").is_file()


@pytest.mark.slow
def test_resume_continues_the_same_steps_and_loss_curve(run_inputs: Path) -> None:
    whole = train(_config(run_inputs, "whole"))
    first = train(_config(run_inputs, "split"), stop_at_step=3)  # the "interruption"
    assert first.steps == 3 and first.model_dir is None  # interrupted: no served model yet
    resumed = train(_config(run_inputs, "split"))
    assert whole.steps == resumed.steps == 6

    uninterrupted = _train_losses(run_inputs / "whole")
    interrupted = _train_losses(run_inputs / "split")
    assert [s for s, *_ in interrupted] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(uninterrupted, interrupted, strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)
    assert whole.model_dir is not None and resumed.model_dir is not None
    a = load_checkpoint(whole.model_dir).model.encoder.state_dict()
    b = load_checkpoint(resumed.model_dir).model.encoder.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.slow
def test_losses_fall_on_a_small_corpus(run_inputs: Path) -> None:
    config = _config(
        run_inputs, "falling", max_steps=24, grad_accum=1, eval_every=0, random_coefficients=False, lr=5e-3
    )
    train(config)
    losses = np.array([values for _, *values in _train_losses(Path(config.out))])  # (24, 3)
    start, end = losses[:5].mean(axis=0), losses[-5:].mean(axis=0)
    for name, before, after in zip(("mlm", "bow", "distil"), start, end, strict=True):
        assert after < before * 0.95, f"{name} did not fall: {before:.3f} -> {after:.3f}"


def _torchrun_env(rank: int, world: int, port: int) -> None:
    """What torchrun sets for each process."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )


def _ddp_train(rank: int, world: int, port: int, root: str, out: Any) -> None:
    _torchrun_env(rank, world, port)
    result = train(_config(Path(root), "ddp", max_steps=2, grad_accum=1, eval_every=0, threads=1))
    out[rank] = result.steps


@pytest.mark.slow
def test_ddp_training_on_two_cpu_processes(run_inputs: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    out = mp.Manager().dict()
    mp.spawn(_ddp_train, args=(2, port, str(run_inputs), out), nprocs=2, join=True)
    assert dict(out) == {0: 2, 1: 2}
    checkpoint = load_checkpoint(run_inputs / "ddp" / "model")
    assert checkpoint.meta.training["world_size"] == 2
    assert [s for s, *_ in _train_losses(run_inputs / "ddp")] == [1, 2]  # rank 0 alone logs


def test_trapezoid_schedule_warms_up_holds_and_cools_down() -> None:
    lrs = [trapezoid_lr(s, 100, peak=1.0, warmup_frac=0.1, cooldown_frac=0.2) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0)
    assert all(lr == 1.0 for lr in lrs[10:80])
    assert all(a > b for a, b in itertools.pairwise(lrs[80:]))
    assert 0 < lrs[-1] < 0.1


def test_trapezoid_schedule_does_not_round_float_noise_up() -> None:
    # 100 * 0.07 is 7.000000000000001: a bare ceil gave 8 warm-up steps.
    lrs = [trapezoid_lr(s, 100, peak=1.0, warmup_frac=0.07, cooldown_frac=0.07) for s in range(100)]
    assert lrs[5] < 1.0 and lrs[6] == 1.0
    assert lrs[92] == 1.0 and lrs[93] < 1.0  # seven cool-down steps, not eight


def _pretraining_model(tokenizer: HtmlTokenizer, **kwargs: Any) -> PretrainingModel:
    torch.manual_seed(0)
    model = HtmlEncoderModel.from_config(build_config("tiny", tokenizer, max_length=64))
    return PretrainingModel(
        model, tokenizer.special_ids, teacher_dim=TEACHER_DIM, rank=4, temperature=0.1, **kwargs
    )


def test_pretraining_losses_are_float32_under_bf16_autocast() -> None:
    # The training loop and `evaluate` run the model under autocast (bf16 on CUDA, and on CPU with
    # precision = "bf16"); the losses inside must still be computed in float32.
    tokenizer = build_tiny_tokenizer()
    pretraining = _pretraining_model(tokenizer)
    pretraining.eval()  # no dropout: the reference pass below sees the same hidden states
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, tokenizer.vocab_size, (4, 24), generator=generator)
    ids[:, 0], ids[:, -1] = tokenizer.special_ids.cls, tokenizer.special_ids.sep
    mask = torch.ones_like(ids)
    masked, labels = mask_tokens(
        ids,
        mask,
        mask_id=tokenizer.special_ids.mask,
        special_ids=_five(tokenizer),
        vocab_size=tokenizer.vocab_size,
        generator=generator,
    )
    teacher = torch.randn(4, TEACHER_DIM, generator=generator)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        losses = pretraining(ids, mask, masked, labels, teacher, gather=False)
        hidden = pretraining.model.encoder(input_ids=masked, attention_mask=mask).last_hidden_state
        student = pretraining.distil_head(pretraining.model.pool(hidden, mask))
        selected = labels != IGNORE_INDEX
        transformed = pretraining.mlm_head(hidden[selected])
    # The same model outputs, with the losses computed outside autocast.
    weight = pretraining.model.encoder.embeddings.tok_embeddings.weight
    counts = bow_counts(
        ids,
        mask,
        vocab_size=tokenizer.vocab_size,
        special_ids=_five(tokenizer),
    )
    with torch.no_grad():
        expected = {
            "mlm": linear_cross_entropy(
                transformed, weight, labels[selected], bias=pretraining.mlm_head.bias
            ),
            "bow": bow_loss(hidden[:, 0], weight, counts),
            "distil": weighted_contrastive_distillation(student, teacher, temperature=0.1, gather=False),
        }
    for name, value in expected.items():
        assert losses[name].dtype == torch.float32, name
        assert losses[name].item() == pytest.approx(value.item(), rel=1e-6), name


def test_mask_replacements_never_draw_unused_special_tokens() -> None:
    # A small corpus pads the vocabulary with [unusedN] special tokens; they must not be MLM targets'
    # random replacements (a quarter of the replacements were [unusedN] on such a vocabulary).
    texts = [f"<p>Rain in Prague {i} today</p><div>sun {i % 7}</div>" for i in range(50)]
    tokenizer = train_tokenizer(texts, vocab_size=256)
    added = tokenizer.backend.get_added_tokens_decoder()
    unused = {i for i, token in added.items() if token.special and token.content.startswith("[unused")}
    assert len(unused) > 10  # the premise: this vocabulary is padded
    assert unused <= set(all_special_ids(tokenizer))
    pretraining = _pretraining_model(tokenizer, special_ids=all_special_ids(tokenizer))
    ids = torch.tensor([tokenizer.encode(texts[0]).ids] * 400)
    mask = torch.ones_like(ids)
    masked, labels = pretraining.mask(
        ids, mask, generator=torch.Generator().manual_seed(0), config=MaskingConfig()
    )
    replaced = (labels != IGNORE_INDEX) & (masked != tokenizer.special_ids.mask) & (masked != ids)
    assert int(replaced.sum()) > 100
    assert not torch.isin(masked[replaced], torch.tensor(sorted(unused))).any()
    assert not torch.isin(masked, torch.tensor(sorted(unused))).any()


def test_mlm_head_gets_gradients_when_nothing_is_masked() -> None:
    # DDP (find_unused_parameters=False) fails on the step after one where a parameter got no gradient.
    tokenizer = build_tiny_tokenizer()
    pretraining = _pretraining_model(tokenizer)
    ids = torch.randint(10, tokenizer.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    labels = torch.full_like(ids, IGNORE_INDEX)  # nothing masked
    losses = pretraining(ids, mask, ids.clone(), labels, torch.randn(2, TEACHER_DIM), gather=False)
    sum(losses.values()).backward()
    assert losses["mlm"].item() == 0.0
    missing = [name for name, param in pretraining.named_parameters() if param.grad is None]
    assert missing == []


def test_evaluate_reports_bow_and_distillation_on_clean_input(run_inputs: Path) -> None:
    # The docs (and the model card) say held-out figures use clean input; BOW and distillation used to
    # come from the masked pass.
    config = _config(run_inputs, "eval-clean", eval_batch_size=64)
    tokenizer = HtmlTokenizer.from_file(run_inputs / "shards" / "tokenizer.json")
    train_data, heldout, _ = load_splits(config.shards, config.teacher)
    pretraining = _pretraining_model(tokenizer)
    result = evaluate(
        pretraining,
        heldout,
        config=config,
        device=torch.device("cpu"),
        train_centroid=train_data.teacher.mean(0),
    )
    assert pretraining.training  # evaluate restores the mode it found
    pretraining.eval()
    special = tokenizer.special_ids
    ids, mask = collate(heldout.ids, max_length=config.max_length, pad_id=special.pad, sep_id=special.sep)
    with torch.no_grad():
        hidden = pretraining.model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        weight = pretraining.model.encoder.embeddings.tok_embeddings.weight
        counts = bow_counts(
            ids,
            mask,
            vocab_size=weight.shape[0],
            special_ids=_five(tokenizer),
        )
        student = pretraining.distil_head(pretraining.model.pool(hidden, mask))
        teacher = torch.from_numpy(heldout.teacher)
        clean_bow = bow_loss(hidden[:, 0], weight, counts).item()
        clean_distil = weighted_contrastive_distillation(
            student, teacher, temperature=0.1, gather=False
        ).item()
    assert len(heldout.ids) <= config.eval_batch_size  # one batch: the figures are these numbers
    assert result["bow_loss"] == pytest.approx(clean_bow, rel=1e-5)
    assert result["distil_loss"] == pytest.approx(clean_distil, rel=1e-5)
    assert result["mlm_loss"] > 0  # MLM still needs the masked input


def test_config_from_toml_with_tables_and_overrides(tmp_path: Path) -> None:
    file = tmp_path / "run.toml"
    file.write_text(
        '[data]\nshards = "s"\nteacher = "t"\n[optim]\nlr = 2.5e-5\nbatch_size = 8\n'
        "[loss_weights]\nmlm = 0.5\n",
        encoding="utf-8",
    )
    config = load_config(file, {"batch_size": 2, "epochs": None})
    assert (config.shards, config.lr, config.batch_size, config.epochs) == ("s", 2.5e-5, 2, 1.0)
    assert config.loss_weights == {"mlm": 0.5, "bow": 1.0, "distil": 1.0}
    file.write_text("[optim]\nlearning_rate = 1\n", encoding="utf-8")
    with pytest.raises(HtmllmError, match="unknown keys"):
        load_config(file)
    with pytest.raises(HtmllmError):
        load_config(None, {"warmup_frac": 0.9, "cooldown_frac": 0.2})


def test_the_bundled_configs_parse() -> None:
    configs = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.toml"))
    assert configs, "configs/*.toml are missing"
    for file in configs:
        config = load_config(file)
        assert config.preset in ("tiny", "mini", "small", "base"), file


def test_training_refuses_missing_teacher(tmp_path: Path) -> None:
    _build_run_inputs(tmp_path, documents=12)
    (tmp_path / "teacher" / "teacher.json").unlink()
    with pytest.raises(HtmllmError, match="teacher"):
        train(_config(tmp_path, "missing"))


def test_config_refuses_nonsense_values_with_typed_errors() -> None:
    cases: dict[str, object] = {
        "preset": "huge",  # used to surface as a ValueError traceback after the shards were loaded
        "pooling": "max",
        "attn_implementation": "bogus",
        "lr": float("inf"),  # used to train silently to NaN weights
        "temperature": 0.0,  # used to train with NaN distillation losses
        "mask_prob": 1.5,
        "keep_checkpoints": 0,  # used to delete the checkpoint `latest` names: resume started over
        "checkpoint_every": -5,
        "eval_every": -1,
        "seed": -1,  # numpy refuses negative seeds: a crash at the first batch
        "batch_size": 2.5,  # an int key given a float used to fail deep in the data order
        "max_steps": True,
        "beta1": 1.5,
        "weight_decay": -0.1,
        "loss_weights": {"mlm": -1.0},
        "max_length": 4,
        "tensorboard": "yes",
    }
    for key, value in cases.items():
        with pytest.raises(HtmllmError, match=f"config: {key}"):
            TrainConfig.from_dict({key: value})
    with pytest.raises(HtmllmError, match="all zero"):
        TrainConfig.from_dict({"loss_weights": {"mlm": 0, "bow": 0, "distil": 0}})
    config = TrainConfig.from_dict({"lr": 1, "epochs": 2})  # TOML integers where floats are meant
    assert isinstance(config.lr, float) and config.lr == 1.0 and config.epochs == 2.0


def test_a_nan_warmup_or_cooldown_fraction_is_refused_with_the_config(tmp_path: Path) -> None:
    """nan compared false with 0 and 1 and passed; the first step's schedule then raised ValueError
    (cannot convert float NaN to integer), after the shards, teacher and model were loaded."""
    file = tmp_path / "run.toml"
    for key in ("warmup_frac", "cooldown_frac"):
        file.write_text(f"[optim]\n{key} = nan\n", encoding="utf-8")  # valid TOML
        with pytest.raises(HtmllmError, match=r"config: warmup_frac and cooldown_frac must be finite.* nan"):
            load_config(file)


def test_train_command_reports_config_errors_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    config = tmp_path / "run.toml"
    config.write_text('[model]\npreset = "huge"\n', encoding="utf-8")
    assert main(["train", "--config", str(config)]) == 1
    assert "preset must be one of" in capsys.readouterr().err
    assert main(["train", "--lr", "nan", "--out", str(tmp_path / "run")]) == 1
    assert "lr must be a finite positive number" in capsys.readouterr().err
    assert main(["train", "--stop-at-step", "0", "--out", str(tmp_path / "run")]) == 1
    assert "stop_at_step must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_torn_metrics_line_from_a_killed_session_does_not_stop_the_resume(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "split": "train", "mlm": 1.0 / s}) for s in (1, 2, 3)]
    metrics.write_text("\n".join(lines) + '\n{"step": 4, "split": "tr', encoding="utf-8")  # kill -9
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3]
    truncate_metrics(metrics, 2)
    assert metrics.read_text(encoding="utf-8") == lines[0] + "\n" + lines[1] + "\n"


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_model(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="model_training.pretrain"):
        train(_config(run_inputs, "changed", max_steps=4, eval_every=0, max_length=128), stop_at_step=1)
    # The shards were cut to 96 tokens: a model served at 128 never saw positions 96..127 in training.
    assert "longer than the 96 tokens the shards were cut to" in caplog.text
    # A different preset used to fail with a load_state_dict RuntimeError traceback.
    with pytest.raises(HtmllmError, match="preset 'tiny' -> 'mini'"):
        train(_config(run_inputs, "changed", max_steps=4, eval_every=0, max_length=128, preset="mini"))


@pytest.mark.slow
def test_a_resume_with_new_loss_settings_trains_with_them(
    run_inputs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The saved aggregator used to override the new weights and flag, while htmllm.json recorded the new
    # config as the one trained with.
    common: dict[str, object] = {"max_steps": 4, "eval_every": 0}
    train(_config(run_inputs, "new-losses", **common), stop_at_step=2)
    new: dict[str, object] = {
        "random_coefficients": False,
        "loss_weights": {"mlm": 0.0, "bow": 1.0, "distil": 0.5},
    }
    with caplog.at_level("WARNING", logger="model_training.training_checkpoints"):
        result = train(_config(run_inputs, "new-losses", **common, **new))
    records = [r for r in read_metrics(run_inputs / "new-losses" / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r[f"u_{k}"] == 1.0 for r in records[2:] for k in ("mlm", "bow", "distil"))
    assert any(r["u_mlm"] != 1.0 for r in records[:2])
    state = torch.load(
        run_inputs / "new-losses" / "checkpoints" / "step-00000004" / STATE_FILE, weights_only=True
    )
    assert state["aggregator"]["weights"] == {"mlm": 0.0, "bow": 1.0, "distil": 0.5}
    assert state["aggregator"]["random_coefficients"] is False
    assert result.model_dir is not None
    recorded = load_checkpoint(result.model_dir).meta.training["config"]
    assert recorded["loss_weights"] == state["aggregator"]["weights"]
    assert recorded["random_coefficients"] is False
    # Said, since the steps before the resume were trained otherwise.
    assert "changed loss_weights" in caplog.text and "random_coefficients True -> False" in caplog.text


def _ddp_resume(rank: int, world: int, ports: list[int], root: str) -> None:
    # A port of its own for each run's rendezvous: reusing one, a rank could reach the store of the run
    # before while rank 0 was tearing it down, and wait forever (a CI run hung here).
    common: dict[str, object] = {"max_steps": 4, "grad_accum": 1, "eval_every": 0, "threads": 1}
    _torchrun_env(rank, world, ports[0])
    train(_config(Path(root), "ddp-whole", **common))
    _torchrun_env(rank, world, ports[1])
    train(_config(Path(root), "ddp-split", **common), stop_at_step=2)
    _torchrun_env(rank, world, ports[2])
    train(_config(Path(root), "ddp-split", **common))


@pytest.mark.slow
def test_ddp_resume_gives_every_rank_its_own_generators_back(run_inputs: Path) -> None:
    # Each rank masks its own documents with its own generator. Rank 0 alone writes the checkpoint,
    # and a resume used to give every rank rank 0's generators: rank 1's masks changed, and through
    # the all-reduced gradients so did rank 0's losses from the step after the resume on.
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(3)]
        for sock in sockets:  # bound together: three different ports
            sock.bind(("127.0.0.1", 0))
        ports = [int(sock.getsockname()[1]) for sock in sockets]
    mp.spawn(_ddp_resume, args=(2, ports, str(run_inputs)), nprocs=2, join=True)
    whole, split = _train_losses(run_inputs / "ddp-whole"), _train_losses(run_inputs / "ddp-split")
    assert [s for s, *_ in split] == [1, 2, 3, 4]
    for a, b in zip(whole, split, strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)


@pytest.mark.slow
def test_a_session_killed_mid_run_resumes_from_its_last_checkpoint(run_inputs: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    common: dict[str, object] = {"checkpoint_every": 2, "eval_every": 0, "tensorboard": True}
    train(_config(run_inputs, "unkilled", **common))
    train(_config(run_inputs, "killed", **common), stop_at_step=4)
    # What `kill -9` during step 4's checkpoint leaves: steps 3 and 4 logged (the last line torn),
    # step 4's directory not yet renamed into place, `latest` still naming step 2.
    out = run_inputs / "killed"
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    (out / "checkpoints" / "latest").write_text("step-00000002\n", encoding="utf-8")
    with (out / "metrics.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"step": 5, "split": "train", "mlm": 7.')
    resumed = train(_config(run_inputs, "killed", **common))
    assert resumed.steps == 6 and resumed.model_dir is not None
    expected = _train_losses(run_inputs / "unkilled")
    got = _train_losses(out)
    assert [s for s, *_ in got] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(expected, got, strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)
    # TensorBoard shows one value per step: the killed session's steps 3 and 4 are purged.
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    steps = [event.step for event in events.Scalars("train/mlm")]
    assert steps == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_running_a_finished_run_again_keeps_the_heads_trained_into_its_model(run_inputs: Path) -> None:
    from service.core.checkpoint import save_heads
    from service.core.modeling import HeadSpec, TaskHead

    config = _config(run_inputs, "finished", max_steps=2, eval_every=0)
    model_dir = train(config).model_dir
    assert model_dir is not None
    spec = HeadSpec(name="kind", kind="classification", labels=["a", "b"], hidden=4)
    save_heads(model_dir, {"kind": (spec, TaskHead(spec, 32))})  # what `htmllm heads train` does
    weights = (model_dir / "model.safetensors").read_bytes()
    # The same command again (a retrying scheduler, `make` run twice) used to re-export model/ and drop
    # the heads from its htmllm.json.
    again = train(config)
    assert again.model_dir == model_dir and again.steps == 2 and again.summary["steps"] == 2
    assert [h.name for h in load_checkpoint(model_dir).meta.heads] == ["kind"]
    assert (model_dir / "model.safetensors").read_bytes() == weights
    # Training on past the old end replaces model/ as a whole: the new encoder, no stale heads.
    longer = train(_config(run_inputs, "finished", max_steps=3, eval_every=0))
    assert longer.steps == 3 and load_checkpoint(model_dir).meta.heads == []
    assert not (model_dir / "heads" / "kind.safetensors").exists()
    assert sorted(p.name for p in (run_inputs / "finished").iterdir() if p.name.startswith("model")) == [
        "model"
    ]


@pytest.mark.slow
def test_starting_over_discards_the_earlier_runs_checkpoints(run_inputs: Path) -> None:
    config = _config(run_inputs, "over", max_steps=4, eval_every=0, checkpoint_every=2, keep_checkpoints=1)
    train(config)
    train(config, stop_at_step=2, resume=False)  # --no-resume, interrupted at step 2
    # The earlier run's step 4 used to survive as the "newest": keep_checkpoints deleted the new run's
    # step 2 instead, and the next resume started from scratch.
    found = latest_checkpoint(config.out)
    assert found is not None and found.name == "step-00000002"
    assert sorted(p.name for p in (Path(config.out) / "checkpoints").glob("step-*")) == ["step-00000002"]
