# Netra on the CPU (embedded engine + response layer + nginx), for the `local-compose` profile.
#
# Built by `netra images build netra-engine-cpu` (the Docker SDK; never `docker build` by hand): the
# base is the Debian bookworm minbase image `netra images base` made here with debootstrap, passed
# by its locked image ID; the build context holds the package, the kernel contracts, their lock and
# code objects (verified against the lock before the build) and the result records the accepted
# contracts cite, the profiles and the nginx template.
# Python packages (pyproject's core + the engine and serve extras, requirements/image.txt, written by
# the builder) come from the wheelhouse the builder downloaded on the host at the locked versions
# (the CPU torch wheel, never the CUDA build), served to this build on loopback only, so no wheel is
# left in a layer.
ARG NETRA_BASE
FROM ${NETRA_BASE}

# python3 for the venv, nginx for the front, numactl for memory binding; their versions come from
# the base's Debian snapshot (DL3008 waived for the same reason as in the GPU Dockerfiles).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv nginx numactl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/netra
COPY requirements/image.txt requirements/image.txt
# The wheelhouse holds one version of each package, the locked one (and the CPU torch only), so it
# alone decides what is installed; its sha256 is part of this step's cache key: a new set reinstalls.
ARG NETRA_WHEELHOUSE_URL
ARG NETRA_WHEELHOUSE_SHA256
RUN python3 -m venv /opt/venv \
 && echo "wheelhouse ${NETRA_WHEELHOUSE_SHA256}" \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links "${NETRA_WHEELHOUSE_URL}" \
      -r requirements/image.txt \
 && /opt/venv/bin/python -c "import torch; assert torch.version.cuda is None, torch.__version__"

COPY pyproject.toml ./
COPY launcher/ launcher/
COPY nginx/ nginx/
COPY kernels/ kernels/
COPY results/ results/
COPY build/ build/
COPY netra/ netra/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/netra \
    NETRA_BUILD_DIR=/opt/netra/build \
    NETRA_RUN_DIR=/run/netra

# The modules the services import, with their dependencies; and the code objects against the lock.
RUN python -c "import netra.engine.server, netra.serve.app, netra.deploy.plan" \
 && python -m netra kernels verify

# Every container verifies its code objects against the kernel lock before its command runs; a
# mismatch exits 3 and the service never becomes healthy (netra/deploy/entry.py).
ENTRYPOINT ["/opt/venv/bin/python3", "-m", "netra.deploy.entry"]
CMD ["netra", "--help"]
