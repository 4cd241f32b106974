"""Prometheus text exposition through prometheus_client: metric families in, the text format out.

The daemon's and the pd-proxy's figures are read fresh on every scrape (store counters, ledgers, pools), so
each scrape builds its families and renders them with `render`; prometheus_client writes the format
(names, types, label escaping, numbers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["CONTENT_TYPE", "counter", "gauge", "parse_samples", "render", "sample"]
CONTENT_TYPE = CONTENT_TYPE_LATEST
Samples = Iterable[tuple[Sequence[str], float]]


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: Iterable[Metric]) -> bytes:
    """The text format of `families`, in order."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families)))
    return generate_latest(registry)


def counter(name: str, help_text: str, samples: Samples = (), labels: Sequence[str] = ()) -> CounterMetricFamily:
    """A counter family (`name` without `_total`: the format adds it) with one sample per label-value tuple."""
    family = CounterMetricFamily(name, help_text, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def gauge(name: str, help_text: str, samples: Samples = (), labels: Sequence[str] = ()) -> GaugeMetricFamily:
    """A gauge family with one sample per label-value tuple."""
    family = GaugeMetricFamily(name, help_text, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def parse_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text -> {(sample name, its labels): value}, through prometheus_client's parser (any label order)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(text: str, name: str, **labels: str) -> float:
    """The value of sample `name` whose labels are exactly `labels` (0.0 when there is none)."""
    return parse_samples(text).get((name, frozenset(labels.items())), 0.0)
