#!/usr/bin/env bash
# Fetch, on this (networked) machine, the wheels that benchmarks/gpu_engine.sh needs on a bare GPU machine
# whose image has torch, tokenizers, safetensors and pytest but not htmllm's own pins. They go to .whl/
# (ignored), which travels with the working tree; the GPU machine cannot reach PyPI itself.
#
#   bash benchmarks/gpu_wheels.sh          # here, once: about 16 MB of wheels, then ~14 MB of corpus pages
#   bash benchmarks/gpu_device_run.sh      # then on the GPU machine, from the repository root, with .whl
#                                          # and .corpus carried: installs the wheels into /tmp/site and
#                                          # runs gpu_engine.sh, then the service on the corpus pages
#
# What and why: transformers at the version this repository is tested with (ModernBERT's config and
# attention code move between releases; the image's may be older), selectolax (the pruner, imported by
# the Engine that the GPU tests drive), regex at transformers' minimum, and pytest-asyncio (the GPU tests
# include async Engine tests); then the HTTP service's own needs that the image lacks (FastAPI,
# Starlette, uvicorn and httptools (the image has uvloop), pydantic and pydantic-settings with their
# small helpers, brotli and zstandard for request bodies, charset-normalizer and typing-extensions at
# the tested versions), for benchmarks/service.py on the GPU. Learned on the first device run
# (2026-12-04): the image's huggingface-hub (1.33) is too old for transformers 5.25 (which refuses to
# import below 2.4), so the hub travels with what it needs beyond the image (httpx2, httpcore2,
# truststore, click, idna at their tested versions), and FastAPI 0.165 imports opentelemetry-api, which
# the image lacks. Versions are read from .venv when it exists, so the GPU runs what CI tests.
# Together with the tracked tree they must stay under the device's 64 MiB: so the transformers wheel
# travels without the model families the GPU run never imports (benchmarks/device_payload.py trim-wheel:
# 13.8 MB -> 2.2 MB), and what room is left goes to real pages of the shared corpus, spread evenly over
# it, in .corpus/ (ignored; device_payload.py corpus), for benchmarks/service.py there. No corpus beside
# the checkout: no .corpus/, and the service part posts synthetic pages instead.
# PYTHON_VERSION (default 3.12) is the GPU image's interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"

version() {  # the installed version of $1 in this checkout's environment, or $2
  "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print(sys.argv[2])" "$1" "$2"
}

pins=(
  "transformers==$(version transformers 5.24.0)"
  "selectolax==$(version selectolax 1.0.2)"
  "regex==$(version regex 2026.11.19)"
  "pytest-asyncio==$(version pytest-asyncio 1.5.0)"
  "fastapi==$(version fastapi 0.165.0)"
  "starlette==$(version starlette 1.10.0)"
  "uvicorn==$(version uvicorn 0.55.0)"
  "httptools==$(version httptools 0.9.0)"
  "pydantic==$(version pydantic 2.14.4)"
  "pydantic-core==$(version pydantic-core 2.50.5)"
  "pydantic-settings==$(version pydantic-settings 2.16.3)"
  "python-dotenv==$(version python-dotenv 1.2.4)"
  "annotated-types==$(version annotated-types 0.8.0)"
  "typing-inspection==$(version typing-inspection 0.4.5)"
  "annotated-doc==$(version annotated-doc 0.0.7)"
  "typing-extensions==$(version typing-extensions 4.16.0)"
  "brotli==$(version brotli 1.2.1)"
  "zstandard==$(version zstandard 0.25.0)"
  "charset-normalizer==$(version charset-normalizer 3.5.3)"
  "huggingface-hub==$(version huggingface-hub 2.4.0)"
  "httpx2==$(version httpx2 2.16.2)"
  "httpcore2==$(version httpcore2 2.16.2)"
  "truststore==$(version truststore 0.10.5)"
  "click==$(version click 8.5.1)"
  "idna==$(version idna 3.20)"
  "opentelemetry-api==$(version opentelemetry-api 1.45.2)"
)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"
"$PY" benchmarks/device_payload.py trim-wheel .whl/transformers-*.whl
ls -l .whl
du -sh .whl
rm -rf .corpus
if [ -f ../shared/corpus/manifest.jsonl ]; then
  "$PY" benchmarks/device_payload.py corpus --corpus ../shared/corpus --out .corpus
fi
