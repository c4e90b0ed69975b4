"""A Prometheus histogram accumulated in nanoseconds: the agent keeps each rank's
histograms itself, so a restarted training process continues the same counters."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Histogram:
    __slots__ = ("bounds_ns", "bounds", "edges", "counts", "sum_ns", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.bounds_ns = tuple(int(b * 1e9) for b in bounds)
        self.edges = np.asarray(self.bounds_ns, np.int64)  # built once, not per report
        self.counts = [0] * (len(bounds) + 1)
        self.sum_ns = 0
        self.count = 0

    def observe_ns(self, value: int) -> None:
        i = 0
        for b in self.bounds_ns:
            if value <= b:
                break
            i += 1
        self.counts[i] += 1
        self.sum_ns += value
        self.count += 1

    def observe_many_ns(self, values: np.ndarray) -> None:
        """Observe every value of an int64 array at once (a report's batches)."""
        if not len(values):
            return
        # side="left": a value equal to a bound belongs to that bucket (le is inclusive).
        idx = np.searchsorted(self.edges, values, side="left")
        for i, c in enumerate(np.bincount(idx, minlength=len(self.counts)).tolist()):
            self.counts[i] += c
        self.sum_ns += int(values.sum())
        self.count += len(values)

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, cumulative count)] in the form prometheus_client's families take."""
        out, acc = [], 0
        for b, c in zip(self.bounds + (float("inf"),), self.counts):
            acc += c
            out.append(("+Inf" if b == float("inf") else repr(b), acc))
        return out
