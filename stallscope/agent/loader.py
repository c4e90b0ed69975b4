"""Loader side of a rank, in the agent: batch production time (T_l) reported by the
loader workers, the loop's compute time (T_c), and the worker count that keeps up.

The starvation model: W workers each taking T_l per batch deliver a batch every T_l/W;
a loop that computes for T_c between batches never waits iff T_l/W <= T_c, so the
workers needed are ceil(T_l / T_c). T_c is interval - wait of the rank's own batch
events (the first batch of an iterator has no compute before it and is skipped).
The count is capped by the CPU the pod may use: its CFS quota (``cfs_quota_cores``
and ``cfs_quota_ranks`` left on the rank by the cfs exporter), less one core per rank
for the training process itself. Without a quota there is no cap: the node's cores
are not the pod's to take.

Worker reports (role "worker", see stallscope/hook/batches.py) carry the worker's own
PID; the kernel's SO_PEERCRED gives its PID in the agent's namespace, which maps the
PIDs the trainer reported to host PIDs even when workers are not its children
(forkserver, spawn).
"""
import collections
import math
import time

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from .state import LABELS, Histogram

# 10 ms (small tabular batch) to seconds (video decode). Read as _sum/_count (T_l) by the sizing, dashboards and diagnose; three decades of
# buckets keep it at 6 series within the per-rank budget of 40.
LOAD_BUCKETS = (0.01, 0.1, 1.0)
WINDOW_S = 60.0       # T_l and T_c are means over the last minute
SLOT_S = 5.0
MIN_BATCHES = 5       # below this in the window there is no estimate
MAX_WORKERS_ADVICE = 1024
MAX_PID_MAP = 256


class Window:
    """Sum and count of values (ns) over the last ``seconds``, in slots by event time."""

    def __init__(self, seconds=WINDOW_S, slot=SLOT_S):
        self.slot_ns = int(slot * 1e9)
        self.n = int(math.ceil(seconds / slot))
        self.slots = {}  # slot id → [sum_ns, count]

    def add(self, t_ns, value_ns):
        sid = t_ns // self.slot_ns
        s = self.slots.get(sid)
        if s is None:
            s = self.slots[sid] = [0, 0]
            if len(self.slots) > self.n + 2:
                for old in sorted(self.slots)[:-(self.n + 1)]:
                    del self.slots[old]
        s[0] += value_ns
        s[1] += 1

    def totals(self, now_ns):
        first = now_ns // self.slot_ns - self.n + 1
        total = count = 0
        for sid, (v, c) in self.slots.items():
            if sid >= first:
                total += v
                count += c
        return total, count


class LoaderState:
    __slots__ = ("hist", "load", "compute", "pids", "sizing")

    def __init__(self):
        self.hist = Histogram(LOAD_BUCKETS)
        self.load = Window()
        self.compute = Window()
        self.pids = collections.OrderedDict()  # worker PID as reported → agent's PID
        self.sizing = None


def state_of(rank):
    st = rank.extra.get("loader")
    if st is None:
        st = rank.extra["loader"] = LoaderState()
    return st


def sizing(t_load_ns, t_compute_ns, quota_cores=None, quota_ranks=None, workers=None):
    """The advice for one rank, as the API shows it (pure: tested directly)."""
    uncapped = MAX_WORKERS_ADVICE
    if t_compute_ns > 0:
        uncapped = max(1, min(MAX_WORKERS_ADVICE, math.ceil(t_load_ns / t_compute_ns)))
    cap = None
    if quota_cores:
        # Each rank's training process keeps one core of its share of the quota.
        cap = max(1, int(quota_cores / max(1, quota_ranks or 1)) - 1)
    needed = min(uncapped, cap) if cap is not None else uncapped
    return {
        "batch_load_seconds": t_load_ns / 1e9,
        "compute_seconds": t_compute_ns / 1e9,
        "num_workers": workers,
        "workers_to_keep_up": uncapped,
        "workers_cpu_limit": cap,
        "workers_needed": needed,
        "quota_limited": cap is not None and uncapped > cap,
        "cfs_quota_cores": quota_cores,
        "window_seconds": WINDOW_S,
    }


class LoaderPart:
    def __init__(self, agent):
        self.agent = agent

    def handle(self, msg, rank, pid):
        """Runs under the table lock for every accepted message."""
        events = msg["events"]
        if msg["role"] == "worker":
            st = state_of(rank)
            record = self.agent.samples.record
            for end, load, _interval in events:
                st.hist.observe_ns(load)
                st.load.add(end, load)
                record(rank.key, "batch_load_seconds", load / 1e9, end)
            self._learn_pid(rank, st, msg["pid"], pid)
        elif events or msg["loader"] is not None:
            st = state_of(rank)
            for end, wait, interval in events:
                if interval > wait:
                    st.compute.add(end, interval - wait)
            if msg["loader"] is not None and st.pids:
                self._map_pids(rank, st)

    def _learn_pid(self, rank, st, reported, host):
        if not host or host == rank.pid:
            return  # num_workers=0: the trainer itself produces the batches
        if st.pids.get(reported) != host:
            st.pids[reported] = host
            while len(st.pids) > MAX_PID_MAP:
                st.pids.popitem(last=False)
            self._map_pids(rank, st)
        else:
            st.pids.move_to_end(reported)

    @staticmethod
    def _map_pids(rank, st):
        mapped = [st.pids.get(p, p) for p in rank.worker_pids]
        if mapped != rank.worker_pids:
            rank.worker_pids = mapped

    def tick(self):
        now = time.monotonic_ns()
        table = self.agent.table
        with table.lock:
            for rank in table.ranks.values():
                st = rank.extra.get("loader")
                if st is None:
                    continue
                load, n_load = st.load.totals(now)
                comp, n_comp = st.compute.totals(now)
                if n_load < MIN_BATCHES or n_comp < MIN_BATCHES:
                    st.sizing = None
                    rank.extra.pop("json_loader_sizing", None)
                    continue
                workers = (rank.loader or {}).get("num_workers")
                st.sizing = sizing(load / n_load, comp / n_comp, rank.extra.get("cfs_quota_cores"),
                                   rank.extra.get("cfs_quota_ranks"), workers)
                st.sizing["batches"] = n_load
                rank.extra["json_loader_sizing"] = st.sizing

    def describe(self):
        return []

    def collect(self):
        hist = HistogramMetricFamily(
            "stallscope_batch_load_seconds",
            "Time a loader worker took to produce one batch (fetch + collate).", labels=LABELS)
        needed = GaugeMetricFamily(
            "stallscope_loader_workers_needed",
            "Loader workers that would keep up with the loop: ceil(T_load / T_compute) over "
            "the last minute, capped by the pod's CPU quota.", labels=LABELS)
        limited = GaugeMetricFamily(
            "stallscope_loader_workers_quota_limited",
            "1 when the CPU quota, not the worker count, limits the loader.", labels=LABELS)
        table = self.agent.table
        with table.lock:
            for rank in table.ranks.values():
                st = rank.extra.get("loader")
                if st is None:
                    continue
                lv = rank.labels()
                if st.hist.count:
                    hist.add_metric(lv, st.hist.cumulative(), st.hist.sum_ns / 1e9)
                if st.sizing is not None:
                    needed.add_metric(lv, st.sizing["workers_needed"])
                    limited.add_metric(lv, 1 if st.sizing["quota_limited"] else 0)
        yield hist
        yield needed
        yield limited


def install(agent):
    part = LoaderPart(agent)
    agent.table.handlers.append(part.handle)
    agent.registry.register(part)
    agent.every(2.0, part.tick)
    return part
