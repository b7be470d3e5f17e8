# syntax=docker/dockerfile:1.7
#
# The htmllm service image. Two final targets from one file:
#
#   docker build --target cpu  -t htmllm:cpu  .   # torch (CPU wheel) + onnxruntime (the default target)
#   docker build --target cuda -t htmllm:cuda .   # torch (CUDA wheel) + flash-attn + onnxruntime-gpu
#
# BuildKit builds only the stages a target needs, so the CPU build never pulls the CUDA images; the CPU
# stages come last so that a plain `docker build .` gives the CPU image.
# Both install the package from pyproject.toml extras in a builder stage, the dependencies in a layer of
# their own that only pyproject.toml invalidates (a code change reinstalls the package alone), so the
# runtime image holds a virtualenv with `service/` (and its bundled default model under service/assets/)
# and nothing else from the repository: model_training, tests and benchmarks never enter the build
# context (.dockerignore) nor the image. The server (`python -m service.api`, configured by HTMLLM_*
# variables) runs as an unprivileged user, as PID 1 in exec form, so SIGTERM from `docker stop` or the
# kubelet reaches it: the service drains its queue before exiting, or, still loading its model, exits at
# once (PID 1 ignores a signal it has no handler for, so the server installs one before the load).
# tests/deploy/test_dockerfile.py parses this file and checks these rules.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_VERSION=12.8.1
ARG CUDA_UBUNTU=ubuntu24.04
ARG TORCH_VERSION=2.13.0
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu128

# ---------------------------------------------------------------------------------------------------
# CUDA builder: the devel image has nvcc, which flash-attn needs when no prebuilt wheel matches.
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${CUDA_UBUNTU} AS cuda-builder
ARG TORCH_VERSION
ARG TORCH_CUDA_INDEX
# Ampere and Hopper: the GPUs flash-attn 2 supports; fewer archs keep the compile bounded.
ARG FLASH_ATTN_CUDA_ARCHS=80;90
ARG MAX_JOBS=4
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/htmllm \
    PATH=/opt/htmllm/bin:$PATH \
    FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS} \
    MAX_JOBS=${MAX_JOBS}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev build-essential git \
    && rm -rf /var/lib/apt/lists/*
# flash-attn builds against the installed torch, so torch and the build tools go in first and the
# extras install without build isolation (setuptools: pyproject.toml's build requirement).
# Every pip call keeps its downloads and built wheels in a BuildKit cache mount: it outlives the layers
# (a rebuilt dependency layer re-downloads nothing, and reuses the flash-attn wheel it compiled) and
# never enters the image.
RUN --mount=type=cache,target=/root/.cache/pip \
    python3.12 -m venv /opt/htmllm \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_CUDA_INDEX}" \
    && pip install "setuptools>=77" "wheel>=0.43" "packaging>=24" "ninja>=1.11" "psutil>=5.9" "einops>=0.8"
WORKDIR /src
# The dependencies, in a layer that sees nothing but pyproject.toml, so a change to the code or the
# README does not recompile flash-attn: pip installs the project's extras from a stub of it (an empty
# `service` package and README, all the build backend needs), then the stub goes.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    mkdir service \
    && touch service/__init__.py README.md \
    && pip install --no-build-isolation ".[serve,extract,embed,gpu]" \
    && pip uninstall --yes htmllm \
    && rm -rf service README.md build ./*.egg-info
COPY README.md ./
COPY service ./service
# The project itself, from the copied source, and nothing else (--no-deps: the layer above has them).
# The checks run isolated (`python -I`): a plain `python -c` puts the working directory first on
# sys.path, so /src/service (the copied source) would be imported instead of the installed package, and
# the check for the bundled model would pass even if the package left it out.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
    && python -I -c "import service.api, service.engine, onnxruntime, resiliparse, trafilatura, justext, pyarrow" \
    && python -I -c "import pathlib, service; d = pathlib.Path(service.__file__).parent / 'assets' / 'default-model'; assert (d / 'config.json').is_file(), f'no bundled default model at {d}'"

# ---------------------------------------------------------------------------------------------------
# CUDA runtime: the runtime image carries the CUDA and cuDNN libraries torch and onnxruntime-gpu load.
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-${CUDA_UBUNTU} AS cuda
LABEL org.opencontainers.image.title="htmllm" \
      org.opencontainers.image.description="Real-time embeddings and task-head scores for raw HTML pages (CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/htmllm \
    PATH=/opt/htmllm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HTMLLM_DEVICE=cuda \
    HTMLLM_HOST=0.0.0.0 \
    HTMLLM_PORT=8000
# The virtualenv's interpreter is a symlink to the system python3.12, the same one the builder used.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 htmllm \
    && useradd --system --uid 10001 --gid htmllm --create-home --home-dir /home/htmllm --shell /usr/sbin/nologin htmllm
COPY --from=cuda-builder /opt/htmllm /opt/htmllm
WORKDIR /home/htmllm
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; h = '[::1]' if os.environ.get('HTMLLM_HOST') == '::' else '127.0.0.1'; urllib.request.urlopen('http://%s:%s/ready' % (h, os.environ.get('HTMLLM_PORT', '8000')), timeout=4)"]
# `python -m service.api` reads every setting, host and port included, from HTMLLM_* variables.
CMD ["python", "-m", "service.api"]

# ---------------------------------------------------------------------------------------------------
# CPU builder: a virtualenv with the CPU torch wheel (the default PyPI wheel bundles CUDA, ~3 GB more)
# and the `serve`, `extract` (the /v1/extract route's extractors), `embed` (pyarrow, for the console
# script's `htmllm embed`) and `onnx` extras.
FROM ${PYTHON_IMAGE} AS cpu-builder
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/htmllm \
    PATH=/opt/htmllm/bin:$PATH
# pip's downloads in a BuildKit cache mount, as in the CUDA builder.
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m venv /opt/htmllm \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_CPU_INDEX}"
WORKDIR /src
# The dependencies from pyproject.toml alone, through a stub of the project, as in the CUDA builder.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    mkdir service \
    && touch service/__init__.py README.md \
    && pip install ".[serve,extract,embed,onnx]" \
    && pip uninstall --yes htmllm \
    && rm -rf service README.md build ./*.egg-info
# README.md is read by the build backend (pyproject `readme`); it does not reach the runtime image.
COPY README.md ./
COPY service ./service
# Checked with `python -I` for the reason the CUDA builder gives: the installed package, not /src/service.
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps . \
    && python -I -c "import service.api, service.engine, onnxruntime, resiliparse, trafilatura, justext, pyarrow" \
    && python -I -c "import pathlib, service; d = pathlib.Path(service.__file__).parent / 'assets' / 'default-model'; assert (d / 'config.json').is_file(), f'no bundled default model at {d}'"

# ---------------------------------------------------------------------------------------------------
# CPU runtime.
FROM ${PYTHON_IMAGE} AS cpu
LABEL org.opencontainers.image.title="htmllm" \
      org.opencontainers.image.description="Real-time embeddings and task-head scores for raw HTML pages (CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV VIRTUAL_ENV=/opt/htmllm \
    PATH=/opt/htmllm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HTMLLM_DEVICE=cpu \
    HTMLLM_HOST=0.0.0.0 \
    HTMLLM_PORT=8000
RUN groupadd --system --gid 10001 htmllm \
    && useradd --system --uid 10001 --gid htmllm --create-home --home-dir /home/htmllm --shell /usr/sbin/nologin htmllm
COPY --from=cpu-builder /opt/htmllm /opt/htmllm
WORKDIR /home/htmllm
USER 10001:10001
EXPOSE 8000
STOPSIGNAL SIGTERM
# /ready: the model is loaded and warmed, so `healthy` means "can serve" (compose `service_healthy`). On
# the IPv6 loopback when HTMLLM_HOST is "::", which binds IPv6 only.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; h = '[::1]' if os.environ.get('HTMLLM_HOST') == '::' else '127.0.0.1'; urllib.request.urlopen('http://%s:%s/ready' % (h, os.environ.get('HTMLLM_PORT', '8000')), timeout=4)"]
# `python -m service.api` reads every setting, host and port included, from HTMLLM_* variables.
CMD ["python", "-m", "service.api"]

