# Netra + SGLang worker image for AMD Instinct MI350X (gfx950, ROCm).
#
# Netra has no validated gfx950 code objects: the contract declarations under kernels/gfx950 are
# shipped, and every op runs on SGLang's own (AITER) implementation. Build from the repository root:
#   netra images build netra-sglang-rocm-gfx950     (the Docker SDK builder: verified code objects, the
#   result records the contracts cite, the ID recorded in images/lock.json)
#
# The FROM line is the pinned upstream SGLang ROCm image for MI35x (the article ran the
# v0.5.16-rocm720-mi35x build of this line). images/lock.json records it with its digest, "unresolved"
# until resolved with registry access (`python -m netra.deploy.images pin NAME sha256:...`); a strict
# launch refuses an unresolved digest.
FROM lmsysorg/sglang:v0.5.23-rocm720-mi35x

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
# Every op on the fallback, stated rather than inferred: no gfx950 tactic is validated yet.
ENV NETRA_RUN_DIR=/run/netra \
    NETRA_DISABLE_TACTICS=1

# --no-deps: the SGLang ROCm image already holds torch (ROCm), FastAPI, uvicorn, orjson, pydantic and
# PyYAML; Netra must not move SGLang's pins. The import line fails the build if a module is missing.
RUN pip install --no-cache-dir --no-deps -e . \
 && python3 -c "import netra.serve.app, netra.deploy.launch, netra.deploy.sglang, sglang.srt.server_args, tokenizers, jinja2"

CMD ["netra", "--help"]
