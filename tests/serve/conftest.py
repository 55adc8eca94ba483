from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netra.serve.app import ServeState, create_app
from netra.serve.config import ServeConfig
from netra.serve.fakeworker import FakeConfig, FakeState, create_fake_worker, write_tokenizer
from netra.web.server import ServerThread

MODEL = "fake/contract-worker"  # the fake worker's model_path: the name the response layer serves


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` with these labels (others, such as worker and
    model_name, are ignored) in a /metrics text; 0.0 when there is none."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@dataclass
class Stack:
    upstream: str
    url: str
    fake: FakeState
    serve: ServeState


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok"))


@contextmanager
def make_stack(tokenizer_dir: Path, fake: FakeConfig | None = None, **serve: Any) -> Iterator[Stack]:
    """A contract fake worker and a response layer in front of it, each on a free loopback port."""
    worker = create_fake_worker(fake or FakeConfig(), tokenizer_dir)
    # Client, response layer and worker share this process (and its GIL): a generous liveness
    # deadline unless a test sets one, so a starved event loop is not taken for a hung worker.
    serve.setdefault("probe_timeout", 30.0)
    with ServerThread(worker) as up:
        app = create_app(ServeConfig(upstream=up, **serve))
        with ServerThread(app) as url:
            yield Stack(up, url, worker.state.fake, app.state.serve)


@pytest.fixture(scope="module", params=["cumulative", "incremental"])
def stack(request: pytest.FixtureRequest, tokenizer_dir: Path) -> Iterator[Stack]:
    with make_stack(tokenizer_dir, FakeConfig(incremental=request.param == "incremental", stream_interval=1),
                    stream_interval=1) as s:
        yield s
