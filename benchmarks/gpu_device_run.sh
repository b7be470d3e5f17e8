#!/usr/bin/env bash
# The whole GPU check in one command, for a bare GPU machine (image with python3 + CUDA torch, no network):
# installs the wheels that benchmarks/gpu_wheels.sh fetched into .whl/, prints the environment, then
# runs benchmarks/gpu_engine.sh (which runs the GPU tests first). Everything it prints also goes to
# $OUT/gpu_run.log, and the figures to $OUT/gpu_engine.json, when OUT is set.
#
#   bash benchmarks/gpu_wheels.sh                      # here, with network, once
#   bash benchmarks/gpu_device_run.sh                  # there, from the repository root, .whl and .corpus carried
#
# Then the HTTP service (issue #5's ratio) on the GPU: benchmarks/service.py, dynamic batching vs one
# document per forward pass, 32 clients posting 512 real shared-corpus pages (sampled into .corpus/ by
# gpu_wheels.sh and carried; corpus-shaped synthetic pages when it is absent), for the bundled default
# model and for the base preset at 512 tokens; figures to
# $OUT/gpu_service_default.json and $OUT/gpu_service_base.json. SERVICE=0 skips it.
#
# Duration, measured on an H200 (2026-12-04) with SECONDS_PER_CONFIG=4: 10 s to install, 100 s for the
# GPU tests and the engine's 8 configurations, 165 s for the service (4 servers, each loaded and warmed,
# then 5 + 15 s of load: about 41 s a server). The engine now measures 16 configurations without
# flash-attn (4 modes x 4 batches; torch's varlen, and varlen through torch.compile, whose inductor
# compile adds one to two minutes) plus a profile per mode, and the service runs 8 servers (twice more,
# the model in a child process), 4 + 12 s of load each after its 4 client processes have started:
# expect 3 to 4.5 minutes for the engine part at SECONDS_PER_CONFIG=4 and about 7 for the service part
# (benchmarks/service.py's two rounds a mode add a warm-up and a client start to each server's load),
# plus the machine's start. Together they would pass the device's 10 minutes a call: PARTS=engine and
# PARTS=service run one part each (two calls back to back, so the second finds the machine warm).
# COMPILE=0, PROFILE=0, SERVICE_PROCESS=0 shorten it. Each step's start is stamped (UTC) in the log;
# gpu_engine.json is rewritten after every row and each service run writes its own JSON, so a call
# stopped at its limit keeps what it had measured.
#
# DRY_RUN=1 runs the same sequence here, on a CPU, before a device call is spent on it: no wheels
# installed, gpu_engine.sh's own dry run, and the service runs with the same flags but on the CPU in
# float32, the tiny preset for the base one, 16 synthetic pages (.corpus/ if present), 4 clients, 1 + 2 s
# (PYTHON picks the interpreter, python3 by default). The figures mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-}"
# tee cannot open a log in a folder that is not there, and under pipefail its failure was the run's exit
# status (1) after every part had passed.
[ -z "$OUT" ] || mkdir -p "$OUT"
log="${OUT:+$OUT/gpu_run.log}"
log="${log:-/dev/null}"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
# Checked before the machine's time goes on anything: a misspelt part had run nothing and exited 0.
parts="${PARTS:-engine service}"
for part in $parts; do
  case "$part" in
    engine | service) ;;
    *) echo "PARTS=\"$PARTS\": '$part' is no part of this run (engine, service)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
dry="${DRY_RUN:-}"
{
  stamp "start${dry:+ (dry run)}"
  if [ -n "$dry" ]; then
    echo "dry run: the wheels are not installed, no GPU is used"
  elif compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "no .whl/: using the image's packages as they are"
  fi
  [ -n "$dry" ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  # Each part runs whatever the one before it did; the exit status says whether any failed.
  failed=0
  if [[ " $parts " == *" engine "* ]]; then
    stamp "engine"
    PYTHON="$PY" bash benchmarks/gpu_engine.sh || { echo "gpu_engine.sh failed"; failed=1; }
  fi
  if [[ " $parts " == *" service "* ]] && [ "${SERVICE:-1}" != 0 ]; then
    # Real corpus pages when gpu_wheels.sh could sample them into .corpus/ (carried), else synthetic ones.
    if [ -f .corpus/manifest.jsonl ]; then pages=(--corpus .corpus --limit 512); else pages=(--synthetic 512); fi
    if [ -n "$dry" ]; then
      [ -f .corpus/manifest.jsonl ] && pages=(--corpus .corpus --limit 16) || pages=(--synthetic 16)
      run=(--device cpu --dtype float32 --preprocess-pool process --preprocess-workers 1 --clients 4
           --client-processes 1 --warmup 1 --duration 2)
      base=(--no-bundled --preset tiny --max-length 64)
    else
      run=(--device cuda --dtype bfloat16 --preprocess-pool process --preprocess-workers 8 --clients 32
           --client-processes 4 --warmup 4 --duration 12)
      base=(--no-bundled --preset base --max-length 512)
    fi
    echo "service benchmark pages: ${pages[*]}"
    service=("$PY" benchmarks/service.py "${pages[@]}" "${run[@]}")
    stamp "service: default model"
    "${service[@]}" ${OUT:+--json "$OUT/gpu_service_default.json"} \
      || { echo "service benchmark (default model) failed"; failed=1; }
    stamp "service: base preset"
    "${service[@]}" "${base[@]}" ${OUT:+--json "$OUT/gpu_service_base.json"} \
      || { echo "service benchmark (base preset) failed"; failed=1; }
    # The same two with the model in a child process (HTMLLM_INFERENCE_PROCESS): does a GIL of its own
    # shorten the server's passes (compare host ms and pass ms with the runs above)?
    [ "${SERVICE_PROCESS:-1}" = 0 ] || stamp "service: default model, inference process"
    [ "${SERVICE_PROCESS:-1}" = 0 ] || "${service[@]}" --inference-process ${OUT:+--json "$OUT/gpu_service_default_process.json"} \
      || { echo "service benchmark (default model, inference process) failed"; failed=1; }
    [ "${SERVICE_PROCESS:-1}" = 0 ] || stamp "service: base preset, inference process"
    [ "${SERVICE_PROCESS:-1}" = 0 ] || "${service[@]}" --inference-process "${base[@]}" \
      ${OUT:+--json "$OUT/gpu_service_base_process.json"} \
      || { echo "service benchmark (base preset, inference process) failed"; failed=1; }
  fi
  stamp "end"
  exit "$failed"
} 2>&1 | tee "$log"
