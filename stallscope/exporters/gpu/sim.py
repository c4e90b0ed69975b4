"""A simulated GPU per rank, for the lab, the demo and tests on machines without a GPU.

It is busy exactly while the instrumented loop computes: from a batch's arrival (the end
of one ``next()``) to the loop's next ``next()`` call, which the hook's events give as
``[end_{k-1}, end_k - wait_k]`` (``interval_k = end_k - end_{k-1}``). The loop blocked in
``next()`` is the GPU waiting on data. Between epochs (a new iterator, whose first event
has ``interval == wait``) nothing is known, and the simulation counts idle.

Samples are final only up to the newest batch arrival the agent has heard of: while the
loop computes, or sits blocked on a dead mount, the simulated GPU's newest samples wait
for the next batch to arrive, then cover the whole stretch at once. The compute after an
iterator's last batch is never reported (the ``next()`` that raises StopIteration is
not an event), so it counts idle, like the gap between epochs.

Every series it feeds carries ``source="simulated"``; it runs only when the agent is
started with ``--gpu.simulated``, never on its own.
"""
import threading
import uuid as _uuid

import numpy as np

from .source import Gpu

PERIOD_S = 0.1  # one sample per 100 ms, DCGM's finest profiling period
_NAMESPACE = _uuid.UUID("5a7c0e5c-0b5e-4d6a-9a57-5ca11ab1e000")


def sim_uuid(key):
    """A stable, obviously simulated UUID for a rank key (namespace, pod, job, rank)."""
    return "SIM-%s" % _uuid.uuid5(_NAMESPACE, "/".join(str(k) for k in key))


class _RankSim:
    __slots__ = ("cursor", "watermark", "busy")

    def __init__(self):
        self.cursor = None     # samples are emitted up to here (CLOCK_MONOTONIC ns)
        self.watermark = None  # the newest batch arrival heard of: final up to here
        self.busy = np.zeros((0, 2), np.int64)  # disjoint busy [start, end], sorted


def _merge(intervals):
    """Sorted, disjoint union of [start, end] rows."""
    if len(intervals) < 2:
        return intervals
    starts, ends = intervals[:, 0], intervals[:, 1]
    if (starts[1:] > ends[:-1]).all():
        # already sorted and apart: the rank's one loader, whose busy stretches run from
        # a batch's arrival to the next next() call (one comparison instead of a sort and
        # a scan: the simulation was a tenth of the agent's CPU at 8 ranks x 8 workers)
        return intervals
    iv = intervals[np.argsort(starts, kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    first = np.concatenate(([True], iv[1:, 0] > reach[:-1]))  # starts a new run
    runs = np.nonzero(first)[0]
    out = np.empty((len(runs), 2), np.int64)
    out[:, 0] = iv[runs, 0]
    out[:, 1] = np.maximum.reduceat(iv[:, 1], runs)
    return out


def _busy_until(busy, t):
    """Busy time of the disjoint sorted ``busy`` up to each time in ``t``."""
    if not len(busy):
        return np.zeros(len(t), np.int64)
    begins = busy[:, 0]
    lengths = busy[:, 1] - begins
    before = np.empty(len(busy) + 1, np.int64)  # before[k]: the first k intervals
    before[0] = 0
    np.cumsum(lengths, out=before[1:])
    started = begins.searchsorted(t, side="right")  # intervals begun by t
    last = started - 1
    last[last < 0] = 0
    inside = np.minimum(np.maximum(t - begins[last], 0), lengths[last])  # of the last begun, so far
    out = before[last] + inside
    out[started == 0] = 0
    return out


class SimulatedSource:
    """Fed with each rank's batch events as the reports arrive (``feed``, from the gpu
    exporter's ``handle``); read by its Sampler thread. Whole reports at a time, as
    arrays, not a Python object per batch (issue 15)."""

    name = "simulated"

    def __init__(self, host, period_s=PERIOD_S, max_pending=100_000):
        self.host = host
        self.period_ns = int(period_s * 1e9)
        self.max_pending = max_pending
        self._gpus = {}     # rank key -> Gpu
        self._pending = {}  # rank key -> [(k, 3) arrays not yet read], with their count
        self._lock = threading.Lock()
        self._next_index = 0

    def open(self):
        pass

    def close(self):
        pass

    def feed(self, key, events):
        ev = np.asarray(events, np.int64).reshape(-1, 3)
        with self._lock:
            arrays, n = self._pending.get(key, ([], 0))
            arrays.append(ev)
            n += len(ev)
            while n - len(arrays[0]) >= self.max_pending:  # bounded: the oldest go
                n -= len(arrays.pop(0))
            self._pending[key] = (arrays, n)

    def forget(self, key):
        with self._lock:
            self._pending.pop(key, None)

    def gpus(self):
        keys = [r.key for r in self.host.ranks()]
        for key in keys:
            if key not in self._gpus:
                gpu = Gpu(self._next_index, sim_uuid(key), "stallscope simulated GPU",
                          self.name, rank_key=key)
                gpu.state = _RankSim()
                self._gpus[key] = gpu
                self._next_index += 1
        live = set(keys)
        for key in [k for k in self._gpus if k not in live]:
            del self._gpus[key]
        return list(self._gpus.values())

    def processes(self, gpu):
        return {}

    def _new_events(self, gpu):
        """Events the rank reported since the last read, oldest first."""
        with self._lock:
            arrays, _n = self._pending.pop(gpu.rank_key, ([], 0))
        if not arrays:
            return None
        ev = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        ends = ev[:, 0]
        if (ends[1:] >= ends[:-1]).all():  # one report, in order: the usual case
            return ev
        return ev[np.argsort(ends, kind="stable")]  # two loaders of one rank may interleave

    def read(self, gpu):
        st = gpu.state
        ev = self._new_events(gpu)
        if ev is None or not len(ev):
            return []
        end, wait, interval = ev[:, 0], ev[:, 1], ev[:, 2]
        start, stop = end - interval, end - wait  # [previous arrival, this next() call]
        if st.cursor is None:
            st.cursor = int(start.min())
        newest = int(end.max())
        st.watermark = newest if st.watermark is None else max(st.watermark, newest)
        keep = (stop > start) & (stop > st.cursor)
        new = np.empty((int(keep.sum()), 2), np.int64)
        np.maximum(start[keep], st.cursor, out=new[:, 0])
        new[:, 1] = stop[keep]
        st.busy = _merge(np.concatenate((st.busy, new)) if len(st.busy) else new)
        return self._emit(st)

    def _emit(self, st):
        """One sample a period from the cursor, up to the watermark: each period's busy
        share (the busy intervals are disjoint, so their overlaps sum)."""
        period = self.period_ns
        k = (st.watermark - st.cursor) // period
        if k <= 0:
            return []
        bounds = np.arange(st.cursor, st.cursor + period * (k + 1), period, dtype=np.int64)
        until = _busy_until(st.busy, bounds)
        ratios = np.minimum(1.0, (until[1:] - until[:-1]) / period)
        st.cursor = int(bounds[-1])
        st.busy = st.busy[st.busy[:, 1] > st.cursor]
        return [(b, period, r) for b, r in zip(bounds[1:].tolist(), ratios.tolist())]
