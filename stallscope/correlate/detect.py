"""When did this rank start waiting on its loader? An incremental change-point test on
the data-wait share, so a stall is named within seconds instead of after it has filled a
whole analysis window.

The rank's steady batches (iterator starts left out: worker start-up is not a stall) are
summed into one-second bins, oldest first. In each bin the *excess* is the wait beyond
the data-wait line: ``wait - line x step``. Its cumulative sum falls while the rank waits
less than the line and rises while it waits more; the stall began after the sum's
lowest point (the CUSUM change-point estimate, Page 1954), searched since the last
QUIET_BINS seconds in a row that stayed under the line (an earlier stall that ended is
not this one). When the newest QUIET_BINS seconds are under the line, there is no stall
now. Otherwise the segment from the start to now is a stall when

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
from typing import Any

import numpy as np

from ..vocabulary import DATA_WAIT_LINE
from .overlap import iterator_starts

BIN_NS = 1_000_000_000
HORIZON_BINS = 300
MIN_BATCHES = 10
MIN_BINS = 3
MIN_EXCESS_S = 0.25
QUIET_BINS = 5
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


def detect(trace: Any, now_ns: int, line: float = DATA_WAIT_LINE) -> Detection:
    """The latest stall of ``trace`` (a RankTrace) as of ``now_ns``."""
    if trace.n < 2:
        return NONE
    steady = ~iterator_starts(trace)
    t, wait, step = trace.t_end[steady], trace.wait[steady], trace.interval[steady]
    age = (now_ns - t) // BIN_NS
    keep = (age >= 0) & (age < HORIZON_BINS)
    if keep.sum() < MIN_BATCHES:
        return NONE
    age, wait, step = age[keep], wait[keep], step[keep]
    bins = int(age.max()) + 1
    # oldest first: index 0 is the oldest bin that holds a batch
    idx = bins - 1 - age
    w = np.bincount(idx, weights=wait, minlength=bins) / 1e9
    s = np.bincount(idx, weights=step, minlength=bins) / 1e9
    n = np.bincount(idx, minlength=bins)
    excess = w - line * s
    cum = np.concatenate(([0.0], np.cumsum(excess)))
    first = 0
    if bins >= QUIET_BINS:
        rw = np.convolve(w, np.ones(QUIET_BINS), "valid")
        rs = np.convolve(s, np.ones(QUIET_BINS), "valid")
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
    se = float(shares.std(ddof=1)) / np.sqrt(k) if k > 1 else float("inf")
    z = (share - line) / se if se > 0 else (float("inf") if share > line else 0.0)
    stalled = bool(share >= line and excess_s >= MIN_EXCESS_S and ns >= MIN_BATCHES
                   and k >= MIN_BINS and z >= Z)  # a numpy bool would reach the JSON as "True"
    since = int(now_ns - (bins - start) * BIN_NS)
    return Detection(stalled, since, share, ns, excess_s, float(min(z, 1e6)))


def quiet_now(events: Any, now_ns: int, line: float = DATA_WAIT_LINE) -> bool:
    """True when ``detect`` would find no stall because the newest QUIET_BINS seconds
    stayed under the line, judged from just those seconds of ``events`` (an (n, 3)
    array of t_end, wait, interval; the last QUIET_BINS + 1 seconds suffice). The agent
    asks this of every rank every second and runs the whole test only on the others:
    a healthy node costs a few seconds of events per rank, not five minutes (issue 15).
    False whenever it cannot tell (then the whole test decides)."""
    if len(events) == 0:
        return False
    t, wait, step = events[:, 0], events[:, 1], events[:, 2]
    steady = step != wait                      # iterator starts left out, as in detect()
    age = (now_ns - t[steady]) // BIN_NS
    if not (age >= QUIET_BINS).any():
        return False  # the rank's history may be shorter than the quiet stretch
    recent = (age >= 0) & (age < QUIET_BINS)
    s = float(step[steady][recent].sum())
    return s > 0 and float(wait[steady][recent].sum()) < line * s
