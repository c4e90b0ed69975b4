"""Part ``loader``: batch production time (T_l) reported by the loader workers, the
loop's compute time (T_c), and the worker count that keeps up.

The starvation model: W workers each taking T_l per batch deliver a batch every T_l/W;
a loop that computes for T_c between batches never waits iff T_l/W <= T_c, so the
workers needed are ceil(T_l / T_c). T_c is interval - wait of the rank's own batch
events (the first batch of an iterator has no compute before it and is skipped).
The count is capped by the CPU the pod may use: its CFS quota (asked of the cfs
exporter's ``RankQuota`` fact on the host), less one core per rank
for the training process itself. Without a quota there is no cap: the node's cores
are not the pod's to take.

Each worker batch's sample carries a twin, ``batch_worker_pid``: which worker made it
(correlate/slow_worker.py splits the load times by worker).

It also keeps the rank's transfer time: of each wait, the part not spent waiting for a
worker's batch to be ready (the hook's fourth column, hook/transfer.py), as the counter
``stallscope_data_transfer_seconds_total`` (its rate over the data-wait sum's is the
``transfer_wait_ratio`` signal's face in Prometheus) and one ``transfer_wait_ratio``
sample per report.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...host import Part
from ...host.facts import RankQuota
from ...host.families import buckets, family
from ...host.report import HookReport
from ...vocabulary import signal
from ..table.histogram import Histogram

# 10 ms (small tabular batch) to seconds (video decode), read as _sum/_count (T_l).
LOAD_BUCKETS = buckets("stallscope_batch_load_seconds")
BATCH_LOAD = signal("batch_load_seconds").name
BATCH_WORKER = signal("batch_worker_pid").name
WORKER_REPORT = signal("worker_report_pid").name
TRANSFER_WAIT = signal("transfer_wait_ratio").name
WINDOW_S = 60.0       # T_l and T_c are means over the last minute
SLOT_S = 5.0
MIN_BATCHES = 5       # below this in the window there is no estimate
MAX_WORKERS_ADVICE = 1024


class Window:
    """Sum and count of values (ns) over the last ``seconds``, in slots by event time."""

    def __init__(self, seconds: float = WINDOW_S, slot: float = SLOT_S) -> None:
        self.slot_ns = int(slot * 1e9)
        self.n = int(math.ceil(seconds / slot))
        self.slots: dict[int, list[int]] = {}  # slot id -> [sum_ns, count]

    def _slot(self, sid: int) -> list[int]:
        s = self.slots.get(sid)
        if s is None:
            s = self.slots[sid] = [0, 0]
            if len(self.slots) > self.n + 2:
                for old in sorted(self.slots)[:-(self.n + 1)]:
                    del self.slots[old]
        return s

    def add(self, t_ns: int, value_ns: int) -> None:
        s = self._slot(t_ns // self.slot_ns)
        s[0] += value_ns
        s[1] += 1

    def add_many(self, t_ns: np.ndarray, values_ns: np.ndarray) -> None:
        """A report's values at once: one sum per slot they fall in."""
        if not len(t_ns):
            return
        sids = t_ns // self.slot_ns
        lo, hi = int(sids.min()), int(sids.max())
        if lo == hi:  # the usual report: every batch in one slot
            s = self._slot(lo)
            s[0] += int(values_ns.sum())
            s[1] += len(t_ns)
            return
        ids: np.ndarray | None = None
        if hi - lo < len(sids):  # a few neighbouring slots: counted by offset
            where = sids - lo
        else:  # times far apart (a day, from a hostile sender): only the slots they hit
            ids, where = np.unique(sids, return_inverse=True)
        sums = np.bincount(where, weights=values_ns).tolist()
        counts = np.bincount(where).tolist()
        for i, count in enumerate(counts):
            if count:
                s = self._slot(lo + i if ids is None else int(ids[i]))
                s[0] += int(sums[i])
                s[1] += count

    def totals(self, now_ns: int) -> tuple[int, int]:
        first = now_ns // self.slot_ns - self.n + 1
        total = count = 0
        for sid, (v, c) in self.slots.items():
            if sid >= first:
                total += v
                count += c
        return total, count


class LoaderState:
    __slots__ = ("hist", "load", "compute", "sizing", "transfer_ns")

    def __init__(self) -> None:
        self.hist = Histogram(LOAD_BUCKETS)
        self.load = Window()
        self.compute = Window()
        self.sizing: dict[str, Any] | None = None
        self.transfer_ns: int | None = None  # None until the hook splits the rank's waits


def sizing(t_load_ns: float, t_compute_ns: float, quota_cores: float | None = None,
           quota_ranks: int | None = None, workers: int | None = None) -> dict[str, Any]:
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


class LoaderPart(Part):
    name = "loader"
    interval = 2.0

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.states: dict[Any, LoaderState] = {}

    def _state(self, key: Any) -> LoaderState:
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = LoaderState()
        return st

    def handle(self, report: HookReport, rank: Any) -> None:
        """A whole report at once: no work per batch in Python."""
        events = report.events
        worker = not report.main
        if worker:
            # which worker made them (its PID in the agent's namespace, from SO_PEERCRED via
            # the rank table's map): the slow_worker cause splits the load times by it
            host = rank.worker_map.get(report.pid, report.pid)
            # When it sent a delivery of its batch stream (HookReport.stream: its
            # heartbeats too; not its shard reads or errors, sent beside): every batch it
            # finished before then was in it. The analysis reads from these how far each
            # worker's batches have come (correlate/slow_worker.py), not the hook's cadence.
            if report.mono_ns and report.stream:
                self.host.samples.record(rank.key, WORKER_REPORT, float(host), report.mono_ns)
        if not len(events):
            return
        t_end, wait = events.t_end, events.wait
        if worker:
            with self.lock:
                st = self._state(rank.key)
                st.hist.observe_many_ns(wait)
                st.load.add_many(t_end, wait)
            self.host.samples.record_many(rank.key, BATCH_LOAD, t_end, wait / 1e9)
            self.host.samples.record_many(rank.key, BATCH_WORKER, t_end,
                                          np.full(len(events), float(host)))
        else:
            compute = events.interval - wait
            busy = compute > 0
            ready = events.ready
            transfer = waited = 0
            if ready is not None:
                transfer, waited = int((wait - ready).sum()), int(wait.sum())
            with self.lock:
                st = self._state(rank.key)
                st.compute.add_many(t_end[busy], compute[busy])
                if ready is not None:
                    st.transfer_ns = (st.transfer_ns or 0) + transfer
            if waited > 0:
                self.host.samples.record(rank.key, TRANSFER_WAIT, transfer / waited, int(t_end[-1]))

    def forget(self, key: Any) -> None:
        with self.lock:
            self.states.pop(key, None)

    def tick(self) -> None:
        now = time.monotonic_ns()
        loaders = {r.key: r.loader for r in self.host.ranks()}
        with self.lock:
            work = [(k, st) for k, st in self.states.items() if k in loaders]
        for key, st in work:
            with self.lock:
                load, n_load = st.load.totals(now)
                comp, n_comp = st.compute.totals(now)
            if n_load < MIN_BATCHES or n_comp < MIN_BATCHES:
                st.sizing = None
                continue
            quota = self.host.facts.value(RankQuota, key)  # the cfs exporter's, when it runs
            cores, ranks = (quota.cores, quota.ranks) if quota is not None else (None, None)
            loader = loaders[key]
            z = sizing(load / n_load, comp / n_comp, cores, ranks,
                       loader.num_workers if loader is not None else None)
            z["batches"] = n_load
            st.sizing = z

    def sizing_of(self, key: Any) -> dict[str, Any] | None:
        st = self.states.get(key)
        return st.sizing if st is not None else None

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        z = self.sizing_of(rank.key)
        return {"sizing": z} if z is not None else {}

    def collect(self) -> Iterator[Any]:
        hist = family("stallscope_batch_load_seconds")
        needed = family("stallscope_loader_workers_needed")
        limited = family("stallscope_loader_workers_quota_limited")
        transfer = family("stallscope_data_transfer_seconds_total")
        for rank in self.host.ranks():
            with self.lock:
                st = self.states.get(rank.key)
                if st is None:
                    continue
                cumulative, total = st.hist.cumulative(), st.hist.sum_ns / 1e9
                count, z, moved = st.hist.count, st.sizing, st.transfer_ns
            if count:
                hist.add_histogram(rank.labels, cumulative, total)
            if z is not None:
                needed.add(rank.labels, z["workers_needed"])
                limited.add(rank.labels, 1 if z["quota_limited"] else 0)
            if moved is not None:
                transfer.add(rank.labels, moved / 1e9)
        yield hist.family
        yield needed.family
        yield limited.family
        yield transfer.family
