# Netra embedded engine (netra/engine) for NVIDIA Hopper (sm90: H100 / H200), full preset.
#
# Based on the same pinned SGLang CUDA image as sglang-sm90.Dockerfile: it carries a CUDA 13 torch,
# the CUDA toolkit and the CUDA bindings, so one upstream digest covers both sm90 images. SGLang
# itself is present but unused by this engine. Build from the repository root after
# `netra kernels build` on an sm90 machine:
#   netra images build netra-engine-cuda-sm90     (the Docker SDK builder: verified code objects, the
#   result records the contracts cite, the ID recorded in images/lock.json)
FROM lmsysorg/sglang:v0.5.23-cu130

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

RUN pip install --no-cache-dir --no-deps -e . \
 && python3 -c "import netra.serve.app, netra.engine.server, netra.deploy.launch, tokenizers, jinja2, safetensors, cuda.bindings.driver" \
 && netra kernels verify

# Every container verifies its code objects against the kernel lock before its command runs (a
# tampered or missing one exits 3: that worker never becomes healthy; netra/deploy/entry.py).
ENTRYPOINT ["python3", "-m", "netra.deploy.entry"]
CMD ["netra", "engine", "--help"]
