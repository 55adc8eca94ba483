# The verbs a newcomer types. Everything installs into .venv; nothing needs a GPU except `gpu-*`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= local

.PHONY: setup nginx serve test lint typecheck pytest kernels kernels-verify explain sglang-peer clean

$(BIN)/.netra-ok: requirements/cpu.txt requirements/runtime.txt requirements/dev.txt requirements/nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/cpu.txt -r requirements/runtime.txt -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps -r requirements/nodeps.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(BIN)/.netra-ok

# nginx from Debian when it is missing (root, as on a fresh machine).
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null)

# The main job: serve the `local` profile (embedded engine, tiny preset, CPU) on 127.0.0.1:8000.
serve: setup nginx
	$(BIN)/netra launch --profile $(PROFILE)

lint: setup
	$(BIN)/ruff check netra tests

typecheck: setup
	$(BIN)/mypy

pytest: setup nginx
	$(BIN)/python -m pytest -q

# The test command (README, CI): lint, types, then every test (GPU tests skip without a GPU).
test: lint typecheck pytest

kernels: setup
	$(BIN)/netra kernels build

kernels-verify: setup
	$(BIN)/netra kernels verify

explain: setup
	$(BIN)/netra explain

# The folder the H200 peer runs carry (git-ignored): SGLang 0.5.23's kernel files from the pinned
# wheel, its JIT CUDA modules built here for sm_90a (nvcc; no GPU), and the cp312 wheels the GPU host
# lacks. See netra/bench/peers/sglang_loader.py.
sglang-peer: setup
	$(BIN)/pip install -q -r requirements/peer.txt
	$(BIN)/python -m netra.bench.peers.sglang_loader .sglang_peer

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
