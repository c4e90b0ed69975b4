"""Per-rank state on one node: identity, PIDs, cgroup, loader config, data-wait and step
histograms, and the batch timeline. This is the hook-fed core the other parts read
through the host (never by reaching into it).

A rank is keyed by (namespace, pod, job, rank). Histograms are accumulated here, in the
agent, so a restarted training process continues the same counters. Timelines keep the
last ``timeline_seconds`` of batch events (a ring of fixed capacity: budget.py) for the
correlator and the API.

Identity (identity.py): a rank, and the pod name it claims, belong to the domain (pod,
or cgroup and uid) of the process that first reported them, while any of the pod's
ranks lives. Only that domain may report for them; a live rank's reports come from its
own main process (or a restart of it in the same domain) and its loader workers, which
must descend from it. Anything else is an ``identity_mismatch``.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..correlate.waitbins import WaitBins, Window
from ..host.rings import Ring
from ..system import cgroups, procfs
from ..vocabulary import labels as label_sets
from ..vocabulary import metric
from . import identity, pids
from .budget import Budget
from .histogram import Histogram

WAIT_BUCKETS = metric("stallscope_data_wait_seconds").buckets
STEP_BUCKETS = metric("stallscope_step_seconds").buckets
MAX_DROP_PIDS = 64
MAX_PID_MAP = 256
MAX_VERIFIED = 256
# A rank's unchanged worker list is checked again in /proc this often (exits, PID reuse).
WORKERS_RECHECK_S = 5.0
Event = tuple[int, int, int]
RankKey = tuple[str, str, str, int]


def key_of(msg: Mapping[str, Any], node: str = "") -> RankKey:
    i = msg["id"]
    return (i["namespace"], i["pod"], i["job"], i["rank"])


class Mismatch(Exception):
    """A report speaks for a rank or pod of another domain (counted, never applied)."""

    def __init__(self, reason: str = "identity_mismatch") -> None:
        super().__init__(reason)
        self.reason = reason


class RankState:
    def __init__(self, key: RankKey, ident: dict[str, Any], now: float, timeline_max: int,
                 domain: identity.Domain | None = None) -> None:
        self.key = key
        self.ident = ident
        self.labels: dict[str, str] = {}
        self.first_seen = now
        self.last_seen = now
        self.pid: int | None = None       # main process, agent's PID namespace (SO_PEERCRED)
        self.ns_pid: int | None = None    # main process as the trainer sees itself
        self.pid_start: int | None = None  # /proc/<pid>/stat starttime: tells PID reuse apart
        self.uid: int | None = None
        self.domain = domain                  # what may report for it (identity.py)
        self.verified: dict[int, int] = {}  # worker PID -> starttime, seen to descend
        self.cgroup: cgroups.Cgroup | None = None  # of the main process
        self.loader: dict[str, Any] | None = None
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
        # that ends it adds only the rest (see _add_events and _note_blocked).
        self.provisional_ns = 0
        self.provisional_start_ns = 0  # when that call began (the hook's clock)
        self.exited_at: float | None = None  # monotonic time its main process was found gone
        # (t_end, wait, interval, ready_wait): ready_wait -1 where the hook did not split
        # the wait (hook/transfer.py)
        self.timeline = Ring(timeline_max, 4)
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
                 timeline_seconds: float = 900.0, timeline_max: int | None = None,
                 procfs_root: str = "/proc", node: str = "") -> None:
        self.max_ranks = max_ranks
        self.rank_ttl = rank_ttl
        self.exit_grace = exit_grace
        self.timeline_ns = int(timeline_seconds * 1e9)
        self.timeline_max = timeline_max or Budget(max_ranks, timeline_seconds).events
        self.procfs = procfs_root
        self.node = node
        self.lock = threading.RLock()
        self.ranks: dict[RankKey, RankState] = {}
        self.pods: dict[tuple[str, str], tuple[identity.Domain, int]] = {}  # -> (domain, ranks)
        self.evictions: collections.Counter[str] = collections.Counter()
        self.refused_worker_pids = 0

    def apply(self, msg: Mapping[str, Any], source: identity.Source | None = None,
              now: float | None = None) -> RankState:
        """Fold one validated message into the table. Returns the RankState; raises
        LookupError when the table is full and Mismatch when the sender may not speak
        for the rank (the caller counts both). ``source`` is the sender as the kernel
        names it; None only for in-process callers (tests, benchmarks)."""
        now = time.monotonic() if now is None else now
        ident = dict(msg["id"])
        if not ident["node"]:
            ident["node"] = self.node
        key = key_of(msg)
        main = msg["role"] == "main"
        with self.lock:
            rank = self.ranks.get(key)
            if source is not None:
                self._check(rank, key, source, main)
            if rank is None:
                if not main:
                    raise Mismatch("unknown_rank")  # a worker speaks only for a rank its trainer made
                if len(self.ranks) >= self.max_ranks:
                    raise LookupError("rank_limit")
                domain = source.domain if source is not None else None
                rank = self.ranks[key] = RankState(key, ident, now, self.timeline_max, domain)
                self._bind_pod(key, domain)
            elif ident != rank.ident:
                rank.set_ident(ident)
            rank.last_seen = now
            pid = source.pid if source is not None else msg["pid"]
            if main:
                self._main(rank, msg, pid, source.uid if source is not None else None, now)
            else:
                self._worker(rank, msg["pid"], pid)
            rank.note_dropped(pid, msg["dropped_total"])
            return rank

    def _bind_pod(self, key: RankKey, domain: identity.Domain | None) -> None:
        pod = (key[0], key[1])
        bound, n = self.pods.get(pod, (domain, 0))
        self.pods[pod] = (bound if bound is not None else domain, n + 1)  # type: ignore[assignment]

    def _unbind_pod(self, key: RankKey) -> None:
        pod = (key[0], key[1])
        bound, n = self.pods.get(pod, (None, 1))
        if n <= 1:
            self.pods.pop(pod, None)
        else:
            self.pods[pod] = (bound, n - 1)  # type: ignore[assignment]

    def _check(self, rank: RankState | None, key: RankKey, source: identity.Source, main: bool) -> None:
        """Raise Mismatch unless ``source`` may report for ``key`` (docs/deploy.md)."""
        bound = self.pods.get((key[0], key[1]))
        if bound is not None and bound[0] is not None and bound[0] != source.domain:
            raise Mismatch()  # the pod name is another domain's while its ranks live
        if rank is None:
            return
        if rank.domain is not None and rank.domain != source.domain:
            raise Mismatch()
        if main:
            return  # its own process, or a restart of it in the same domain
        if rank.pid is None:
            raise Mismatch("unknown_rank")
        if source.pid == rank.pid:
            return  # num_workers=0: the trainer times its own fetches (hook/batches.py)
        if not identity.descends_from(source, rank.pid, rank.pid_start):
            raise Mismatch()  # a loader worker descends from its trainer
        self._verify(rank, source.pid, source.start)

    def _main(self, rank: RankState, msg: Mapping[str, Any], pid: int, uid: int | None,
              now: float) -> None:
        if pid != rank.pid:
            rank.workers_checked = float("-inf")
            rank.exited_at = None  # restarted under the same identity
            rank.pid, rank.ns_pid = pid, msg["pid"]
            rank.pid_start = procfs.start_time(self.procfs, pid)
            rank.cgroup = cgroups.of_pid(self.procfs, pid)
            rank.uid = uid
            rank.verified.clear()
        if msg["loader"] is not None:
            rank.loader = {k: v for k, v in msg["loader"].items() if k not in ("worker_pids", "worker_exits")}
            reported = list(msg["loader"]["worker_pids"])
            # The same workers as last time are checked again only every WORKERS_RECHECK_S
            # (for exits and PID reuse): reading /proc for each worker of every report
            # was a quarter of the ingest thread's CPU at 8 ranks x 8 workers (issue 15).
            if reported != rank.reported_workers or now - rank.workers_checked >= WORKERS_RECHECK_S:
                rank.reported_workers = reported
                rank.translated_workers = pids.translate(self.procfs, rank.pid, rank.ns_pid, reported)
                self._map_workers(rank)
                rank.workers_checked = now
            self._note_exits(rank, msg["loader"].get("worker_exits") or ())
        if msg["mono_ns"] and msg["wall_ns"]:
            rank.clock_offset_ns = msg["wall_ns"] - msg["mono_ns"]
        self._add_events(rank, msg["events"], msg.get("ready_wait"))
        if msg.get("blocked_since_ns") is not None:
            self._note_blocked(rank, msg["blocked_since_ns"], msg["mono_ns"] - msg["blocked_since_ns"])

    @staticmethod
    def _note_exits(rank: RankState, exits: Any) -> None:
        """Deaths by signal the trainer reported, for PIDs this very report names as its
        workers, mapped into the agent's PID namespace; a stream repeats them in every
        report until it ends, so each is queued once."""
        hosts = dict(zip(rank.reported_workers, rank.translated_workers))
        for pid, code in exits:
            if code < 0 and pid in hosts:
                death = (rank.worker_map.get(pid, hosts[pid]), code)
                if death not in rank.exits_reported:
                    rank.exits_reported.append(death)

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

    def _map_workers(self, rank: RankState) -> None:
        mapped = [rank.worker_map.get(p, h) for p, h in zip(rank.reported_workers, rank.translated_workers)]
        if rank.domain is not None and rank.pid is not None:
            # Only PIDs that descend from the trainer are its workers: a report naming
            # another process (PID 1, a neighbour's) must not make the agent read it.
            kept = []
            for p in mapped:
                ours = self._descends(rank, p)
                if ours:
                    kept.append(p)
                elif ours is False:
                    self.refused_worker_pids += 1
            mapped = kept
        if mapped != rank.worker_pids:
            rank.worker_pids = mapped

    def _descends(self, rank: RankState, pid: int) -> bool | None:
        """True: a worker of the rank (seen to descend, now or when its report came);
        False: another process; None: gone, never seen (nothing to read, nothing refused)."""
        start = procfs.start_time(self.procfs, pid)
        known = rank.verified.get(pid)
        if known is not None and (start is None or start == known):
            return True
        if start is None:
            return None
        if rank.pid is None or not identity.descends(self.procfs, pid, rank.pid):
            return False
        self._verify(rank, pid, start)
        return True

    @staticmethod
    def _verify(rank: RankState, pid: int, start: int | None) -> None:
        if start is None:
            return
        if pid not in rank.verified and len(rank.verified) >= MAX_VERIFIED:
            rank.verified.pop(next(iter(rank.verified)))
        rank.verified[pid] = start

    def _add_events(self, rank: RankState, events: Any, ready: Any = None) -> None:
        arr = np.asarray(events, np.int64).reshape(-1, 3)
        if not len(arr):
            return
        rank.wait.observe_many_ns(arr[:, 1])
        rank.step.observe_many_ns(arr[:, 2])
        if rank.provisional_ns:
            # The batch that ends the wait already counted in the sums adds only the rest.
            # It is that batch when it started when the blocked call did; otherwise that
            # call ended without a batch (StopIteration, an error) and its wait stays
            # counted (the sums never go back) without eating into this batch's.
            if int(arr[0, 0]) - int(arr[0, 1]) == rank.provisional_start_ns:
                rank.wait.sum_ns -= min(rank.provisional_ns, int(arr[0, 1]))
                rank.step.sum_ns -= min(rank.provisional_ns, int(arr[0, 2]))
            rank.provisional_ns = 0
        rows = np.empty((len(arr), 4), np.int64)
        rows[:, :3] = arr
        rows[:, 3] = -1 if ready is None else ready
        rank.timeline.extend(rows)
        rank.bins.add(arr[:, 0], arr[:, 1], arr[:, 2], time.monotonic_ns())

    @staticmethod
    def _note_blocked(rank: RankState, since_ns: int, blocked_ns: int) -> None:
        """The loop has been blocked in next() for blocked_ns and the batch has not come.

        A rank hung on a dead mount would otherwise report nothing at all, and its SLI
        (rate of the wait sum over the step sum) would show no waiting. So the time waited
        so far goes into both sums now, growing with every report; _count and the buckets
        move only when the batch arrives. Sums stay monotonic: the batch that ends the wait
        adds only what was not counted yet."""
        if since_ns != rank.provisional_start_ns:
            rank.provisional_ns = 0  # another call than the one counted so far
            rank.provisional_start_ns = since_ns
        extra = blocked_ns - rank.provisional_ns
        if extra > 0:
            rank.wait.sum_ns += extra
            rank.step.sum_ns += extra
            rank.provisional_ns = blocked_ns

    def expire(self, now: float | None = None) -> list[RankKey]:
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
                self._unbind_pod(key)
                self.evictions[reason] += 1
                gone.append(key)
        return gone

    def snapshot(self) -> list[RankState]:
        with self.lock:
            return list(self.ranks.values())

    def find(self, **match: Any) -> list[RankState]:
        """Ranks whose identity has all the given values (e.g. pod=..., rank=3)."""
        with self.lock:
            return [r for r in self.ranks.values()
                    if all(str(r.ident.get(k)) == str(v) for k, v in match.items())]

    def detection_input(self, rank: RankState, now_ns: int) -> tuple[Window, Event | None]:
        """What the change-point test reads (correlate/detect.py judge): the rank's bins
        up to ``now_ns`` and its newest batch, with the call still blocked in next() as
        the timeline(open_wait=True) has it, counted in the bins too; the newest is None
        while the rank has fewer than two."""
        with self.lock:
            n = len(rank.timeline)
            newest = rank.timeline.tail(n - 1)[0] if n else None
            blocked, start = rank.provisional_ns, rank.provisional_start_ns
            bins = rank.bins.copy() if blocked else rank.bins
            window = None if blocked else bins.window(now_ns)
        last: Event | None = None if newest is None else (int(newest[0]), int(newest[1]), int(newest[2]))
        if blocked:
            prev = last[0] if last is not None else start
            end = start + blocked
            last = (end, blocked, end - min(prev, start))
            bins.add(np.array([last[0]]), np.array([last[1]]), np.array([last[2]]), now_ns)
            window = bins.window(now_ns)
            n += 1
        assert window is not None
        return window, (last if n >= 2 else None)

    def timeline(self, rank: RankState, seconds: float, open_wait: bool = False) -> np.ndarray:
        """The rank's batch events of the last ``seconds``: an (n, 4) int64 array of
        (t_end_ns, wait_ns, interval_ns, ready_wait_ns), oldest first; ready_wait_ns is
        -1 where the hook did not split the wait. ``open_wait``: and, last, the call still
        blocked in next() if there is one (the correlator's view; the API's batches are
        the completed ones, the open wait its own field)."""
        # Hook timestamps are CLOCK_MONOTONIC (perf_counter_ns), the clock of monotonic_ns.
        horizon = time.monotonic_ns() - int(min(seconds * 1e9, self.timeline_ns))
        with self.lock:
            rows = rank.timeline.since(horizon)
            blocked, start = rank.provisional_ns, rank.provisional_start_ns
        if not blocked or not open_wait:
            return rows
        # A call still blocked in next() is a wait that has not ended: it goes last, as
        # far as the hook has reported it, as the SLI's sums already count it. Without it
        # a rank hung on a frozen mount was analysed on its waits before the hang only
        # (a lab run ranked transfer_cost over the dead FUSE mount, issue 18).
        # Its ready wait is all of it: a call blocked past the hook's 1 s report delay is
        # waiting for a batch to be made (a transfer takes milliseconds), not receiving one.
        prev = int(rows[-1, 0]) if len(rows) else start
        end = start + blocked
        return np.vstack([rows, np.array([[end, blocked, end - min(prev, start), blocked]], np.int64)])
