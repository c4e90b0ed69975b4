"""Per-rank state on one node: identity, PIDs, cgroup, loader config, data-wait and step
histograms, and the batch timeline. This is the hook-fed core the other parts read
through the host (never by reaching into it).

A rank is keyed by (namespace, pod, job, rank). Histograms are accumulated here, in the
agent, so a restarted training process continues the same counters. Timelines keep the
last ``timeline_seconds`` of batch events for the correlator and the API.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from ..system import cgroups, procfs
from ..vocabulary import labels as label_sets
from ..vocabulary import metric
from . import pids
from .histogram import Histogram

WAIT_BUCKETS = metric("stallscope_data_wait_seconds").buckets
STEP_BUCKETS = metric("stallscope_step_seconds").buckets
MAX_DROP_PIDS = 64
MAX_PID_MAP = 256
Event = Tuple[int, int, int]
RankKey = Tuple[str, str, str, int]


class RankState:
    def __init__(self, key: RankKey, ident: Dict[str, Any], now: float, timeline_max: int) -> None:
        self.key = key
        self.ident = ident
        self.labels: Dict[str, str] = {}
        self.first_seen = now
        self.last_seen = now
        self.pid: Optional[int] = None       # main process, agent's PID namespace (SO_PEERCRED)
        self.ns_pid: Optional[int] = None    # main process as the trainer sees itself
        self.pid_start: Optional[int] = None  # /proc/<pid>/stat starttime: tells PID reuse apart
        self.uid: Optional[int] = None
        self.cgroup: Optional[cgroups.Cgroup] = None  # of the main process
        self.loader: Optional[Dict[str, Any]] = None
        self.reported_workers: List[int] = []  # worker PIDs as the trainer reported them
        self.worker_pids: List[int] = []       # the same, in the agent's PID namespace
        self.worker_map: "collections.OrderedDict[int, int]" = collections.OrderedDict()
        self.wait = Histogram(WAIT_BUCKETS)
        self.step = Histogram(STEP_BUCKETS)
        # Wait already added to both sums for a next() call still in progress; the batch
        # that ends it adds only the rest (see _add_events and _note_blocked).
        self.provisional_ns = 0
        self.exited_at: Optional[float] = None  # monotonic time its main process was found gone
        self.timeline: Deque[Event] = collections.deque(maxlen=timeline_max)
        self.dropped_by_pid: Dict[int, int] = {}
        self.dropped_base = 0
        self.clock_offset_ns = 0  # wall_ns - mono_ns as the hook last reported it
        self.set_ident(ident)

    def set_ident(self, ident: Dict[str, Any]) -> None:
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

    def as_json(self, now: float) -> Dict[str, Any]:
        i = self.ident
        return {
            "job": i["job"], "rank": i["rank"], "local_rank": i["local_rank"],
            "world_size": i["world_size"], "pod": i["pod"], "namespace": i["namespace"],
            "node": i["node"], "pid": self.pid, "ns_pid": self.ns_pid, "uid": self.uid,
            "worker_pids": list(self.worker_pids), "loader": self.loader,
            "cgroup": self.cgroup.as_json() if self.cgroup is not None else None,
            "last_seen_seconds_ago": round(now - self.last_seen, 3),
            "batches": self.wait.count,
            "data_wait_seconds_total": self.wait.sum_ns / 1e9,
            "step_seconds_total": self.step.sum_ns / 1e9,
            "blocked_in_next_seconds": self.provisional_ns / 1e9,
            "exited": self.exited,
            "dropped_events": self.dropped_total,
        }


class RankTable:
    """All live ranks on this node. Every method takes the lock; readers get copies."""

    def __init__(self, max_ranks: int = 256, rank_ttl: float = 120.0, exit_grace: float = 30.0,
                 timeline_seconds: float = 900.0, timeline_max: int = 100_000,
                 procfs_root: str = "/proc", node: str = "") -> None:
        self.max_ranks = max_ranks
        self.rank_ttl = rank_ttl
        self.exit_grace = exit_grace
        self.timeline_ns = int(timeline_seconds * 1e9)
        self.timeline_max = timeline_max
        self.procfs = procfs_root
        self.node = node
        self.lock = threading.RLock()
        self.ranks: Dict[RankKey, RankState] = {}
        self.evictions: "collections.Counter[str]" = collections.Counter()

    def apply(self, msg: Mapping[str, Any], peer_pid: Optional[int] = None,
              peer_uid: Optional[int] = None, now: Optional[float] = None) -> RankState:
        """Fold one validated message into the table. Returns the RankState, or raises
        LookupError when the table is full (the caller counts the reject)."""
        now = time.monotonic() if now is None else now
        ident = dict(msg["id"])
        if not ident["node"]:
            ident["node"] = self.node
        key = (ident["namespace"], ident["pod"], ident["job"], ident["rank"])
        with self.lock:
            rank = self.ranks.get(key)
            if rank is None:
                if len(self.ranks) >= self.max_ranks:
                    raise LookupError("rank_limit")
                rank = self.ranks[key] = RankState(key, ident, now, self.timeline_max)
            elif ident != rank.ident:
                rank.set_ident(ident)
            rank.last_seen = now
            pid = peer_pid or msg["pid"]
            if msg["role"] == "main":
                self._main(rank, msg, pid, peer_uid)
            else:
                self._worker(rank, msg["pid"], pid)
            rank.note_dropped(pid, msg["dropped_total"])
            return rank

    def _main(self, rank: RankState, msg: Mapping[str, Any], pid: int, uid: Optional[int]) -> None:
        if pid != rank.pid:
            rank.exited_at = None  # restarted under the same identity
            rank.pid, rank.ns_pid = pid, msg["pid"]
            rank.pid_start = procfs.start_time(self.procfs, pid)
            rank.cgroup = cgroups.of_pid(self.procfs, pid)
            rank.uid = uid
        if msg["loader"] is not None:
            rank.loader = {k: v for k, v in msg["loader"].items() if k != "worker_pids"}
            rank.reported_workers = list(msg["loader"]["worker_pids"])
            rank.worker_pids = pids.translate(self.procfs, rank.pid, rank.ns_pid,
                                              rank.reported_workers)
            self._map_workers(rank)
        if msg["mono_ns"] and msg["wall_ns"]:
            rank.clock_offset_ns = msg["wall_ns"] - msg["mono_ns"]
        self._add_events(rank, msg["events"])
        if msg.get("blocked_since_ns") is not None:
            self._note_blocked(rank, msg["mono_ns"] - msg["blocked_since_ns"])

    def _worker(self, rank: RankState, reported: int, host: int) -> None:
        """A loader worker's report: SO_PEERCRED gives its PID in the agent's namespace,
        which maps the PID the trainer reported even when the worker is not its child
        (forkserver, spawn)."""
        if not host or host == rank.pid:
            return  # num_workers=0: the trainer itself produces the batches
        if rank.worker_map.get(reported) != host:
            rank.worker_map[reported] = host
            while len(rank.worker_map) > MAX_PID_MAP:
                rank.worker_map.popitem(last=False)
            self._map_workers(rank)
        else:
            rank.worker_map.move_to_end(reported)

    @staticmethod
    def _map_workers(rank: RankState) -> None:
        if rank.worker_map:
            mapped = [rank.worker_map.get(p, h) for p, h in zip(rank.reported_workers, rank.worker_pids)]
            if mapped != rank.worker_pids:
                rank.worker_pids = mapped

    def _add_events(self, rank: RankState, events: List[Event]) -> None:
        tl = rank.timeline
        for end, wait, interval in events:
            rank.wait.observe_ns(wait)
            rank.step.observe_ns(interval)
            if rank.provisional_ns:
                # this batch ends the wait already counted in the sums: add only the rest
                rank.wait.sum_ns -= min(rank.provisional_ns, wait)
                rank.step.sum_ns -= min(rank.provisional_ns, interval)
                rank.provisional_ns = 0
            tl.append((end, wait, interval))
        if tl:
            horizon = tl[-1][0] - self.timeline_ns
            while tl and tl[0][0] < horizon:
                tl.popleft()

    @staticmethod
    def _note_blocked(rank: RankState, blocked_ns: int) -> None:
        """The loop has been blocked in next() for blocked_ns and the batch has not come.

        A rank hung on a dead mount would otherwise report nothing at all, and its SLI
        (rate of the wait sum over the step sum) would show no waiting. So the time waited
        so far goes into both sums now, growing with every report; _count and the buckets
        move only when the batch arrives. Sums stay monotonic: the batch that ends the wait
        adds only what was not counted yet."""
        extra = blocked_ns - rank.provisional_ns
        if extra > 0:
            rank.wait.sum_ns += extra
            rank.step.sum_ns += extra
            rank.provisional_ns = blocked_ns

    def expire(self, now: Optional[float] = None) -> List[RankKey]:
        """Drop ranks whose main process is gone or that went silent; returns their keys.
        Also refreshes each live rank's cgroup (a process may be moved after it starts)."""
        now = time.monotonic() if now is None else now
        gone = []
        with self.lock:
            for key, rank in list(self.ranks.items()):
                if rank.exited_at is None and rank.pid:
                    if not procfs.alive(self.procfs, rank.pid, rank.pid_start):
                        rank.exited_at = now
                    else:
                        rank.cgroup = cgroups.of_pid(self.procfs, rank.pid) or rank.cgroup
                if rank.exited_at is not None:
                    # Kept for a grace period after exit so that Prometheus scrapes the
                    # final batches (flushed at exit) before the series go away.
                    if now - rank.exited_at < self.exit_grace:
                        continue
                    reason = "exited"
                elif now - rank.last_seen > self.rank_ttl:
                    reason = "silent"
                else:
                    continue
                del self.ranks[key]
                self.evictions[reason] += 1
                gone.append(key)
        return gone

    def snapshot(self) -> List[RankState]:
        with self.lock:
            return list(self.ranks.values())

    def find(self, **match: Any) -> List[RankState]:
        """Ranks whose identity has all the given values (e.g. pod=..., rank=3)."""
        with self.lock:
            return [r for r in self.ranks.values()
                    if all(str(r.ident.get(k)) == str(v) for k, v in match.items())]

    def timeline(self, rank: RankState, seconds: float) -> List[Event]:
        with self.lock:
            tl = list(rank.timeline)
        # Hook timestamps are CLOCK_MONOTONIC (perf_counter_ns), the clock of monotonic_ns.
        horizon = time.monotonic_ns() - int(seconds * 1e9)
        if tl and tl[0][0] >= horizon:
            return tl
        return [e for e in tl if e[0] >= horizon]
