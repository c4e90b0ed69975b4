"""A rank's batch events as int64 columns, from the wire to the correlator (issue 29).

The hook sends its events as columns (hook/wire.py version 2: t_end, wait, interval and,
from a trainer that splits its waits, the ready wait); validation checks them as
columns, the rank table's timeline keeps them as columns, and the correlator's trace
takes them as columns (``RankTrace.from_columns``): no transpose to rows and back.
A report's columns (``BatchColumns``) are the part contract's (host/report.py), which
the parts outside the agent read too; the timeline here keeps them.
"""
from __future__ import annotations

import bisect

import numpy as np

from ...host.report import BatchColumns

__all__ = ["BatchColumns", "BatchTimeline"]


class BatchTimeline:
    """The last ``capacity`` batch events of a rank, kept as columns: one (4, capacity)
    int64 ring (t_end, wait, interval, ready; ready -1 where the hook did not split the
    wait), so a window comes out as one copy whose rows are contiguous columns. (Four
    (capacity, 1) host rings would copy a window an element at a time: numpy's copy loop
    runs over the inner dimension, of length 1 there.) Like host/rings.py Ring, it
    commits its pages at once and drops the oldest events when full."""

    __slots__ = ("buf", "start", "n")

    def __init__(self, capacity: int) -> None:
        self.buf: np.ndarray = np.empty((4, max(1, capacity)), np.int64)
        self.buf.fill(0)  # commit the pages now (np.zeros would map them lazily)
        self.start = 0   # index of the oldest event
        self.n = 0       # events held

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes)

    def __len__(self) -> int:
        return self.n

    def extend(self, batches: BatchColumns) -> None:
        """Append the events; the oldest go when the ring is full."""
        k = len(batches)
        if not k:
            return
        cap = self.capacity
        cols = (batches.t_end, batches.wait, batches.interval, batches.ready_or_unsplit())
        if k >= cap:
            for row, col in zip(self.buf, cols):
                row[:] = col[k - cap:]
            self.start, self.n = 0, cap
            return
        end = (self.start + self.n) % cap
        first = min(k, cap - end)
        for row, col in zip(self.buf, cols):
            row[end:end + first] = col[:first]
            if first < k:
                row[:k - first] = col[first:]
        overflow = max(0, self.n + k - cap)
        self.start = (self.start + overflow) % cap
        self.n = min(cap, self.n + k)

    def _segments(self) -> tuple[np.ndarray, np.ndarray]:
        """The events held, oldest first, as two (4, m) views (the second empty unless
        they wrap)."""
        cap = self.capacity
        end = self.start + self.n
        if end <= cap:
            return self.buf[:, self.start:end], self.buf[:, :0]
        return self.buf[:, self.start:], self.buf[:, :end - cap]

    def first_at(self, horizon_ns: int) -> int:
        """Index (oldest = 0) of the first event that ended at or after ``horizon_ns``.
        Events arrive nearly in time order: a binary search on each segment's times."""
        old, new = self._segments()
        m = int(old.shape[1])
        if m and old[0, -1] >= horizon_ns:
            return bisect.bisect_left(old[0], horizon_ns)
        return m + bisect.bisect_left(new[0], horizon_ns)

    def tail(self, k: int) -> BatchColumns:
        """Events from index ``k`` (oldest = 0) to the newest: one copy of just those."""
        old, new = self._segments()
        m = old.shape[1]
        cols = new[:, k - m:].copy() if k >= m else np.concatenate((old[:, k:], new), axis=1)
        return BatchColumns(cols[0], cols[1], cols[2], cols[3])

    def since(self, horizon_ns: int) -> BatchColumns:
        """Events that ended at or after ``horizon_ns``, oldest first."""
        return self.tail(self.first_at(horizon_ns))

    def newest(self) -> tuple[int, int, int] | None:
        """(t_end, wait, interval) of the newest event, or None."""
        if not self.n:
            return None
        i = (self.start + self.n - 1) % self.capacity
        return int(self.buf[0, i]), int(self.buf[1, i]), int(self.buf[2, i])

    def rows(self) -> np.ndarray:
        """Every event held as (n, 4) rows of (t_end, wait, interval, ready), for tests."""
        return self.tail(0).rows(ready=True)
