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
import collections
import itertools
import threading
import uuid as _uuid

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
        self.busy = []         # disjoint busy intervals [start, end] after the cursor


class SimulatedSource:
    """Fed with each rank's batch events as the reports arrive (``feed``, from the gpu
    exporter's ``handle``); read by its Sampler thread."""

    name = "simulated"

    def __init__(self, host, period_s=PERIOD_S, max_pending=100_000):
        self.host = host
        self.period_ns = int(period_s * 1e9)
        self.max_pending = max_pending
        self._gpus = {}     # rank key -> Gpu
        self._pending = {}  # rank key -> events not yet read
        self._lock = threading.Lock()
        self._next_index = 0

    def open(self):
        pass

    def close(self):
        pass

    def feed(self, key, events):
        with self._lock:
            pending = self._pending.setdefault(key, collections.deque(maxlen=self.max_pending))
            pending.extend(events)

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
        """Events the rank reported since the last read."""
        with self._lock:
            pending = self._pending.get(gpu.rank_key)
            if not pending:
                return []
            events = list(pending)
            pending.clear()
            return events

    def read(self, gpu):
        st = gpu.state
        events = self._new_events(gpu)
        if not events:
            return []
        events.sort()  # two loaders of one rank may interleave
        if st.cursor is None:
            st.cursor = min(end - interval for end, _, interval in events)
        for end, wait, interval in events:
            start, stop = end - interval, end - wait  # [previous arrival, this next() call]
            if st.watermark is None or end > st.watermark:
                st.watermark = end
            if stop > start and stop > st.cursor:
                st.busy.append([max(start, st.cursor), stop])
        st.busy.sort()
        merged = []
        for iv in st.busy:  # disjoint intervals, so each bin's sum is its busy time
            if merged and iv[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], iv[1])
            else:
                merged.append(iv)
        st.busy = merged
        return self._emit(st)

    def _emit(self, st):
        period, busy, out = self.period_ns, st.busy, []
        first = 0
        while st.cursor + period <= st.watermark:
            a, b = st.cursor, st.cursor + period
            total = 0
            for s, e in itertools.islice(busy, first, None):
                if s >= b:
                    break
                if e > a:
                    total += min(e, b) - max(s, a)
            while first < len(busy) and busy[first][1] <= b:
                first += 1
            out.append((b, period, min(1.0, total / period)))
            st.cursor = b
        del busy[:first]
        return out
