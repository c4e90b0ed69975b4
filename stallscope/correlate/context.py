"""One rank's analysis inputs, each computed once (issue 29: the iterator-start mask was
computed three or four times and a WaitIndex built up to three times per rank per
analysis, one for each function that needed it).

``trace`` is the part judged (a detected stall's segment, or the whole window) and
``whole`` the window the signals' co-occurrence is judged over (its earlier part gives
the quiet time to compare against). Every derived array is a cached property: a rank
that is not input-bound never builds the steady-batch indexes.
"""
from __future__ import annotations

import functools

import numpy as np

from .overlap import InputBound, input_bound, iterator_starts
from .period import StallPeriod, stall_period
from .trace import RankTrace, WaitIndex


class Context:
    def __init__(self, trace: RankTrace, whole: RankTrace | None = None) -> None:
        self.trace = trace
        self.whole = whole if whole is not None else trace

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """The judged batches that start an iterator (overlap.iterator_starts)."""
        return iterator_starts(self.trace)

    @functools.cached_property
    def steady(self) -> np.ndarray:
        return ~self.starts

    @functools.cached_property
    def waits(self) -> WaitIndex:
        return WaitIndex(self.trace.t_end, self.trace.wait)

    @functools.cached_property
    def steady_waits(self) -> WaitIndex:
        if self.steady.all():
            return self.waits
        return WaitIndex(self.trace.t_end[self.steady], self.trace.wait[self.steady])

    @functools.cached_property
    def whole_steady_waits(self) -> WaitIndex:
        if self.whole is self.trace:
            return self.steady_waits
        steady = ~iterator_starts(self.whole)
        return WaitIndex(self.whole.t_end[steady], self.whole.wait[steady])

    @functools.cached_property
    def loop(self) -> InputBound:
        return input_bound(self.trace, self.waits, self.starts)

    @functools.cached_property
    def period(self) -> StallPeriod:
        return stall_period(self.trace, steady=self.steady)
