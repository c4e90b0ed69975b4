"""One rank's timelines as numpy arrays: what every correlator function takes as input.

A trace holds the hook's batch events and the signal samples of one rank over a window.
It is built from the agent's live state (``from_events``, by the agent's correlator
part) or from the JSON that ``GET /api/v1/timeline`` returns (``from_timeline``), which
is also the format of the stored evaluation traces (tests/data/traces/README.md), so
both paths analyse the same numbers.

Clock: CLOCK_MONOTONIC nanoseconds everywhere (the hook's perf_counter_ns and the
agent's monotonic_ns are the same clock on Linux). A batch event is
``(t_end, wait, interval)``: the loop blocked in ``next()`` during ``[t_end - wait,
t_end]`` (the data-wait interval) and ``interval`` is the time since the previous
batch's ``t_end`` (for the first batch of an iterator, interval == wait). The compute
phase (the "GPU busy" phase when the loop is input-fed) lies between one ``t_end`` and
the start of the next data-wait.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..report import LoaderSettings
from ..vocabulary import signal

GPU_BUSY_SIGNALS = (signal("gpu_busy_ratio").name, signal("gpu_sm_active_ratio").name)
_POINT = np.dtype([("t", np.int64), ("v", np.float64)])


@dataclasses.dataclass
class Series:
    """Samples of one signal: ``v[i]`` describes the interval ``(t[i] - dt[i], t[i]]``."""

    t: np.ndarray   # int64 ns, sorted
    v: np.ndarray   # float64
    _dt: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_points(cls, points: Sequence[Sequence[float]]) -> Series:
        """From [(t_ns, value)] (tuples or JSON lists)."""
        return cls.from_array(points_array(points))

    @classmethod
    def from_arrays(cls, t: np.ndarray, v: np.ndarray) -> Series:
        """From int64 times and float64 values (the agent's rings), sorted if needed."""
        if len(t) > 1 and np.any(t[1:] < t[:-1]):
            order = np.argsort(t, kind="stable")
            t, v = t[order], v[order]
        return cls(t, v)

    @classmethod
    def from_array(cls, arr: np.ndarray) -> Series:
        n = len(arr)
        if not n:
            return cls(np.zeros(0, np.int64), np.zeros(0))
        t, v = arr["t"], arr["v"]
        if n > 1 and np.any(t[1:] < t[:-1]):
            order = np.argsort(t, kind="stable")
            t, v = t[order], v[order]
        return cls(t, v)

    def __len__(self) -> int:
        return len(self.t)

    def dt(self) -> np.ndarray:
        """Each sample's interval length in ns; the first one borrows the median step."""
        if self._dt is None:
            if len(self.t) < 2:
                self._dt = np.full(len(self.t), int(1e9), np.int64)
            else:
                d = np.diff(self.t)
                self._dt = np.concatenate(([int(np.median(d))], d)).astype(np.int64)
        return self._dt

    def clip(self, start_ns: int, end_ns: int) -> Series:
        keep = (self.t > start_ns) & (self.t <= end_ns)
        return Series(self.t[keep], self.v[keep])


@dataclasses.dataclass
class RankTrace:
    ident: dict[str, Any]
    loader: LoaderSettings | None  # DataLoader settings (num_workers ...) or None
    t_end: np.ndarray       # int64 ns
    wait: np.ndarray        # int64 ns
    interval: np.ndarray    # int64 ns
    signals: dict[str, Series]       # rank-scoped: name -> Series
    node_signals: dict[str, Series]  # node-wide: name -> Series
    gpu_source: str | None = None  # "nvml", "dcgm", "simulated" ... when GPU samples exist
    ready_wait: np.ndarray | None = None  # int64 ns, -1 where the wait was not split
    # t_end of the first batch the agent saw from the rank's process: the run's start (its
    # workers' first start; rules.RankWait.after_start); None: unknown
    first_batch_ns: int | None = None
    # t_end of the last event when it is a call still blocked in next() (the agent's
    # open wait): part of the wait the SLI counts, not yet a batch whose kind is known
    # (an iterator's first or a steady one), so the steady figures leave it out (issue 29)
    open_ns: int | None = None
    # the loader-state sampler's split of each role's time over the window ("main",
    # "worker": {state: share}) where a recorded timeline carries it and no signal does
    # (the budget's fallback for the training thread's on-CPU share, budget.py)
    loader_split: dict[str, dict[str, float]] | None = None

    @property
    def n(self) -> int:
        return len(self.t_end)

    def compute_ns(self) -> float:
        """Median compute time per batch (interval - wait), ns; several steps need it."""
        if getattr(self, "_compute_ns", None) is None:
            self._compute_ns = float(np.median(np.maximum(self.interval - self.wait, 0))) if self.n else 0.0
        return self._compute_ns

    def since(self, t_ns: int) -> RankTrace:
        """The same rank from ``t_ns`` on: batches that ended after it, signals sampled
        after it."""
        keep = self.t_end > t_ns
        def clip(d: dict[str, Series]) -> dict[str, Series]:
            return ({k: s.clip(t_ns, 2**62) for k, s in d.items()})
        return dataclasses.replace(self, t_end=self.t_end[keep], wait=self.wait[keep],
                                   interval=self.interval[keep], signals=clip(self.signals),
                                   node_signals=clip(self.node_signals),
                                   ready_wait=self.ready[keep],
                                   open_ns=self.open_ns if self.open_ns is not None and self.open_ns > t_ns
                                   else None)

    def settled(self) -> np.ndarray:
        """Mask of the batches that arrived (all but a call still blocked in next())."""
        out = np.ones(self.n, dtype=bool)
        if self.open_ns is not None and self.n and int(self.t_end[-1]) == self.open_ns:
            out[-1] = False
        return out

    @property
    def ready(self) -> np.ndarray:
        """Per batch, the wait for a ready batch (ns), -1 where the wait was not split."""
        if self.ready_wait is None:
            self.ready_wait = np.full(self.n, -1, np.int64)
        return self.ready_wait

    def run_start(self) -> int | None:
        """Index of the process's first batch (an iterator start: interval == wait) when
        the trace holds it, else None."""
        if self.first_batch_ns is None or not self.n:
            return None
        i = int(np.searchsorted(self.t_end, self.first_batch_ns))
        if i == self.n or int(self.t_end[i]) != self.first_batch_ns or self.interval[i] != self.wait[i]:
            return None
        return i

    def span(self) -> tuple[int, int] | None:
        """(start, end) ns covered by the batch events, or None when there are none."""
        if not self.n:
            return None
        return int(self.t_end[0] - self.interval[0]), int(self.t_end[-1])

    def signal(self, name: str,
               scopes: Iterable[str] = ("rank", "node")) -> tuple[str, Series] | tuple[None, None]:
        """(scope, Series) of the first scope that has the signal, else (None, None)."""
        for scope in scopes:
            s = (self.signals if scope == "rank" else self.node_signals).get(name)
            if s is not None and len(s):
                return scope, s
        return None, None

    def gpu(self, prefer: Iterable[str] = GPU_BUSY_SIGNALS) -> tuple[str, Series] | tuple[None, None]:
        """(signal name, Series) of the rank's GPU activity, or (None, None)."""
        for name in prefer:
            s = self.signals.get(name)
            if s is not None and len(s) >= 2:
                return name, s
        return None, None

    @classmethod
    def from_events(cls, ident: dict[str, Any], loader: LoaderSettings | Mapping[str, Any] | None,
                    events: np.ndarray | Sequence[Sequence[int]],
                    signals: dict[str, Series] | None = None,
                    node_signals: dict[str, Series] | None = None,
                    gpu_source: str | None = None, first_batch_ns: int | None = None,
                    open_ns: int | None = None) -> RankTrace:
        """``events``: (n, 3) rows of (t_end, wait, interval), or (n, 4) with ready_wait."""
        ev = events if isinstance(events, np.ndarray) else events_array(events)
        if len(ev) and np.any(np.diff(ev[:, 0]) < 0):
            ev = ev[np.argsort(ev[:, 0], kind="stable")]
        ready = ev[:, 3].copy() if ev.ndim == 2 and ev.shape[1] > 3 else np.full(len(ev), -1, np.int64)
        return cls(ident=ident, loader=LoaderSettings.of(loader), t_end=ev[:, 0].copy(), wait=ev[:, 1].copy(),
                   interval=ev[:, 2].copy(), signals=signals or {},
                   node_signals=node_signals or {}, gpu_source=gpu_source, ready_wait=ready,
                   first_batch_ns=first_batch_ns, open_ns=open_ns)

    @classmethod
    def from_columns(cls, ident: dict[str, Any], loader: LoaderSettings | Mapping[str, Any] | None,
                     t_end: np.ndarray,
                     wait: np.ndarray, interval: np.ndarray, ready_wait: np.ndarray | None = None,
                     signals: dict[str, Series] | None = None,
                     node_signals: dict[str, Series] | None = None, gpu_source: str | None = None,
                     first_batch_ns: int | None = None, open_ns: int | None = None) -> RankTrace:
        """From the batch events as int64 columns, the layout the agent keeps them in
        from the wire on (agent/table/batches.py): no transpose, and no copy unless they are
        out of order. ``ready_wait``: -1 where the wait was not split; None for none."""
        if len(t_end) > 1 and np.any(t_end[1:] < t_end[:-1]):
            order = np.argsort(t_end, kind="stable")
            t_end, wait, interval = t_end[order], wait[order], interval[order]
            ready_wait = None if ready_wait is None else ready_wait[order]
        return cls(ident=ident, loader=LoaderSettings.of(loader), t_end=t_end, wait=wait, interval=interval,
                   signals=signals or {}, node_signals=node_signals or {}, gpu_source=gpu_source,
                   ready_wait=ready_wait, first_batch_ns=first_batch_ns, open_ns=open_ns)

    @classmethod
    def from_timeline(cls, body: dict[str, Any]) -> RankTrace:
        """From a ``/api/v1/timeline`` body (or a stored trace's ``timeline``)."""
        batches = body.get("batches") or []
        events = [(b["t_end_ns"], b["wait_ns"], b["interval_ns"], b.get("ready_wait_ns", -1))
                  for b in batches]
        still = body.get("open_wait")  # a call still blocked in next(): all of it a ready wait
        open_ns = None
        if isinstance(still, dict):
            events.append((still["t_end_ns"], still["wait_ns"], still["interval_ns"], still["wait_ns"]))
            open_ns = int(still["t_end_ns"])
        signals = {k: Series.from_points(v) for k, v in (body.get("signals") or {}).items()}
        node = {k: Series.from_points(v) for k, v in (body.get("node_signals") or {}).items()}
        gpu_doc = body.get("gpu")
        gpu: dict[str, Any] = gpu_doc if isinstance(gpu_doc, dict) else {}
        first = body.get("first_batch_ns")
        out = cls.from_events(body.get("rank") or {}, body.get("loader"), events, signals, node,
                              gpu.get("source") or body.get("gpu_source"),
                              first if isinstance(first, int) and not isinstance(first, bool) else None,
                              open_ns)
        state = body.get("loader_state")
        if isinstance(state, dict):
            out.loader_split = {role: {k: float(v) for k, v in (part.get("shares") or {}).items()
                                       if isinstance(v, (int, float))}
                                for role, part in state.items() if isinstance(part, dict)}
        return out

def points_array(points: Sequence[Sequence[float]]) -> np.ndarray:
    """[(t_ns, value)] (tuples or JSON lists) -> a structured array; fromiter beats
    np.asarray 2x here."""
    if not len(points):
        return np.zeros(0, _POINT)
    rows = points if isinstance(points[0], tuple) else map(tuple, points)
    return np.fromiter(rows, _POINT, len(points))


def events_array(events: Sequence[Sequence[int]]) -> np.ndarray:
    """[(t_end, wait, interval)] -> an (n, 3) int64 array; rows of four (with the ready
    wait) -> (n, 4)."""
    width = len(events[0]) if len(events) else 3
    return np.fromiter(itertools.chain.from_iterable(events), np.int64,
                       width * len(events)).reshape(-1, width)


class WaitIndex:
    """Answers "how much data-wait time fell in (a, b]?" for many intervals at once.

    The loop waits in one thread, so the wait intervals do not overlap; a prefix sum over
    them and two binary searches per query give the answer in O(log n).
    """

    def __init__(self, t_end: ArrayLike, wait: ArrayLike) -> None:
        self.ends = np.asarray(t_end, np.int64)
        self.wait = np.asarray(wait, np.int64)
        self.starts = self.ends - self.wait
        self.cum = np.concatenate(([0], np.cumsum(self.wait)))

    def before(self, t: ArrayLike) -> np.ndarray:
        t = np.asarray(t, np.int64)
        k = np.searchsorted(self.ends, t, side="right")  # intervals finished by t
        done: np.ndarray = self.cum[k]
        kk = np.minimum(k, len(self.ends) - 1) if len(self.ends) else k
        if not len(self.ends):
            return done.astype(np.float64)
        partial = np.where(k < len(self.ends),
                           np.clip(t - self.starts[kk], 0, self.wait[kk]), 0)
        return (done + partial).astype(np.float64)

    def between(self, a: ArrayLike, b: ArrayLike) -> np.ndarray:
        waited: np.ndarray = self.before(b) - self.before(a)
        return waited

    def per_sample(self, series: Series) -> np.ndarray:
        """Data-wait (ns, float) inside each sample's interval (t - dt, t] of ``series``:
        the intervals tile the time line, so one pass over their edges does it."""
        if not len(series):
            return np.zeros(0)
        edges = np.concatenate(([series.t[0] - series.dt()[0]], series.t))
        return np.diff(self.before(edges))
