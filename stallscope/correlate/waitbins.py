"""A rank's steady waits and steps summed into one-second bins as its batches arrive:
the input of the change-point detector (detect.py).

The agent tests every rank every second. Built from the rank's batch events, each test
binned the last five minutes again: 30,000 events at 100 batches/s, ~0.6 ms a rank a
second, most of the agent's analysis thread at 8 ranks x 8 workers with every rank
waiting (issue 15). The bins are all the test reads, so the agent keeps them at ingest
(one bincount per report) and a test costs the same at 1 batch/s or 1,000.

Bins are whole seconds of CLOCK_MONOTONIC (the hook's clock, and the agent's), so a
stall's start lands on the same second from one test to the next. Iterator starts
(interval == wait: worker start-up, overlap.iterator_starts) are left out, as the
detector leaves them out. A ring of HORIZON_BINS + 1 slots keeps the newest seconds;
a batch older than the ring, or dated more than a second ahead of the agent's clock (a
sender's bad clock, or a hostile one), is not binned, so it cannot evict real seconds.
"""
from __future__ import annotations

import numpy as np

BIN_NS = 1_000_000_000
HORIZON_BINS = 300


class Window:
    """The bins of the last HORIZON_BINS seconds up to now, oldest first, starting at the
    oldest second that holds a batch: ``first`` is that second (ns // BIN_NS); ``wait``
    and ``step`` are sums in seconds, ``count`` the batches."""

    __slots__ = ("first", "wait", "step", "count")

    def __init__(self, first: int, wait: np.ndarray, step: np.ndarray, count: np.ndarray) -> None:
        self.first, self.wait, self.step, self.count = first, wait, step, count

    def __len__(self) -> int:
        return len(self.wait)

    @property
    def batches(self) -> int:
        return int(self.count.sum())


class WaitBins:
    __slots__ = ("ids", "sums", "newest")

    def __init__(self, size: int = HORIZON_BINS + 1) -> None:
        self.ids = np.full(size, -1, np.int64)        # the second each slot holds
        self.sums = np.zeros((size, 3), np.float64)  # wait ns, step ns, batches
        self.newest = -1                              # the newest second held

    @classmethod
    def of_events(cls, t_end: np.ndarray, wait: np.ndarray, step: np.ndarray, now_ns: int) -> WaitBins:
        bins = cls()
        bins.add(t_end, wait, step, now_ns)
        return bins

    def add(self, t_end: np.ndarray, wait: np.ndarray, step: np.ndarray, now_ns: int) -> None:
        """Bin a report's batches (int64 ns arrays); ``now_ns``: the agent's clock. A
        report spans a second or two: a few numpy calls and a Python step per second it
        touches (the ingest pays this per report, issue 15)."""
        steady = step != wait
        if not steady.all():
            t_end, wait, step = t_end[steady], wait[steady], step[steady]
        if not len(t_end):
            return
        sids = t_end // BIN_NS
        lo, hi = int(sids.min()), int(sids.max())
        size = len(self.ids)
        first = max(lo, min(hi, now_ns // BIN_NS + 1) - size + 1, self.newest - size + 1)
        if first > lo or hi > now_ns // BIN_NS + 1:  # outside the ring, or ahead of the clock
            keep = (sids >= first) & (sids <= now_ns // BIN_NS + 1)
            sids, wait, step = sids[keep], wait[keep], step[keep]
            if not len(sids):
                return
            lo, hi = int(sids.min()), int(sids.max())
        if lo == hi:
            self._add(lo, float(wait.sum()), float(step.sum()), len(sids))
            return
        where = sids - lo
        w = np.bincount(where, weights=wait).tolist()
        s = np.bincount(where, weights=step).tolist()
        for i, n in enumerate(np.bincount(where).tolist()):
            if n:
                self._add(lo + i, w[i], s[i], n)

    def _add(self, second: int, wait: float, step: float, n: int) -> None:
        slot = second % len(self.ids)
        held = int(self.ids[slot])
        if held != second:
            if held > second:
                return  # the slot holds a newer second: this one has left the ring
            self.ids[slot] = second
            self.sums[slot] = 0.0
            self.newest = max(self.newest, second)
        row = self.sums[slot]
        row[0] += wait
        row[1] += step
        row[2] += n

    def window(self, now_ns: int, horizon: int = HORIZON_BINS) -> Window:
        """The last ``horizon`` seconds up to ``now_ns``'s, trimmed to the oldest that
        holds a batch (a copy)."""
        now_sid = now_ns // BIN_NS
        seconds = np.arange(now_sid - horizon + 1, now_sid + 1)
        slots = seconds % len(self.ids)
        sums = np.where((self.ids[slots] == seconds)[:, None], self.sums[slots], 0.0)
        held = np.nonzero(sums[:, 2])[0]
        start = int(held[0]) if len(held) else horizon
        sums = sums[start:]
        return Window(int(now_sid - horizon + 1 + start), sums[:, 0] / 1e9, sums[:, 1] / 1e9,
                      sums[:, 2].astype(np.int64))

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.sums.nbytes)

    def copy(self) -> WaitBins:
        other = WaitBins.__new__(WaitBins)
        other.ids, other.sums, other.newest = self.ids.copy(), self.sums.copy(), self.newest
        return other
