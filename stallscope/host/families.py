"""Metric families built from the vocabulary's declarations: a part names the metric,
the declaration gives its type, help, label names and buckets. Label values are given
by name (a mapping, e.g. ``rank.labels``, plus keywords); a name neither gives is empty.
Only declared metrics can be built, so a part cannot emit an undeclared one.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample

from .. import vocabulary
from ..vocabulary.labels import values

_KIND = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
         "histogram": HistogramMetricFamily}
NO_LABELS: Mapping[str, str] = {}


class Family:
    __slots__ = ("metric", "family")

    def __init__(self, name: str) -> None:
        self.metric = vocabulary.metric(name)
        self.family = _KIND[self.metric.kind](self.metric.family_name, self.metric.help,
                                              labels=list(self.metric.labels))

    def add(self, labels: Mapping[str, Any], value: float, **extra: Any) -> None:
        self.family.add_metric(values(self.metric.labels, labels, **extra), value)

    def add_histogram(self, labels: Mapping[str, Any], buckets: Sequence[tuple[str, float]],
                      sum_value: float, **extra: Any) -> None:
        """The samples HistogramMetricFamily.add_metric appends (the same names, label
        dicts and values, in its order), with the identity labels zipped once rather than
        once a bucket: at 256 ranks its add_metric was a quarter of a scrape's time."""
        f = self.family
        base = dict(zip(self.metric.labels, values(self.metric.labels, labels, **extra)))
        bucket = f.name + "_bucket"
        append = f.samples.append
        for b in buckets:
            append(Sample(bucket, {**base, "le": b[0]}, b[1], None, b[2] if len(b) == 3 else None))
        if float(buckets[0][0]) >= 0 and sum_value is not None:  # as add_metric: no sum if le < 0
            append(Sample(f.name + "_count", dict(base), buckets[-1][1], None))
            append(Sample(f.name + "_sum", dict(base), sum_value, None))

    def add_values(self, label_values: tuple[str, ...], value: float) -> None:
        """Label values already in the declared order (hot loops over many series)."""
        self.family.add_metric(label_values, value)


def family(name: str) -> Family:
    return Family(name)


def unwrap(fams: Iterable[Family]) -> list[Any]:
    return [f.family for f in fams]


def buckets(name: str) -> tuple[float, ...]:
    return vocabulary.metric(name).buckets
