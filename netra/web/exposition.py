"""Prometheus exposition shared by the worker server and the response layer: every series a Netra process
exposes carries ``worker`` and ``model_name`` labels, added at exposition time by `WithLabels`, so the
front can put all workers' series in one scrape (netra/deploy/metrics.py) and Prometheus never sees two
processes as one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST


class WithLabels(Collector):
    """Every sample of ``registry`` with ``labels()`` added (evaluated at each scrape)."""

    def __init__(self, registry: CollectorRegistry, labels: Callable[[], dict[str, str]]) -> None:
        self.registry = registry
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        extra = self.labels()
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                out.add_sample(sample.name, {**extra, **sample.labels}, sample.value, sample.timestamp,
                               sample.exemplar)
            yield out


def labelled_exposition(registry: CollectorRegistry, labels: Callable[[], dict[str, str]]) -> Callable[[], bytes]:
    """A function rendering ``registry`` in the text format with ``labels()`` on every series."""
    outer = CollectorRegistry(auto_describe=False)
    outer.register(WithLabels(registry, labels))
    return lambda: generate_latest(outer)
