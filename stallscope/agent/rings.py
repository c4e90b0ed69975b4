"""Fixed-capacity ring buffers of numbers: the agent's per-rank history, bounded in bytes.

A ring allocates its capacity once and touches every page of it then (numpy arrays: 8
bytes a number): a rank's history is committed the moment the rank appears instead of
creeping into RSS for --timeline-seconds while the rings fill, so a memory limit set
from the printed ceiling is met or missed at once. It appends whole batches with one
copy, and hands out a time window as arrays
in arrival order, so the correlator needs no conversion and the agent's memory has a
ceiling that ``--max-ranks`` and ``--timeline-seconds`` fix (see budget.py).
"""
from __future__ import annotations

import numpy as np

Arrays = tuple[np.ndarray, ...]


class Ring:
    """Rows of ``width`` numbers of one dtype; column 0 is a CLOCK_MONOTONIC time (ns)."""

    __slots__ = ("buf", "start", "n")

    def __init__(self, capacity: int, width: int, dtype: type = np.int64) -> None:
        self.buf: np.ndarray = np.empty((max(1, capacity), width), dtype)
        self.buf.fill(0)  # commit the pages now (np.zeros would map them lazily)
        self.start = 0   # index of the oldest row
        self.n = 0       # rows held

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes)

    def __len__(self) -> int:
        return self.n

    def extend(self, rows: np.ndarray) -> None:
        """Append ``rows`` (k x width); the oldest rows go when the ring is full."""
        cap = self.capacity
        k = len(rows)
        if k == 0:
            return
        if k >= cap:
            self.buf[:] = rows[k - cap:]
            self.start, self.n = 0, cap
            return
        end = (self.start + self.n) % cap
        first = min(k, cap - end)
        self.buf[end:end + first] = rows[:first]
        if first < k:
            self.buf[:k - first] = rows[first:]
        overflow = max(0, self.n + k - cap)
        self.start = (self.start + overflow) % cap
        self.n = min(cap, self.n + k)

    def rows(self) -> np.ndarray:
        """Every row held, oldest first (a copy)."""
        cap = self.capacity
        end = self.start + self.n
        if end <= cap:
            return self.buf[self.start:end].copy()
        return np.concatenate((self.buf[self.start:], self.buf[:end - cap]))

    def since(self, horizon_ns: int) -> np.ndarray:
        """Rows whose time is at or after ``horizon_ns``, oldest first (a copy). Rows
        arrive nearly in time order; the window's edge is cut by binary search."""
        rows = self.rows()
        if len(rows) and rows[0, 0] < horizon_ns:
            rows = rows[int(np.searchsorted(rows[:, 0], horizon_ns, side="left")):]
        return rows

    def last_time(self) -> int:
        if not self.n:
            return 0
        return int(self.buf[(self.start + self.n - 1) % self.capacity, 0])

    def clear(self) -> None:
        self.start = self.n = 0


class PointRing:
    """(time ns, value) points: int64 times and float64 values in two rings."""

    __slots__ = ("t", "v")

    def __init__(self, capacity: int) -> None:
        self.t = Ring(capacity, 1, np.int64)
        self.v = Ring(capacity, 1, np.float64)

    @property
    def nbytes(self) -> int:
        return self.t.nbytes + self.v.nbytes

    def __len__(self) -> int:
        return len(self.t)

    def extend(self, t: np.ndarray, v: np.ndarray) -> None:
        self.t.extend(t.reshape(-1, 1))
        self.v.extend(v.reshape(-1, 1))

    def since(self, horizon_ns: int) -> tuple[np.ndarray, np.ndarray]:
        t, v = self.t.rows()[:, 0], self.v.rows()[:, 0]
        if len(t) and t[0] < horizon_ns:
            k = int(np.searchsorted(t, horizon_ns, side="left"))
            t, v = t[k:], v[k:]
        return t, v
