"""Benchmark the Engine on CPU: torch vs onnxruntime vs a naive one-document-at-a-time loop, in one run.

    .venv/bin/python benchmarks/engine.py --corpus ../shared/corpus

The model is the `mini` preset with random weights (speed does not depend on the weights) and a WordPiece
tokenizer trained here on the pruned corpus (or `--tokenizer`), or a trained `--checkpoint`. Every path
does the same work per page (prune, tokenize the prefix that fills `--max-length` tokens, encoder
forward, pooling, heads):
- naive: a loop that prunes, tokenizes and runs the torch model on one page at a time (float32, and
  bfloat16 when that variant runs);
- engine/<variant>: every page submitted at once as its own `embed` call (as concurrent HTTP clients
  would), so the dynamic batcher forms the batches. Variants: torch (float32), onnx (float32 graph),
  onnx-int8 (the int8 graph), torch-bf16 (bfloat16 on CPU; worth it with AMX/AVX512-BF16).
The lower-precision variants are compared with float32 torch on every page: min and mean cosine of the
normalised embeddings, and the share of pages whose classification heads pick the same top label.
A model-only section times the runners on the same pre-tokenized, length-sorted batches, which
isolates the backend from pruning and tokenization; `torch-hf` there is the torch runner on transformers'
own encoder forward instead of service/core/encoder_forward.py's (banded local attention). Each figure
is docs/s and tokens/s (tokens the model saw), with ratios against the baselines measured in this run.

`--pass-cost` instead times the torch runner alone on padded batches of 4 to 4,096 tokens and fits a
pass's time as a fixed cost plus a cost per token (on relative errors): the fixed cost in tokens is what
the batcher weighs a pass against padding with (`service.engine.batcher.PASS_OVERHEAD_TOKENS`).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.options import run  # noqa: E402
from service.core.checkpoint import CheckpointMeta, read_meta, save_checkpoint  # noqa: E402
from service.core.modeling import PRESETS, HeadSpec, HtmlEncoderModel, TaskHead, build_config  # noqa: E402
from service.core.pages import iter_pages  # noqa: E402
from service.core.prune import PRUNE_VERSION, PruneError, prune_html  # noqa: E402
from service.core.tokenizer import HtmlTokenizer  # noqa: E402
from service.engine import BatchStats, Engine, EngineConfig, EngineObserver  # noqa: E402
from service.engine.batcher import form_batches  # noqa: E402
from service.engine.onnx_export import ensure_onnx  # noqa: E402
from service.engine.runners.onnx import OnnxRunner  # noqa: E402
from service.engine.runners.torch import TorchRunner, cpu_has_fast_bfloat16  # noqa: E402


def corpus_tokenizer(pages: list[bytes], *, vocab_size: int) -> HtmlTokenizer:
    """A tokenizer trained in the run on the pages the pruner accepts (speed does not need a better one)."""
    from model_training.tokenizer_training import train_tokenizer

    pruned = []
    for html in pages:
        try:
            pruned.append(prune_html(html))
        except PruneError:
            continue
    return train_tokenizer(pruned, vocab_size=vocab_size, min_frequency=2)


def build_checkpoint(path: Path, tokenizer: HtmlTokenizer, *, preset: str, max_length: int) -> Path:
    torch.manual_seed(0)
    config = build_config(preset, tokenizer, max_length=max_length)
    model = HtmlEncoderModel.from_config(config, attn_implementation="sdpa")
    for spec in (
        HeadSpec(name="page_type", kind="classification", labels=[f"c{i}" for i in range(8)], hidden=256),
        HeadSpec(name="quality", kind="regression", hidden=256),
    ):
        model.add_head(TaskHead(spec, model.embedding_dim))
    meta = CheckpointMeta(
        name=f"{preset}-random",
        pooling="cls",
        prune_version=PRUNE_VERSION,
        tokenizer_sha256=tokenizer.sha256,
        max_length=max_length,
        embedding_dim=model.embedding_dim,
        training={"note": "random weights, for speed benchmarks only"},
    )
    save_checkpoint(path, model.eval(), tokenizer, meta)
    return path


def naive_loop(pages: list[bytes], runner: TorchRunner, tokenizer: HtmlTokenizer, max_length: int) -> int:
    tokens = 0
    for html in pages:
        try:
            pruned = prune_html(html)
        except PruneError:
            continue
        # The engine's own bounded tokenization, so the two differ only in batching and overlap.
        ids = tokenizer.encode(pruned, max_length=max_length, count_all=False).ids
        runner.run(runner.prepare([ids]))
        tokens += len(ids)
    return tokens


async def engine_run(engine: Engine, pages: list[bytes]) -> int:
    async def one(html: bytes) -> int:
        try:
            (result,) = await engine.embed([html])
        except PruneError:
            return 0
        return result.tokens

    counts = await asyncio.gather(*(one(p) for p in pages))
    return sum(counts)


async def engine_outputs(engine: Engine, pages: list[bytes]) -> list[tuple[np.ndarray, dict[str, str]]]:
    """Normalised embedding and each classification head's top label, per page that prunes."""
    out = []
    for html in pages:
        try:
            (result,) = await engine.embed([html])
        except PruneError:
            continue
        top = {h: max(v, key=v.__getitem__) for h, v in result.scores.items() if isinstance(v, dict)}
        out.append((result.embedding, top))
    return out


# (documents, tokens each) of the passes `--pass-cost` times: 4 to 4,096 tokens, few and many documents.
PASS_SHAPES = [
    (1, 4), (1, 16), (1, 32), (1, 64), (1, 128), (1, 256), (2, 64), (4, 64), (8, 32),
    (8, 64), (16, 32), (16, 64), (4, 256), (32, 32), (64, 16), (16, 256), (64, 64), (32, 128),
]  # fmt: skip


def pass_cost(checkpoint: Path, threads: int, repeats: int) -> None:
    """Print each shape's best time and the least-squares fit seconds = fixed + per_token * tokens."""
    from service.core.checkpoint import load_checkpoint

    runner = TorchRunner(load_checkpoint(checkpoint).model, intra_op_threads=threads)
    vocab = runner.model.config.vocab_size
    generator = np.random.default_rng(0)
    shapes = [(b, n) for b, n in PASS_SHAPES if n <= runner.model.config.max_position_embeddings]
    prepared = {
        (b, n): runner.prepare([[2, *generator.integers(5, vocab, n - 2).tolist(), 3] for _ in range(b)])
        for b, n in shapes
    }
    for ready in prepared.values():  # warm-up: allocations, kernel choice
        runner.run(ready)
    best = dict.fromkeys(shapes, float("inf"))
    for _ in range(repeats):  # interleaved, so that load drifting on a shared machine hits every shape
        for shape, ready in prepared.items():
            started = time.perf_counter()
            runner.run(ready)
            best[shape] = min(best[shape], time.perf_counter() - started)
    for (b, n), took in best.items():
        print(f"  {b:3} x {n:4} = {b * n:5} tokens: {1000 * took:8.2f} ms")
    tokens = np.array([b * n for b, n in best], dtype=np.float64)
    times = np.array(list(best.values()))
    # Least squares on relative errors: the times span three orders of magnitude, and absolute errors
    # would let the 4,096-token passes (whose cost per token grows with the batch) set the fixed cost.
    weights = 1.0 / times
    design = np.vstack([np.ones_like(tokens), tokens]).T * weights[:, None]
    (fixed, per_token), *_ = np.linalg.lstsq(design, times * weights, rcond=None)
    print(
        f"fit: {1000 * fixed:.2f} ms per pass + {1e6 * per_token:.1f} us per token: "
        f"a pass costs what {fixed / per_token:.0f} tokens cost"
    )


class BatchCounter(EngineObserver):
    def __init__(self) -> None:
        self.batches = 0

    def batch_done(self, stats: BatchStats) -> None:
        self.batches += 1


# name -> (backend, dtype, onnx_quantize); the first is the reference the others are compared with.
VARIANTS: dict[str, tuple[str, str, str | None]] = {
    "torch": ("torch", "float32", None),
    "onnx": ("onnx", "float32", None),
    "onnx-int8": ("onnx", "float32", "int8"),
    "torch-bf16": ("torch", "bfloat16", None),
}


async def measure(
    checkpoint: Path,
    config: EngineConfig,
    pages: list[bytes],
    tokenizer: HtmlTokenizer,
    naive: dict[str, TorchRunner],
    runners: dict[str, TorchRunner | OnnxRunner],
    batches: list[list[list[int]]],
    args: argparse.Namespace,
) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, float, float]]]:
    """Best seconds and tokens per path over `args.repeats` interleaved rounds, and each variant's
    agreement with float32 torch: (min cosine, mean cosine, share of equal top labels)."""
    engines = {
        name: Engine.from_checkpoint(
            checkpoint,
            replace(config, backend=backend, dtype=dtype, onnx_quantize=quantize),
            observer=BatchCounter(),
        )
        for name, (backend, dtype, quantize) in VARIANTS.items()
        if name in args.variants
    }
    for engine in engines.values():
        await engine.start()
        await engine.warmup()
        await engine_run(engine, pages[:8])
    for runner in naive.values():
        naive_loop(pages[:4], runner, tokenizer, args.max_length)

    outputs = {name: await engine_outputs(engine, pages) for name, engine in engines.items()}
    reference = outputs["torch"]
    agreement: dict[str, tuple[float, float, float]] = {}
    for name, rows in outputs.items():
        cosines = [float(np.dot(a, b)) for (a, _), (b, _) in zip(rows, reference, strict=True)]
        labels = [ta == tb for (_, ta), (_, tb) in zip(rows, reference, strict=True)]
        agreement[name] = (min(cosines), sum(cosines) / len(cosines), sum(labels) / len(labels))

    best: dict[str, tuple[float, int]] = {}

    def keep(name: str, seconds: float, tokens: int) -> None:
        if name not in best or seconds < best[name][0]:
            best[name] = (seconds, tokens)

    for _ in range(args.repeats):
        for label, runner in naive.items():
            started = time.perf_counter()
            tokens = naive_loop(pages, runner, tokenizer, args.max_length)
            keep(label, time.perf_counter() - started, tokens)
        for name, engine in engines.items():
            started = time.perf_counter()
            tokens = await engine_run(engine, pages)
            keep(f"engine/{name}", time.perf_counter() - started, tokens)
        for name, model_runner in runners.items():
            prepared = [model_runner.prepare(b) for b in batches]
            started = time.perf_counter()
            for ready in prepared:
                model_runner.run(ready)
            keep(f"model: {name} runner", time.perf_counter() - started, sum(p.tokens for p in prepared))
        one = naive["naive loop"]
        started = time.perf_counter()
        for batch in batches:
            for ids in batch:
                one.run(one.prepare([ids]))
        keep(
            "model: torch runner, 1 doc per pass",
            time.perf_counter() - started,
            sum(len(ids) for batch in batches for ids in batch),
        )
    for engine in engines.values():
        await engine.stop()
        engine.close()
    return best, agreement


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus", help="page corpus")
    parser.add_argument("--limit", type=int, default=256, help="pages to embed")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="mini", help="model preset (random weights)"
    )
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="a trained checkpoint instead of random weights"
    )
    parser.add_argument("--max-length", type=int, default=512, help="tokens per document (truncation)")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="engine token budget per batch")
    parser.add_argument("--batch-size", type=int, default=32, help="engine documents per batch")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    parser.add_argument(
        "--preprocess-pool", choices=("thread", "process"), default="thread", help="the engine's workers"
    )
    parser.add_argument("--preprocess-workers", type=int, default=2, help="prune/tokenize workers")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per path (best is reported)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (default: train one)")
    parser.add_argument("--vocab-size", type=int, default=16384, help="vocabulary of the trained tokenizer")
    parser.add_argument(
        "--pass-cost",
        action="store_true",
        help="only time the torch runner on batches of 4 to 4,096 tokens and fit a pass's fixed cost",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"engine variants to run, of {','.join(VARIANTS)} (torch-bf16 also adds a bf16 naive loop)",
    )
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown or "torch" not in args.variants:
        parser.error(f"--variants must include torch and name only {list(VARIANTS)}")
    if args.checkpoint is not None:
        read_meta(args.checkpoint)  # a CheckpointError naming what is missing, before pages and threads

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    pages = [p.html for p in iter_pages(args.corpus, limit=args.limit)]
    machine = f"{platform.machine()} {platform.processor()}".strip()
    print(f"machine: {machine}, {threads} threads, torch {torch.__version__}")
    print(f"CPU multiplies bfloat16 natively (AMX/AVX512-BF16): {cpu_has_fast_bfloat16()}")

    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is not None:
            checkpoint = Path(tmp) / "ckpt"
            shutil.copytree(args.checkpoint, checkpoint, ignore=shutil.ignore_patterns("*.onnx"))
            tokenizer = HtmlTokenizer.from_file(checkpoint / "tokenizer.json")
            args.max_length = min(args.max_length, read_meta(checkpoint).max_length)
            print(f"checkpoint {args.checkpoint} (trained weights)")
        else:
            if args.tokenizer is not None:
                tokenizer = HtmlTokenizer.from_file(args.tokenizer)
            else:
                started = time.perf_counter()
                tokenizer = corpus_tokenizer(pages, vocab_size=args.vocab_size)
                seconds = time.perf_counter() - started
                print(f"trained a {tokenizer.vocab_size}-token tokenizer in {seconds:.1f}s")
            checkpoint = build_checkpoint(
                Path(tmp) / "ckpt", tokenizer, preset=args.preset, max_length=args.max_length
            )
            print(f"preset {args.preset}, random weights")
        if args.pass_cost:
            rounds = max(args.repeats, 5)
            print(f"pass cost, torch runner, {threads} threads, best of {rounds} interleaved rounds")
            pass_cost(checkpoint, threads, rounds)
            return 0
        print(f"{len(pages)} pages from {args.corpus}; max length {args.max_length}")
        started = time.perf_counter()
        graph = ensure_onnx(checkpoint)
        graphs = {"onnx": graph}
        if "onnx-int8" in args.variants:
            graphs["onnx-int8"] = ensure_onnx(checkpoint, quantize="int8")
        print(f"exported ONNX in {time.perf_counter() - started:.1f}s")

        from service.core.checkpoint import load_checkpoint

        ckpt = load_checkpoint(checkpoint)
        heads = list(ckpt.model.heads.keys())
        torch_runner = TorchRunner(ckpt.model, intra_op_threads=threads)
        naive: dict[str, TorchRunner] = {"naive loop": torch_runner}
        runners: dict[str, TorchRunner | OnnxRunner] = {"torch": torch_runner}
        # torch-hf: the same model on transformers' own encoder forward, for the gain of encoder_forward.py's
        runners["torch-hf"] = TorchRunner(ckpt.model, intra_op_threads=threads, fast_forward=False)
        for name, path in graphs.items():
            runners[name] = OnnxRunner(
                path, pad_id=tokenizer.special_ids.pad, head_names=heads, intra_op_threads=threads
            )
        if "torch-bf16" in args.variants:
            half = TorchRunner(load_checkpoint(checkpoint).model, dtype="bfloat16", intra_op_threads=threads)
            naive["naive loop, bf16"] = half
            runners["torch-bf16"] = half
        encoded = [
            tokenizer.encode(prune_html(h), max_length=args.max_length).ids for h in pages if _prunes(h)
        ]
        total_tokens = sum(len(ids) for ids in encoded)
        mean = total_tokens / len(encoded)
        print(f"{len(encoded)} pages prune cleanly; {mean:.0f} tokens per page on average")

        plan = form_batches(
            [len(ids) for ids in encoded],
            torch_runner.cost,
            max_tokens=args.batch_tokens,
            max_requests=args.batch_size,
        )
        batches_ids = [[encoded[i] for i in batch] for batch in plan]
        config = EngineConfig(
            max_length=args.max_length,
            max_batch_tokens=args.batch_tokens,
            max_batch_requests=args.batch_size,
            max_queue_documents=max(1024, len(pages)),
            intra_op_threads=threads,
            preprocess_pool=args.preprocess_pool,
            preprocess_workers=args.preprocess_workers,
        )
        # Rounds interleave the paths so load drifting on a shared machine hits them all alike.
        results, agreement = asyncio.run(
            measure(checkpoint, config, pages, tokenizer, naive, runners, batches_ids, args)
        )

        n = len(encoded)
        end_to_end = [(name, s, n, t) for name, (s, t) in results.items() if not name.startswith("model")]
        model_only = [(name, s, n, t) for name, (s, t) in results.items() if name.startswith("model")]
        print(f"\nend to end (prune + tokenize + model), best of {args.repeats} interleaved rounds")
        _table(end_to_end, baseline=0)
        rate = {name: n / s for name, (s, _) in results.items()}
        print(f"  engine/torch vs naive: {rate['engine/torch'] / rate['naive loop']:.2f}x  (target >= 2x)")
        if "naive loop, bf16" in rate:
            same = rate["engine/torch-bf16"] / rate["naive loop, bf16"]
            print(
                f"  engine/torch-bf16 vs naive bf16: {same:.2f}x;  vs naive float32: "
                f"{rate['engine/torch-bf16'] / rate['naive loop']:.2f}x"
            )
        for name in ("onnx", "onnx-int8", "torch-bf16"):
            if f"engine/{name}" in rate:
                print(
                    f"  engine/{name} vs engine/torch: {rate[f'engine/{name}'] / rate['engine/torch']:.2f}x"
                    + ("  (target >= 1.3x)" if name.startswith("onnx") else "")
                )
        print(f"\nmodel only (pre-tokenized; {len(plan)} length-sorted batches)")
        _table(model_only, baseline=0)
        print(f"\nagreement with engine/torch (float32), {n} pages: min cosine, mean cosine, same top label")
        for name, (low, avg, same_top) in agreement.items():
            print(f"  {name:12} {low:.6f}  {avg:.6f}  {same_top:.1%}")
    return 0


def _prunes(html: bytes) -> bool:
    try:
        prune_html(html)
    except PruneError:
        return False
    return True


def _table(rows: list[tuple[str, float, int, int]], *, baseline: int) -> None:
    base = rows[baseline][2] / rows[baseline][1]
    ratio = f"vs {rows[baseline][0].removeprefix('model: ')}"
    print(f"  {'path':38} {'seconds':>8} {'docs/s':>8} {'tokens/s':>9}  {ratio}")
    for name, seconds, docs, tokens in rows:
        rate = docs / seconds
        print(f"  {name:38} {seconds:8.2f} {rate:8.1f} {tokens / seconds:9.0f}  {rate / base:.2f}x")


if __name__ == "__main__":
    sys.exit(run(main))
