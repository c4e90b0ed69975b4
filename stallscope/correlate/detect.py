"""When did this rank start waiting on its loader? An incremental change-point test on
the data-wait share, so a stall is named within seconds instead of after it has filled a
whole analysis window.

The rank's steady batches (iterator starts left out: worker start-up is not a stall) are
summed into one-second bins, oldest first (waitbins.py: the agent keeps them as batches
arrive, so a test reads HORIZON_BINS numbers, not five minutes of batches). In each bin
the *excess* is the wait beyond the data-wait line: ``wait - line x step``. Its
cumulative sum falls while the rank waits less than the line and rises while it waits
more; the stall began after the sum's lowest point (the CUSUM change-point estimate,
Page 1954), searched since the last QUIET_BINS seconds in a row that stayed under the
line (an earlier stall that ended is not this one). When the newest QUIET_BINS seconds
are under the line, there is no stall now. Otherwise the segment from the start to now
is a stall when

- it waited at least the line's share of its step time, with at least MIN_EXCESS_S
  seconds of waiting beyond it and MIN_BATCHES batches, and
- the share is above the line by Z standard errors of the per-bin shares (a few slow
  batches in an otherwise healthy minute do not make a stall).

A 50 % stall is named in ~2 s, a 10 % one in ~6 s (benchmarks/bench_agent.py measures
it). The cause ranking then looks at the stall's own segment, not at the healthy
minutes before it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..vocabulary import DATA_WAIT_LINE
from .trace import RankTrace
from .waitbins import BIN_NS, WaitBins, Window

MIN_BATCHES = 10
MIN_BINS = 3
MIN_EXCESS_S = 0.25
QUIET_BINS = 5
HANG_BINS = 5    # one wait this long is a stall by itself (a hang in next())
Z = 3.0


@dataclasses.dataclass
class Detection:
    stalled: bool
    since_ns: int | None        # start of the segment judged (CLOCK_MONOTONIC)
    share: float                   # its data-wait share
    batches: int
    excess_seconds: float          # waiting beyond the line in the segment
    z: float                       # (share - line) / standard error of the bins' shares

    def as_json(self, now_ns: int) -> dict[str, Any]:
        return {"stalled": self.stalled, "since_ns": self.since_ns,
                "since_seconds_ago": (None if self.since_ns is None
                                      else round((now_ns - self.since_ns) / 1e9, 3)),
                "data_wait_ratio": round(self.share, 6), "batches": self.batches,
                "excess_seconds": round(self.excess_seconds, 3), "z": round(self.z, 3)}


NONE = Detection(False, None, 0.0, 0, 0.0, 0.0)
_QUIET_ONES = np.ones(QUIET_BINS)


def _sd(x: np.ndarray) -> float:
    """x.std(ddof=1), the same operations as numpy's _var (sum, divide, subtract,
    square, sum, divide) without its Python-level wrapper: every rank is judged every
    second, and the wrapper was a third of the agent's detection CPU."""
    dev = x - x.sum() / len(x)
    np.multiply(dev, dev, out=dev)
    return math.sqrt(dev.sum() / (len(x) - 1))


def _hang(last: tuple[int, int, int], now_ns: int) -> Detection | None:
    """The newest batch waited HANG_BINS seconds or more (the agent's timeline ends with a
    call still blocked in next(), as far as it has lasted): a stall since that call
    began. The bins cannot show it: one wait, however long, is one batch in one bin."""
    t_end, wait, step = last
    if wait < HANG_BINS * BIN_NS or now_ns - t_end >= QUIET_BINS * BIN_NS or step <= 0:
        return None
    return Detection(True, t_end - wait, wait / step, 1, wait / 1e9, float("inf"))


def detect(trace: RankTrace, now_ns: int, line: float = DATA_WAIT_LINE) -> Detection:
    """The latest stall of ``trace`` (a RankTrace) as of ``now_ns``."""
    if trace.n < 2:
        return NONE
    bins = WaitBins.of_events(trace.t_end, trace.wait, trace.interval, now_ns)
    last = (int(trace.t_end[-1]), int(trace.wait[-1]), int(trace.interval[-1]))
    return judge(bins.window(now_ns), last, now_ns, line)


def judge(window: Window, last: tuple[int, int, int] | None, now_ns: int,
          line: float = DATA_WAIT_LINE) -> Detection:
    """The test on a rank's bins (waitbins.py; the agent keeps them as batches come).
    ``last``: its newest batch, or the call still blocked in next(); None when the rank
    has fewer than two batches."""
    if last is None:
        return NONE
    hung = _hang(last, now_ns)
    if hung is not None:
        return hung
    if window.batches < MIN_BATCHES:
        return NONE
    w, s, n = window.wait, window.step, window.count
    bins = len(w)
    excess = w - line * s
    cum = np.concatenate(([0.0], np.cumsum(excess)))
    first = 0
    if bins >= QUIET_BINS:
        rw = np.convolve(w, _QUIET_ONES, "valid")
        rs = np.convolve(s, _QUIET_ONES, "valid")
        quiet = (rs > 0) & (rw < line * rs)   # windows ending at QUIET_BINS-1, QUIET_BINS, ...
        if quiet[-1]:
            return NONE                        # the newest seconds stayed under the line
        ended = np.nonzero(quiet)[0]
        if len(ended):
            first = int(ended[-1]) + QUIET_BINS  # the bin after the last quiet stretch
    start = first + int(np.argmin(cum[first:]))  # the stall's first bin: the sum's lowest point
    seg = slice(start, bins)
    ws, ss, ns = float(w[seg].sum()), float(s[seg].sum()), int(n[seg].sum())
    if ss <= 0 or ns == 0:
        return NONE
    share = ws / ss
    excess_s = float(cum[-1] - cum[start])
    live = s[seg] > 0
    shares = w[seg][live] / s[seg][live]
    k = len(shares)
    se = _sd(shares) / math.sqrt(k) if k > 1 else float("inf")
    z = (share - line) / se if se > 0 else (float("inf") if share > line else 0.0)
    stalled = bool(share >= line and excess_s >= MIN_EXCESS_S and ns >= MIN_BATCHES
                   and k >= MIN_BINS and z >= Z)  # a numpy bool would reach the JSON as "True"
    since = (window.first + start) * BIN_NS
    return Detection(stalled, since, share, ns, excess_s, float(min(z, 1e6)))
