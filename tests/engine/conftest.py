from __future__ import annotations

from collections.abc import Iterator

import pytest

from netra.engine.process import engine_process


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    with engine_process("--preset", "tiny", "--max-running-requests", "64", "--context-length", "1024") as base:
        yield base


@pytest.fixture(scope="session")
def incremental_url() -> Iterator[str]:
    with engine_process("--preset", "tiny", "--incremental-streaming-output", "--stream-interval", "3",
                        "--context-length", "1024") as base:
        yield base
