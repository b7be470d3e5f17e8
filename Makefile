# Two set-up commands on a fresh machine: `make serve` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch: the default (CUDA) build from PyPI where `nvidia-smi -L` lists a GPU; elsewhere the CPU wheel,
# from pip's own sources when they hold it (this machine's disk), else from PyTorch's CPU index, so a
# machine without a GPU never downloads the multi-GB CUDA build. TORCH_SPEC=... installs exactly that.
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SPEC ?=
EXTRAS ?= serve,onnx,extract,train,dev
STAMP := $(VENV)/.installed-$(EXTRAS)
HOST ?= 0.0.0.0
PORT ?= 8000
CORPUS ?= ../shared/corpus

.PHONY: help install test lint typecheck pytest serve loadtest default-model clean

# The targets, for a newcomer (README.md's quick start names the two set-up commands).
help:
	@echo "make serve          create .venv, install, serve the bundled default model (HOST=0.0.0.0 PORT=8000)"
	@echo "make test           install, then lint, typecheck and the whole test suite (about 14 min on 2 cores)"
	@echo "make pytest         the test suite alone (PYTEST_ARGS=... passes options, e.g. a path or -k; PYTEST_WORKERS=0 runs it in one process)"
	@echo "make lint           ruff check and ruff format --check"
	@echo "make typecheck      mypy"
	@echo "make loadtest       a bounded locust run against a server it starts (docs/deployment.md)"
	@echo "make default-model  rebuild the bundled model from CORPUS=$(CORPUS) (docs/training.md)"
	@echo "make clean          remove .venv and caches"

# htmllm needs Python 3.11+: pip's "requires a different Python" came after the venv was made, and the
# venv, made with the old python, stayed, so every later make failed the same way.
NEED_PY := import sys; sys.exit(sys.version_info < (3, 11))

$(PY):
	@$(PYTHON) -c '$(NEED_PY)' || { echo "$(PYTHON) is not Python 3.11 or newer, which htmllm needs: run make again with PYTHON=python3.11 (or another 3.11+ interpreter)" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c '$(NEED_PY)' || { echo "$(VENV) was made with a Python older than 3.11: remove it (make clean) and run make again with PYTHON=python3.11" >&2; exit 2; }
	@if [ -n "$(TORCH_SPEC)" ]; then set -x; $(PIP) install --quiet "$(TORCH_SPEC)"; \
	elif nvidia-smi -L >/dev/null 2>&1; then set -x; $(PIP) install --quiet "torch==$(TORCH_VERSION)"; \
	elif $(PIP) install --quiet --dry-run --no-index --no-deps "torch==$(TORCH_VERSION)+cpu" >/dev/null 2>&1; \
	then set -x; $(PIP) install --quiet "torch==$(TORCH_VERSION)+cpu"; \
	else set -x; $(PIP) install --quiet "torch==$(TORCH_VERSION)+cpu" --extra-index-url "$(TORCH_CPU_INDEX)"; fi
	$(PIP) install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

PYTEST_ARGS ?=
# pytest-xdist processes: one per CPU this machine gives us (its affinity mask and cgroup limit, as the
# service counts them), at most 4. Most of the suite's time is real servers, model processes and CLI
# runs starting and draining, which overlap: on 2 cores the suite takes about 60% of its one-process
# time. PYTEST_WORKERS=0 runs it in this process (for --pdb, or a -x that stops at the first failure).
PYTEST_WORKERS ?= $(shell $(PY) -c 'from service.core.cpus import cpu_budget; print(min(4, cpu_budget().threads))' 2>/dev/null || echo 2)
pytest: install
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test: lint typecheck pytest

# Serves the bundled default model (service/assets/default-model); without it, says what is missing
# and fails rather than serve anything else. HTMLLM_* variables configure the rest (docs/service.md).
serve: install
	$(VENV)/bin/htmllm serve --host $(HOST) --port $(PORT)

# A bounded, headless locust run against a server started on 127.0.0.1 (reports in out/loadtest/);
# the soak test: make loadtest LOADTEST_TIME=10m. See docs/deployment.md.
LOADTEST_USERS ?= 8
LOADTEST_TIME ?= 60s
LOADTEST_ARGS ?=
loadtest: install
	$(PY) -m loadtests.run --users $(LOADTEST_USERS) --run-time $(LOADTEST_TIME) $(LOADTEST_ARGS)

# The bundled default model (service/assets/default-model/, with MODEL_CARD.md) and docs/training_curve.png:
# tokenizer -> shards -> MiniLM teacher -> pretraining of `mini` -> heads -> evaluation -> bundle, on
# $(CORPUS), under an hour on a 2-core CPU. Intermediate data stays in $(DEFAULT_RUN) (git-ignored).
DEFAULT_RUN ?= runs/default-model
DEFAULT_OUT ?= service/assets/default-model
DEFAULT_CURVE ?= docs/training_curve.png
HTMLLM := $(VENV)/bin/htmllm
default-model: install
	mkdir -p $(DEFAULT_RUN)/logs
	$(HTMLLM) tokenizer train --corpus $(CORPUS) --vocab-size 16384 --out $(DEFAULT_RUN)/tokenizer --no-progress
	$(HTMLLM) data prepare --corpus $(CORPUS) --tokenizer $(DEFAULT_RUN)/tokenizer/tokenizer.json \
		--out $(DEFAULT_RUN)/shards --no-progress > $(DEFAULT_RUN)/logs/data.json
	$(HTMLLM) teacher embed --input $(DEFAULT_RUN)/shards --out $(DEFAULT_RUN)/teacher --no-progress
	$(HTMLLM) train --config configs/default-model.toml --shards $(DEFAULT_RUN)/shards \
		--teacher $(DEFAULT_RUN)/teacher --out $(DEFAULT_RUN)/pretrain --no-resume --no-progress
	$(HTMLLM) tasks derive --corpus $(CORPUS) --out $(DEFAULT_RUN)/tasks
	$(HTMLLM) heads train --checkpoint $(DEFAULT_RUN)/pretrain/model --tasks $(DEFAULT_RUN)/tasks \
		--cache $(DEFAULT_RUN)/eval-cache
	$(HTMLLM) eval run --checkpoint $(DEFAULT_RUN)/pretrain/model --tasks $(DEFAULT_RUN)/tasks \
		--baselines random,tfidf,minilm --cache $(DEFAULT_RUN)/eval-cache --out $(DEFAULT_RUN)/eval \
		--title "Default model: frozen-encoder evaluation"
	$(PY) -m model_training.default_model --run $(DEFAULT_RUN) --out $(DEFAULT_OUT) \
		--curve $(DEFAULT_CURVE) --eval $(DEFAULT_RUN)/eval

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
