#!/usr/bin/env bash
# The whole GPU check in one command, for a bare GPU machine (image with python3 + CUDA torch, no network):
# installs the wheels that benchmarks/gpu_wheels.sh fetched into .whl/, prints the environment, then
# runs benchmarks/gpu_engine.sh (which runs the GPU tests first). Everything it prints also goes to
# $OUT/gpu_run.log, and the figures to $OUT/gpu_engine.json, when OUT is set.
#
#   bash benchmarks/gpu_wheels.sh                      # here, with network, once
#   bash benchmarks/gpu_device_run.sh                  # there, from the repository root, .whl carried
#
# Then the HTTP service (issue #5's ratio) on the GPU: benchmarks/service.py, dynamic batching vs one
# document per forward pass, 32 clients posting corpus-shaped synthetic pages (the corpus does not
# travel), for the bundled default model and for the base preset at 512 tokens; figures to
# $OUT/gpu_service_default.json and $OUT/gpu_service_base.json. SERVICE=0 skips it.
#
# Duration, measured on an H200 (2026-12-04) with SECONDS_PER_CONFIG=4: 10 s to install, 100 s for the
# GPU tests and the engine's 8 configurations, 165 s for the service (4 servers, each loaded and warmed,
# then 5 + 15 s of load). The engine now measures 20 configurations (torch's varlen, and varlen through
# torch.compile, whose compile time adds perhaps a minute) plus a profile per mode: expect about 7
# minutes in all at SECONDS_PER_CONFIG=4, plus the machine's start. COMPILE=0 and PROFILE=0 shorten it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT="${OUT:-}"
log="${OUT:+$OUT/gpu_run.log}"
log="${log:-/dev/null}"
{
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "no .whl/: using the image's packages as they are"
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  # Each part runs whatever the one before it did; the exit status says whether any failed.
  failed=0
  PYTHON=python3 bash benchmarks/gpu_engine.sh || { echo "gpu_engine.sh failed"; failed=1; }
  if [ "${SERVICE:-1}" != 0 ]; then
    service=(python3 benchmarks/service.py --synthetic 512 --device cuda --dtype bfloat16
             --preprocess-pool process --preprocess-workers 8 --clients 32 --client-processes 4
             --warmup 5 --duration 15)
    "${service[@]}" ${OUT:+--json "$OUT/gpu_service_default.json"} \
      || { echo "service benchmark (default model) failed"; failed=1; }
    "${service[@]}" --no-bundled --preset base --max-length 512 ${OUT:+--json "$OUT/gpu_service_base.json"} \
      || { echo "service benchmark (base preset) failed"; failed=1; }
  fi
  exit "$failed"
} 2>&1 | tee "$log"
