"""One rank's state on a node: identity, PIDs, cgroup, loader config, data-wait and
step histograms, the batch timeline and the detector's bins (the rank table, state.py,
holds them and says who may change them).

Histograms are accumulated here, in the agent, so a restarted training process
continues the same counters. The timeline keeps the last ``timeline_seconds`` of batch
events (a ring of fixed capacity: budget.py) for the correlator and the API.
"""
from __future__ import annotations

import collections
import time
from typing import Any

from ...correlate.waitbins import WaitBins
from ...host.report import StepPhases
from ...report import LoaderSettings, ReportedError
from ...system import cgroups
from ...vocabulary import labels as label_sets
from ...vocabulary import metric
from ..identity import peer
from ..identity.admission import RankKey as RankKey
from .batches import BatchColumns, BatchTimeline
from .histogram import Histogram

WAIT_BUCKETS = metric("stallscope_data_wait_seconds").buckets
STEP_BUCKETS = metric("stallscope_step_seconds").buckets
MAX_DROP_PIDS = 64
Event = tuple[int, int, int]


class RankState:
    def __init__(self, key: RankKey, ident: dict[str, Any], now: float, timeline_max: int,
                 domain: peer.Domain | None = None) -> None:
        self.key = key
        self.ident = ident
        self.labels: dict[str, str] = {}
        self.first_seen = now
        self.last_seen = now
        self.pid: int | None = None       # main process, agent's PID namespace (SO_PEERCRED)
        self.ns_pid: int | None = None    # main process as the trainer sees itself
        self.pid_start: int | None = None  # /proc/<pid>/stat starttime: tells PID reuse apart
        self.uid: int | None = None
        self.domain = domain                  # what may report for it (peer.py)
        self.verified: dict[int, int] = {}  # worker PID -> starttime, seen to descend
        self.cgroup: cgroups.Cgroup | None = None  # of the main process
        self.loader: LoaderSettings | None = None  # its settings alone (no PIDs, no error)
        # forward/backward/optimizer ns and steps since the trainer started, from a
        # framework's hooks (hook/phases.py); None where no integration timed them
        self.phases: StepPhases | None = None
        self.loader_error: ReportedError | None = None  # the loader's own error (issue 32)
        self.reported_workers: list[int] = []  # worker PIDs as the trainer reported them
        self.translated_workers: list[int] = []  # the same, mapped through its children
        self.workers_checked = float("-inf")     # when they were last checked in /proc
        self.worker_pids: list[int] = []       # the same, in the agent's PID namespace
        self.worker_map: collections.OrderedDict[int, int] = collections.OrderedDict()
        # (worker PID in the agent's namespace, exit code) as the trainer's waitpid saw
        # them, taken at ingest: rank.loader is replaced by the next report of any of the
        # rank's iterators, often the new loader's before the exporter read the old one's
        # deaths (CI: a fourth SIGBUS death never counted). The workers exporter drains it.
        self.exits_reported: collections.deque[tuple[int, int]] = collections.deque(maxlen=64)
        self.wait = Histogram(WAIT_BUCKETS)
        self.step = Histogram(STEP_BUCKETS)
        # Wait already added to both sums for a next() call still in progress; the batch
        # that ends it adds only the rest (see add_events and note_blocked).
        self.provisional_ns = 0
        self.provisional_start_ns = 0  # when that call began (the hook's clock)
        self.exited_at: float | None = None  # monotonic time its main process was found gone
        # columns t_end, wait, interval, ready_wait: ready_wait -1 where the hook did not
        # split the wait (hook/transfer.py)
        self.timeline = BatchTimeline(timeline_max)
        # t_end of the process's first batch: its workers' first start, which the verdict
        # does not judge a loader by (correlate/rules.py: starting). Reset with the PID.
        self.first_batch_ns: int | None = None
        self.steady_wait_ns = 0  # issue 29: the steady data-wait share on both diagnose paths
        self.bins = WaitBins()  # the detector's per-second sums, kept as batches come
        self.dropped_by_pid: dict[int, int] = {}
        self.dropped_base = 0
        self.clock_offset_ns = 0  # wall_ns - mono_ns as the hook last reported it
        self.set_ident(ident)

    def set_ident(self, ident: dict[str, Any]) -> None:
        self.ident = ident
        self.labels = {k: str(ident[k]) for k in label_sets.IDENTITY}

    @property
    def exited(self) -> bool:
        return self.exited_at is not None

    @property
    def dropped_total(self) -> int:
        return self.dropped_base + sum(self.dropped_by_pid.values())

    def note_dropped(self, pid: int, value: int) -> None:
        old = self.dropped_by_pid.get(pid)
        if old is not None and value < old:  # PID reused by a new process
            self.dropped_base += old
        self.dropped_by_pid[pid] = value
        if len(self.dropped_by_pid) > MAX_DROP_PIDS:
            first = next(iter(self.dropped_by_pid))
            self.dropped_base += self.dropped_by_pid.pop(first)

    def as_json(self, now: float) -> dict[str, Any]:
        i = self.ident
        return {
            "job": i["job"], "rank": i["rank"], "local_rank": i["local_rank"],
            "world_size": i["world_size"], "pod": i["pod"], "namespace": i["namespace"],
            "node": i["node"], "pid": self.pid, "ns_pid": self.ns_pid, "uid": self.uid,
            "worker_pids": list(self.worker_pids),
            "loader": self.loader.to_json() if self.loader is not None else None,
            "phases": self.phases.to_json() if self.phases is not None else None,
            "cgroup": self.cgroup.as_json() if self.cgroup is not None else None,
            "last_seen_seconds_ago": round(now - self.last_seen, 3),
            "batches": self.wait.count,
            "data_wait_seconds_total": self.wait.sum_ns / 1e9,
            "step_seconds_total": self.step.sum_ns / 1e9,
            "blocked_in_next_seconds": self.provisional_ns / 1e9,
            "exited": self.exited,
            "dropped_events": self.dropped_total,
        }

    def add_events(self, events: BatchColumns) -> None:
        """A report's batch events, as columns (with, from a trainer that splits its
        waits, each batch's ready wait)."""
        if not len(events):
            return
        t_end, wait, interval = events.t_end, events.wait, events.interval
        self.wait.observe_many_ns(wait)
        self.step.observe_many_ns(interval)
        # the steady batches (not an iterator's first: correlate/overlap.py), counted as they
        # arrive, wait and step together, so their ratio over any window is the steady one
        steady = wait != interval
        self.steady_wait_ns += int(wait[steady].sum())
        if self.provisional_ns:
            # The batch that ends the wait already counted in the sums adds only the rest.
            # It is that batch when it started when the blocked call did; otherwise that
            # call ended without a batch (StopIteration, an error) and its wait stays
            # counted (the sums never go back) without eating into this batch's.
            if int(t_end[0]) - int(wait[0]) == self.provisional_start_ns:
                self.wait.sum_ns -= min(self.provisional_ns, int(wait[0]))
                self.step.sum_ns -= min(self.provisional_ns, int(interval[0]))
            self.provisional_ns = 0
        if self.first_batch_ns is None:
            self.first_batch_ns = int(t_end[0])
        self.timeline.extend(events)
        self.bins.add(t_end, wait, interval, time.monotonic_ns())

    def note_blocked(self, since_ns: int, blocked_ns: int) -> None:
        """The loop has been blocked in next() for blocked_ns and the batch has not come.

        A rank hung on a dead mount would otherwise report nothing at all, and its SLI
        (rate of the wait sum over the step sum) would show no waiting. So the time waited
        so far goes into both sums now, growing with every report; _count and the buckets
        move only when the batch arrives. Sums stay monotonic: the batch that ends the wait
        adds only what was not counted yet."""
        if since_ns != self.provisional_start_ns:
            self.provisional_ns = 0  # another call than the one counted so far
            self.provisional_start_ns = since_ns
        extra = blocked_ns - self.provisional_ns
        if extra > 0:
            self.wait.sum_ns += extra
            self.step.sum_ns += extra
            self.provisional_ns = blocked_ns

