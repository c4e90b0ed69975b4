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

from . import transfer, workers
from .overlap import InputBound, input_bound, iterator_starts
from .period import StallPeriod, stall_period
from .trace import RankTrace, WaitIndex

HUNG_MIN_S = 1.0   # blocked in next() this long, and HUNG_STEPS of its steps, is a hang
# Three steps, not ten (issue 49, item 3: a rank of 4.5 s steps hung on a frozen mount
# read "unknown" on the agent for its first 45 s, and diagnose, which judged it stuck,
# dropped the agent's causes with its verdict): what the loop's workers are blocked in
# names the cause from the hang's first seconds (budget.py), so the hang is judged as
# soon as it is longer than a slow step can be.
HUNG_STEPS = 3


# A rank blocked in next() since before its first batch has no step to compare with:
# longer than this, it is not its workers starting (forks, imports, opening the dataset)
# but a hang (issue 49: a /dev/shm with room for one batch read "unknown, only 1 batch")
HUNG_START_S = 10.0


def hung(trace: RankTrace) -> bool:
    """The rank is blocked in next() now (the agent's open wait) for longer than its steps
    take: at least HUNG_MIN_S and HUNG_STEPS times its median interval; with no step
    before it, at least HUNG_START_S."""
    if trace.open_ns is None or trace.n < 1 or int(trace.t_end[-1]) != trace.open_ns:
        return False
    blocked = float(trace.wait[-1]) / 1e9
    if trace.n < 2:
        return blocked >= HUNG_START_S
    typical = float(np.median(trace.interval[:-1])) / 1e9
    return blocked >= max(HUNG_MIN_S, HUNG_STEPS * typical)


class Context:
    def __init__(self, trace: RankTrace, whole: RankTrace | None = None) -> None:
        self.trace = trace
        self.whole = whole if whole is not None else trace

    @functools.cached_property
    def hung(self) -> bool:
        """The judged trace ends in a hang (hung()): what holds the loop now is its open wait."""
        return hung(self.trace)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """The judged batches that start an iterator (overlap.iterator_starts); a hang's
        open wait is not one, whatever batch it waits for (a rank hung before its first
        batch is not starting: HUNG_START_S)."""
        out = iterator_starts(self.trace)
        if self.hung and out[-1]:
            out = out.copy()
            out[-1] = False
        return out

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
    def split(self) -> tuple[int, float, float, float, float] | None:
        """The steady waits split by the hook into ready wait and handoff (transfer.split)."""
        return transfer.split(self.trace, self.steady)

    @functools.cached_property
    def busy(self) -> tuple[str | None, float | None]:
        """(scope, each worker's CPU share during the stalls): workers.busy_share."""
        return workers.busy_share(self.trace, self.steady_waits)

    @functools.cached_property
    def runnable(self) -> tuple[float, float] | None:
        """(on a CPU, waiting for one) of the workers during the stalls: workers.runnable_split."""
        return workers.runnable_split(self.trace, self.steady_waits)

    @functools.cached_property
    def loop(self) -> InputBound:
        return input_bound(self.trace, self.waits, self.starts)

    @functools.cached_property
    def period(self) -> StallPeriod:
        return stall_period(self.trace, steady=self.steady)
