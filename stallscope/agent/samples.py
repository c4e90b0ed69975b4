"""Bounded timelines of the node's own signals, for the correlator and the API.

Exporters and samplers call ``record(scope, signal, value)`` each time they read a
signal; the correlator reads ``series(scope, signal, seconds)`` and lines the points up
with the hook's batch events, which use the same clock (CLOCK_MONOTONIC ns).

Conventions, so that every consumer reads every producer the same way:
- scope: a rank's key (``RankState.key``) for signals attributed to a rank (its
  cgroup's throttling, its /dev/shm, its FUSE mounts, its workers); ``"node"`` for
  node-wide signals; ``("gpu", uuid)`` for a GPU.
- signal: a short snake_case name, e.g. ``cfs_throttled_ratio``, ``psi_io_some_ratio``,
  ``shm_used_ratio``, ``fuse_probe_seconds``, ``gpu_busy_ratio``.
- value: a level or a rate over the interval since the previous reading (e.g. throttled
  seconds per second), never a raw cumulative counter, so any window can be averaged.
- time: each (scope, signal) is recorded roughly in time order; per-batch samples from
  several loader workers (``batch_load_seconds``, ``shard_read_seconds``) interleave
  within a flush interval. ``series`` cuts its window by binary search, so the window's
  edge is fuzzy by that much; consumers sort when they need order.
"""
from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

Point = Tuple[int, float]


class SampleStore:
    def __init__(self, seconds: float = 900.0, max_points: int = 20_000) -> None:
        self.horizon_ns = int(seconds * 1e9)
        self.max_points = max_points
        self.lock = threading.Lock()
        self.data: Dict[Tuple[Any, str], Deque[Point]] = {}  # (scope, signal) -> points

    def record(self, scope: Any, signal: str, value: float, t_ns: Optional[int] = None) -> None:
        t_ns = time.monotonic_ns() if t_ns is None else t_ns
        with self.lock:
            dq = self.data.get((scope, signal))
            if dq is None:
                dq = self.data[(scope, signal)] = collections.deque(maxlen=self.max_points)
            dq.append((t_ns, float(value)))
            horizon = t_ns - self.horizon_ns
            while dq and dq[0][0] < horizon:
                dq.popleft()

    def series(self, scope: Any, signal: str, seconds: Optional[float] = None) -> List[Point]:
        with self.lock:
            points = list(self.data.get((scope, signal), ()))
        if seconds is not None:
            # Points are (t_ns, value) tuples, (nearly) in time order: (horizon,) sorts
            # before any point at or after the horizon.
            horizon = time.monotonic_ns() - int(seconds * 1e9)
            points = points[bisect.bisect_left(points, (horizon,)):]
        return points

    def signals(self, scope: Any) -> List[str]:
        with self.lock:
            return sorted(sig for (sc, sig) in self.data if sc == scope)

    def drop_scope(self, scope: Any) -> None:
        with self.lock:
            for key in [k for k in self.data if k[0] == scope]:
                del self.data[key]
