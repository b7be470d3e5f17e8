#!/usr/bin/env bash
# GPU benchmark of the torch runner: the `base` preset (22 layers, hidden 768, random weights) in bfloat16
# on documents of exactly 512, 2048 and 8192 tokens; docs/s, tokens/s and model FLOP utilisation (MFU),
# SDPA with padded batches through the runner's own encoder forward (banded local attention) and through
# transformers' forward, packed batches through torch's own FlashAttention-2 varlen kernel (`varlen`,
# torch >= 2.10), and through the flash-attn package (when installed). Then a profile of one pass at
# 2048 tokens per mode (the 15 costliest GPU kernels; PROFILE=0 skips it), to $OUT/gpu_profile.txt.
#
#   bash benchmarks/gpu_engine.sh            # from the repository root, on a CUDA machine
#
# On a bare GPU machine without this repository's pins, fetch wheels here with benchmarks/gpu_wheels.sh,
# carry .whl/ (and .corpus/) and run benchmarks/gpu_device_run.sh there (it installs them and runs this script).
# flash-attn has no binary wheel on PyPI, so there it is SDPA only.
# Budget: well under 5 minutes (about 6 s of timed work per configuration, 12 to 16 in all). Also runs the GPU
# tests first (tests/engine/test_gpu.py): a failure is printed loudly and sets the exit status, but the
# figures are measured anyway (one device call is all there may be). $OUT/gpu_engine.json is rewritten
# after every row, so a call stopped at its time limit keeps what it measured; at the middle length the
# rows of our eager forwards also hold the rotary's share of a pass (CUDA events around apply_rotary).
# Environment: PYTHON (default .venv/bin/python, else python3), PEAK_TFLOPS to override the bf16 dense
# peak used for MFU (default from the device name: H100/H200 989, A100 312, L4 121, A10 125),
# SECONDS_PER_CONFIG (default 6), COMPILE=0 (skips the compiled mode; with DRY_RUN=1, COMPILE=1 checks its
# capture with aot_eager and prints dynamo's graph count and breaks), PROFILE=0 (skips the profiles),
# OUT (a directory for gpu_engine.json and gpu_profile.txt, optional). DRY_RUN=1 checks the
# script itself on a CPU (tiny preset, short documents, float32; the figures mean nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
tests_failed=0
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}"

if [ -z "${DRY_RUN:-}" ]; then
"$PYTHON" - <<'EOF'
import torch
assert torch.cuda.is_available(), "no CUDA device: this benchmark needs a GPU"
print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
EOF
# A failing test is reported, not fatal: device time is scarce and each mode below stops on its own
# error; the exit status still says that the tests failed. A test that hangs stops at 120 s (the
# project's 600 s would take the device call's whole limit before any figure is measured).
"$PYTHON" -m pytest -q -p no:cacheprovider -o timeout=120 tests/engine/test_gpu.py \
  || { echo "GPU TESTS FAILED: the figures below are measured anyway"; tests_failed=1; }
fi

"$PYTHON" - <<'EOF'
import json
import os
import time

import torch
from transformers import ModernBertConfig

import service.core.encoder_forward as encoder_forward
from service.core.encoder_forward import torch_varlen_attention
from service.core.modeling import PRESETS, HeadSpec, HtmlEncoderModel, TaskHead
from service.engine.runners.torch import TorchRunner, flash_attention_available

DRY = bool(os.environ.get("DRY_RUN"))
LENGTHS = (64, 256) if DRY else (512, 2048, 8192)
TOKENS_PER_BATCH = 1024 if DRY else 65536  # 128 x 512, 32 x 2048, 8 x 8192
MIXED = (16, 200) if DRY else (64, 2048)  # a batch of documents of uniformly drawn lengths in this range
SECONDS = 0.5 if DRY else float(os.environ.get("SECONDS_PER_CONFIG", "6"))
PRESET = "tiny" if DRY else "base"
DEVICE, DTYPE = ("cpu", "float32") if DRY else ("cuda", "bfloat16")
VOCAB = 50368


def peak_tflops() -> float:
    if DRY:
        return 1.0
    if "PEAK_TFLOPS" in os.environ:
        return float(os.environ["PEAK_TFLOPS"])
    name = torch.cuda.get_device_name(0)
    for key, value in (("H200", 989.0), ("H100", 989.0), ("A100", 312.0), ("L40", 181.0), ("L4", 121.0), ("A10", 125.0)):
        if key in name:
            return value
    raise SystemExit(f"unknown GPU {name!r}: set PEAK_TFLOPS (bf16 dense) for the MFU column")


def build(attention: str, *, fast_forward: bool = True, compile_backend: str | None = None) -> TorchRunner:
    torch.manual_seed(0)
    config = ModernBertConfig(
        **{**PRESETS[PRESET], "max_position_embeddings": max(LENGTHS)},
        vocab_size=VOCAB, pad_token_id=0, unk_token_id=1, cls_token_id=2, sep_token_id=3, mask_token_id=4,
        bos_token_id=2, eos_token_id=3,
    )
    model = HtmlEncoderModel.from_config(config)
    spec = HeadSpec(name="page_type", kind="classification", labels=[f"c{i}" for i in range(8)], hidden=512)
    model.add_head(TaskHead(spec, model.embedding_dim))
    return TorchRunner(
        model.eval(), device=DEVICE, dtype=DTYPE, attn_implementation=attention, fast_forward=fast_forward,
        compile_backend=compile_backend,
    )


def synchronize() -> None:
    if not DRY:
        torch.cuda.synchronize()


def flops_per_token(config: ModernBertConfig, length: int) -> float:
    """Forward FLOPs per token: 2 x (non-embedding weights) + attention scores and values per layer."""
    d, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = 3 * d * d + d * d + d * 2 * inner + inner * d  # Wqkv, Wo, Wi (GLU: 2x), Wo
    dense = 2 * layers * per_layer
    attention = 0.0
    for kind in config.layer_types:
        span = length if kind == "full_attention" else min(length, config.local_attention + 1)
        attention += 4 * span * d  # QK^T and AV, 2 FLOPs per multiply-add each
    return dense + attention


def docs(lengths: list[int]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(len(lengths))
    return [[2, *torch.randint(5, VOCAB, (n - 2,), generator=gen).tolist(), 3] for n in lengths]


def workloads() -> list[tuple[str, list[int]]]:
    fixed = [(str(n), [n] * (TOKENS_PER_BATCH // n)) for n in LENGTHS]
    gen = torch.Generator().manual_seed(0)
    mixed: list[int] = []
    while sum(mixed) < TOKENS_PER_BATCH // 2:
        mixed.append(int(torch.randint(MIXED[0], MIXED[1] + 1, (1,), generator=gen)))
    return [*fixed, (f"mixed {MIXED[0]}-{MIXED[1]}", sorted(mixed))]


peak = peak_tflops() * 1e12
# (label, attention implementation, our encoder forward?): "sdpa" is what the runner does by default
# (service/core/encoder_forward.py: banded local attention), "sdpa-hf" transformers' own forward with its
# full (B, 1, L, L) masks, for the gain of the former.
# "varlen-compiled": the varlen forward through torch.compile (inductor, dynamic shapes), which fuses
# each layer's elementwise work (rotary, norms, GELU gate, residuals); its compile time is in the warm-up.
# Ordered by what the first GPU run did not measure: transformers' forward (measured then) goes last.
modes = [("sdpa", "sdpa", True, None)]
if DRY or torch_varlen_attention() is not None:  # the dry run checks the layout with the CPU reference kernel
    modes.append(("varlen", "varlen", True, None))
    if os.environ.get("COMPILE", "0" if DRY else "1") != "0":  # DRY_RUN=1 COMPILE=1: the capture, no inductor
        modes.append(("varlen-compiled", "varlen", True, "aot_eager" if DRY else "inductor"))
else:
    print(f"torch {torch.__version__} has no varlen kernel with window_size: no torch packed mode")
if not DRY and flash_attention_available():
    modes.append(("flash_attention_2", "flash_attention_2", False, None))
else:
    print("flash-attn is not installed: no flash-attn packed mode")
modes.append(("sdpa-hf", "sdpa", False, None))
rows = []
profiles = []
dynamo = {}
OUT = os.environ.get("OUT")


def save() -> None:
    """Everything measured so far to $OUT, after every row: a call stopped at its time limit keeps it."""
    if not OUT:
        return
    os.makedirs(OUT, exist_ok=True)
    device = "cpu (dry run)" if DRY else torch.cuda.get_device_name(0)
    figures = {"device": device, "peak_tflops": peak / 1e12, "rows": rows, "dynamo": dynamo}
    with open(os.path.join(OUT, "gpu_engine.json"), "w") as handle:
        json.dump(figures, handle, indent=2)
    if profiles:
        with open(os.path.join(OUT, "gpu_profile.txt"), "w") as handle:
            handle.write("\n".join(profiles))


def rotary_time(runner: TorchRunner, prepared, passes: int = 3) -> tuple[float, float, int]:
    """(rotary ms, pass ms, rotary calls) per pass on the device's clock: CUDA events around every
    `apply_rotary` call and around the pass (wall time in the dry run). Eager forwards only: our
    encoder_forward looks the function up at each call, so rebinding the module's name reaches it."""
    original = encoder_forward.apply_rotary
    spans = []

    def clock():
        if DRY:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed(start, end) -> float:  # ms
        return 1000 * (end - start) if DRY else start.elapsed_time(end)

    def timed(qk, cos, sin):
        start = clock()
        out = original(qk, cos, sin)
        spans.append((start, clock()))
        return out

    encoder_forward.apply_rotary = timed
    try:
        synchronize()
        whole = []
        for _ in range(passes):
            start = clock()
            runner.run(prepared)
            whole.append((start, clock()))
        synchronize()
    finally:
        encoder_forward.apply_rotary = original
    rotary = sum(elapsed(a, b) for a, b in spans) / passes
    return rotary, sum(elapsed(a, b) for a, b in whole) / passes, len(spans) // passes


def measure(mode: str, runner: TorchRunner, compile_backend: str | None, started: float) -> None:
    """Every workload through `runner`: a row each, and a profile of one pass at the middle length."""
    config = runner.model.config
    for label, lengths in workloads():
        batch = docs(lengths)
        prepared = runner.prepare(batch)
        for _ in range(3):
            runner.run(prepared)
        synchronize()
        if compile_backend is not None and label == str(LENGTHS[0]):
            print(f"{mode}: built and compiled in {time.perf_counter() - started:.0f} s", flush=True)
        passes, host, started = 0, 0.0, time.perf_counter()
        while time.perf_counter() - started < SECONDS:
            out = runner.run(prepared)  # includes host-to-device copy, pooling, heads and the copy back
            host += out.host_s or 0.0  # issuing it, before waiting for the device
            passes += 1
        synchronize()
        seconds = time.perf_counter() - started
        work = sum(n * flops_per_token(config, n) for n in lengths)  # real tokens only, not padding
        row = {
            "attention": mode, "layout": "packed" if runner.packed else "padded", "length": label,
            "batch": len(batch), "docs_per_s": passes * len(batch) / seconds,
            "tokens_per_s": passes * sum(lengths) / seconds, "mfu": passes * work / seconds / peak,
            "padded_tokens": prepared.padded_tokens, "tokens": prepared.tokens,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if not DRY else 0.0,
            "pass_ms": 1000 * seconds / passes, "host_ms": 1000 * host / passes,
        }
        rows.append(row)
        save()
        print(
            f"{mode:18} {row['layout']:6} L={label:>12} B={len(batch):4}  {row['docs_per_s']:9.1f} docs/s  "
            f"{row['tokens_per_s']:10.0f} tokens/s  MFU {100 * row['mfu']:5.1f}%  peak {row['peak_memory_gb']:.1f} GB  "
            f"pass {row['pass_ms']:.1f} ms (host {row['host_ms']:.1f})",
            flush=True,
        )
        if not DRY:
            torch.cuda.reset_peak_memory_stats()
        if label != str(LENGTHS[1]):
            continue
        if compile_backend is None and runner.fast_forward:
            try:  # the rotary's share of a pass (RoPE moves 14 bytes an element since session 12)
                rotary_ms, whole_ms, calls = rotary_time(runner, prepared)
                row.update(rotary_ms=rotary_ms, rotary_share=rotary_ms / whole_ms)
                save()
                print(
                    f"{mode}: rotary {rotary_ms:.2f} ms of a {whole_ms:.2f} ms pass "
                    f"({100 * rotary_ms / whole_ms:.1f}%, {calls} calls) at {label} tokens",
                    flush=True,
                )
            except Exception as error:
                print(f"{mode}: rotary timing failed: {type(error).__name__}: {str(error)[:500]}", flush=True)
        if os.environ.get("PROFILE", "1") != "0":
            try:  # where one pass's time goes: the costliest kernels (or CPU operators in the dry run)
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA])
                with profile(activities=activities) as trace:
                    runner.run(prepared)
                    synchronize()
                key = "self_cpu_time_total" if DRY else "self_device_time_total"
                table = trace.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60)
                profiles.append(f"== {mode}, {len(batch)} x {label} tokens, one pass ==\n{table}")
                save()
            except Exception as error:
                print(f"{mode}: profile failed: {type(error).__name__}: {str(error)[:500]}", flush=True)


for mode, attention, fast_forward, compile_backend in modes:
    started = time.perf_counter()
    try:
        runner = build(attention, fast_forward=fast_forward, compile_backend=compile_backend)
        measure(mode, runner, compile_backend, started)
    except Exception as error:  # e.g. varlen failing its probe, inductor failing: say so, measure the rest
        print(f"{mode}: stopped: {type(error).__name__}: {str(error)[:2000]}", flush=True)
    if compile_backend is not None:
        # One graph per distinct capture is the aim; a break splits the forward and spoils the fusion.
        from torch._dynamo.utils import counters

        breaks = {reason.split("\n")[0][:160]: n for reason, n in counters["graph_break"].items()}
        graphs = counters["stats"]["unique_graphs"]
        print(f"{mode}: dynamo graphs {graphs}, graph breaks {breaks or 'none'}", flush=True)
        dynamo[mode] = {"unique_graphs": graphs, "graph_breaks": breaks}
        save()
    runner = None
    if not DRY:
        torch.cuda.empty_cache()

by = {(r["attention"], r["length"]): r for r in rows}
names = sorted({r["attention"] for r in rows}, key=[mode[0] for mode in modes].index)
for label, _ in workloads():
    if ("sdpa", label) in by and ("sdpa-hf", label) in by:
        ratio = by[("sdpa", label)]["tokens_per_s"] / by[("sdpa-hf", label)]["tokens_per_s"]
        print(f"encoder_forward vs transformers' forward (SDPA) at {label}: {ratio:.2f}x")
for packed, name in (("varlen", "torch varlen"), ("varlen-compiled", "compiled torch varlen"), ("flash_attention_2", "flash-attn")):
    if packed in names:
        for label, _ in workloads():
            if (packed, label) not in by or ("sdpa", label) not in by:
                continue
            ratio = by[(packed, label)]["tokens_per_s"] / by[("sdpa", label)]["tokens_per_s"]
            print(f"{name} packed vs SDPA padded at {label}: {ratio:.2f}x")
for label, _ in workloads():
    if ("varlen-compiled", label) in by and ("varlen", label) in by:
        ratio = by[("varlen-compiled", label)]["tokens_per_s"] / by[("varlen", label)]["tokens_per_s"]
        print(f"compiled vs eager torch varlen at {label}: {ratio:.2f}x")
middle = str(LENGTHS[1])
for name in names:
    if (name, middle) in by:
        row = by[(name, middle)]
        rotary = f", rotary {100 * row['rotary_share']:.1f}% of the pass" if "rotary_share" in row else ""
        print(f"MFU at {middle} tokens, {name}: {100 * row['mfu']:.1f}%{rotary}")
if not DRY:
    best = max((m for m in names if (m, "2048") in by), key=lambda m: by[(m, "2048")]["mfu"])
    print(f"best MFU at 2048 tokens: {100 * by[(best, '2048')]['mfu']:.1f}% ({best}; target >= 40% on H100/H200)")
for text in profiles:
    print(text)
save()
EOF
exit "$tests_failed"
