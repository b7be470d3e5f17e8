#!/usr/bin/env bash
# The whole GPU check in one command, for a bare GPU machine (image with python3 + CUDA torch, no network):
# installs the wheels that benchmarks/gpu_wheels.sh fetched into .whl/, prints the environment, then
# runs benchmarks/gpu_engine.sh (which runs the GPU tests first). Everything it prints also goes to
# $OUT/gpu_run.log, and the figures to $OUT/gpu_engine.json, when OUT is set.
#
#   bash benchmarks/gpu_wheels.sh                      # here, with network, once
#   bash benchmarks/gpu_device_run.sh                  # there, from the repository root, .whl carried
#
# Expected duration: 3-4 minutes on an H100/H200 (the model-only benchmark is 12 timed configurations
# of 6 s; the base preset is built twice). SECONDS_PER_CONFIG shortens it.
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
  PYTHON=python3 bash benchmarks/gpu_engine.sh
} 2>&1 | tee "$log"
