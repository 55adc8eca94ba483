from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Triton picks its interpreter when kernels are decorated, its own standard library (tl.sum, ...)
# included, at `import triton`: TRITON_INTERPRET must be set before anything imports triton, so here,
# in the first conftest. Only on machines without CUDA, so that GPU runs keep compiled Triton. The
# `triton_interp` tests (tests/ops/conftest.py) skip, saying so, when it was not set in time.
if "triton" not in sys.modules:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:
        pass


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _docker_missing() -> str | None:
    """Why no Docker engine can be used here (None: one answers)."""
    try:
        from netra.deploy.imagebuild import ImageBuildError, client
    except ImportError as exc:
        return f"netra.deploy.imagebuild cannot be imported ({exc})"
    try:
        client().close()
    except ImageBuildError as exc:
        return str(exc)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("docker" in item.keywords for item in items):
        from netra import settings

        why = _docker_missing()
        if why is not None and settings.get("NETRA_REQUIRE_DOCKER"):
            raise pytest.UsageError(f"NETRA_REQUIRE_DOCKER is set but no Docker engine can be used: {why}")
        if why is not None:
            skip_docker = pytest.mark.skip(reason=f"needs a Docker engine: {why}")
            for item in items:
                if "docker" in item.keywords:
                    item.add_marker(skip_docker)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (sm90); none present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def qwen36_checkpoint() -> Path:
    """A synthesized checkpoint in Qwen3.6-35B-A3B-FP8's layout: the tiny preset's shapes, seeded FP8
    weights (seed 0), the real vocabulary (248,320 rows), tokenizer files, generation config and chat
    template (netra/checkpoint/synth.py). Made once per machine under $NETRA_CACHE_DIR/checkpoints,
    keyed by its inputs, and shared by every test: treat it as read-only."""
    from netra.checkpoint.synth import cached_checkpoint

    return cached_checkpoint("tiny", 0)
