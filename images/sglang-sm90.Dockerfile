# Netra + SGLang worker image for NVIDIA Hopper (sm90: H100 / H200).
#
# Build from the repository root, on an sm90 machine after `netra kernels build` (the code objects
# under build/ are copied in and verified against kernels/lock.json during the build):
#   netra images build netra-sglang-cuda-sm90     (the Docker SDK builder: verified code objects, the
#   result records the contracts cite, the ID recorded in images/lock.json)
#
# The FROM line is the pinned upstream SGLang image. images/lock.json records it with its digest;
# until someone with registry access resolves it (`docker buildx imagetools inspect REF`, then
# `python -m netra.deploy.images pin NAME sha256:...`), the lock says "unresolved" and a strict
# launch refuses the image. `python -m netra.deploy.images lint` checks this file against the lock.
FROM lmsysorg/sglang:v0.5.23-cu130

# numactl: compose binds each worker's memory to its GPU's NUMA node (numactl --membind).
# nginx: the front runs from this same image, so one pinned image serves the whole node.
# apt package versions are not pinned: they come from the base image's distribution snapshot,
# which is pinned by the base digest, and cannot be known here without that image. Neither package
# is on the numerical path.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends numactl nginx \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/netra
COPY pyproject.toml ./
COPY netra/ netra/
COPY kernels/ kernels/
COPY launcher/ launcher/
COPY nginx/ nginx/
COPY results/ results/
COPY build/ build/
ENV NETRA_BUILD_DIR=/opt/netra/build \
    NETRA_RUN_DIR=/run/netra

# --no-deps: the SGLang image already holds torch, FastAPI, uvicorn, orjson, pydantic, PyYAML and
# the CUDA bindings; Netra must not move any of SGLang's pins. The import line fails the build if
# a module Netra needs is missing; the plugin check if SGLang's own plugin discovery does not load
# netra's `sglang.srt.plugins` entry point (netra/plugins/sglang.py); `netra kernels verify` if a
# code object differs from the lock.
RUN pip install --no-cache-dir --no-deps -e . \
 && python3 -c "import netra.serve.app, netra.deploy.launch, netra.deploy.sglang, sglang.srt.server_args, tokenizers, jinja2" \
 && python3 -m netra.plugins.sglang --check-install \
 && netra kernels verify

# Every container verifies its code objects against the kernel lock before its command runs (a
# tampered or missing one exits 3: that worker never becomes healthy; netra/deploy/entry.py).
ENTRYPOINT ["python3", "-m", "netra.deploy.entry"]
# The command comes from the plan (compose/ files): python3 -m sglang.launch_server ... per worker.
CMD ["netra", "--help"]
