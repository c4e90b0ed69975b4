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

import bisect

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

    def append(self, value: float) -> None:
        """Append one row of a width-1 ring: one item store, no array built (the
        exporters record a value at a time, thousands a minute)."""
        cap = self.buf.shape[0]
        self.buf[(self.start + self.n) % cap, 0] = value
        if self.n < cap:
            self.n += 1
        else:
            self.start = (self.start + 1) % cap

    def rows(self) -> np.ndarray:
        """Every row held, oldest first (a copy)."""
        cap = self.capacity
        end = self.start + self.n
        if end <= cap:
            return self.buf[self.start:end].copy()
        return np.concatenate((self.buf[self.start:], self.buf[:end - cap]))

    def _segments(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows held, oldest first, as two views (the second empty unless they wrap)."""
        cap = self.capacity
        end = self.start + self.n
        if end <= cap:
            return self.buf[self.start:end], self.buf[:0]
        return self.buf[self.start:], self.buf[:end - cap]

    def first_at(self, horizon_ns: int) -> int:
        """Index (oldest = 0) of the first row whose time is at or after ``horizon_ns``.
        Rows arrive nearly in time order; the edge is found by binary search on each
        segment's time column, a view (np.searchsorted would copy a strided column)."""
        old, new = self._segments()
        if len(old) and old[-1, 0] >= horizon_ns:
            return bisect.bisect_left(old[:, 0], horizon_ns)
        return len(old) + bisect.bisect_left(new[:, 0], horizon_ns)

    def tail(self, k: int) -> np.ndarray:
        """Rows from index ``k`` (oldest = 0) to the newest, a copy of just those: a
        window's copy, not the whole ring's (the correlator cuts short windows out of
        long rings several times a second; copying whole rings churned the heap)."""
        old, new = self._segments()
        if k >= len(old):
            return new[k - len(old):].copy()
        return np.concatenate((old[k:], new))

    def since(self, horizon_ns: int) -> np.ndarray:
        """Rows whose time is at or after ``horizon_ns``, oldest first (a copy)."""
        return self.tail(self.first_at(horizon_ns))

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

    def append(self, t_ns: int, value: float) -> None:
        self.t.append(t_ns)
        self.v.append(value)

    def since(self, horizon_ns: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.t.first_at(horizon_ns)
        return self.t.tail(k)[:, 0], self.v.tail(k)[:, 0]
