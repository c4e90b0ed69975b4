"""Bounded timelines of the node's own signals, for the correlator and the API.

Parts call ``record(scope, signal, value)`` each time they read a signal (or
``record_many`` for a report's worth of per-batch samples); the correlator reads
``window(scope, signal, seconds)`` as arrays and lines them up with the hook's batch
events, which use the same clock (CLOCK_MONOTONIC ns).

Conventions, so that every consumer reads every producer the same way:
- scope: a rank's key for signals attributed to a rank (its cgroup's throttling, its
  /dev/shm, its FUSE mounts, its workers); ``"node"`` for node-wide signals;
  ``("gpu", uuid)`` for a GPU.
- signal: a name the vocabulary declares (stallscope/vocabulary/); its cadence sizes
  its ring (budget.py), so the store's bytes are bounded by the scopes it holds.
- value: a level or a rate over the interval since the previous reading (e.g. throttled
  seconds per second), never a raw cumulative counter, so any window can be averaged.
- time: each (scope, signal) is recorded roughly in time order; per-batch samples from
  several loader workers interleave within a flush interval. A window is cut by binary
  search, so its edge is fuzzy by that much; consumers sort when they need order.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ...host.rings import PointRing
from .budget import Budget

Point = tuple[int, float]


class SampleStore:
    def __init__(self, seconds: float = 900.0, budget: Budget | None = None) -> None:
        self.horizon_ns = int(seconds * 1e9)
        self.budget = budget or Budget(1, seconds)
        self.lock = threading.Lock()
        self.data: dict[tuple[Any, str], PointRing] = {}
        self.scopes: dict[Any, int] = {}  # scope -> its rings
        self.evicted = 0

    def _ring(self, scope: Any, signal: str) -> PointRing:
        ring = self.data.get((scope, signal))
        if ring is None:
            if scope not in self.scopes and len(self.scopes) >= self.budget.max_scopes:
                self._evict_stalest()
            ring = self.data[(scope, signal)] = PointRing(self.budget.signal_capacity(signal))
            self.scopes[scope] = self.scopes.get(scope, 0) + 1
        return ring

    def _evict_stalest(self) -> None:
        """Make room for a new scope: drop the scope whose newest point is oldest. Live
        ranks record every collection; a departed rank's scopes (its simulated GPU's,
        issue 33: 10,000 churned ranks kept +1.35 GB for 900 s) are the stalest. So the
        scopes the store keeps are bounded by the budget, not only by time."""
        newest: dict[Any, int] = {}
        for (scope, _sig), ring in self.data.items():
            t = ring.t.last_time()
            newest[scope] = max(t, newest.get(scope, t))
        if newest:
            self._drop_locked(min(newest, key=newest.__getitem__))
            self.evicted += 1

    def _drop_locked(self, scope: Any) -> None:
        for key in [k for k in self.data if k[0] == scope]:
            del self.data[key]
        self.scopes.pop(scope, None)

    def _forget_ring(self, key: tuple[Any, str]) -> None:
        if self.data.pop(key, None) is not None:
            n = self.scopes.get(key[0], 1) - 1
            if n <= 0:
                self.scopes.pop(key[0], None)
            else:
                self.scopes[key[0]] = n

    def record(self, scope: Any, signal: str, value: float, t_ns: int | None = None) -> None:
        t = time.monotonic_ns() if t_ns is None else t_ns
        with self.lock:
            self._ring(scope, signal).append(t, value)

    def record_many(self, scope: Any, signal: str, t_ns: Any, values: Any) -> None:
        if not len(t_ns):
            return
        with self.lock:
            self._ring(scope, signal).extend(np.asarray(t_ns, np.int64), np.asarray(values, np.float64))

    def window(self, scope: Any, signal: str, seconds: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(times, values) of the last ``seconds`` (the timeline's horizon when None),
        oldest first."""
        span = self.horizon_ns if seconds is None else int(seconds * 1e9)
        horizon = time.monotonic_ns() - span
        with self.lock:
            ring = self.data.get((scope, signal))
            if ring is None:
                return np.zeros(0, np.int64), np.zeros(0)
            return ring.since(horizon)

    def series(self, scope: Any, signal: str, seconds: float | None = None) -> list[Point]:
        """The window as [(t_ns, value)] (the JSON API's form)."""
        t, v = self.window(scope, signal, seconds)
        return list(zip(t.tolist(), v.tolist()))

    def signals(self, scope: Any) -> list[str]:
        with self.lock:
            return sorted(sig for (sc, sig) in self.data if sc == scope)

    def drop_scope(self, scope: Any) -> None:
        with self.lock:
            self._drop_locked(scope)

    def drop(self, scope: Any, signals: Any) -> None:
        """Forget these signals of a scope (a rank's GPU series when it turned out to
        drive another GPU), keeping its others."""
        with self.lock:
            for sig in signals:
                self._forget_ring((scope, sig))

    def expire(self, now_ns: int | None = None) -> int:
        """Drop every ring whose newest point is older than the horizon (no window of the
        timeline can return anything from it); returns how many went. Rings are dropped
        with their rank (drop_scope), but a scope nobody forgets stayed for good: a
        departed simulated GPU's ``("gpu", uuid)``, or a rank's samples an exporter
        recorded after the rank expired (its collection began before). Expiry bounds
        them all by time, whoever made them."""
        horizon = (time.monotonic_ns() if now_ns is None else now_ns) - self.horizon_ns
        with self.lock:
            stale = [k for k, ring in self.data.items() if ring.t.last_time() < horizon]
            for key in stale:
                self._forget_ring(key)
        return len(stale)

    def nbytes(self) -> int:
        with self.lock:
            return sum(r.nbytes for r in self.data.values())
