"""Per-rank state on one node: identity, PIDs, loader config, histograms, timelines.

A rank is keyed by (namespace, pod, job, rank). Histograms are accumulated here, in the
agent, so a restarted training process continues the same counters. Timelines keep the
last ``timeline_seconds`` of batch events for the correlator and the API.
"""
import collections
import threading
import time

from . import pids

# Data-wait spans 100 µs (a prefetched batch) to tens of seconds (a dead mount). Ten
# buckets keep a rank's histogram at 12 series: see the per-rank budget in DESIGN.md
# (40 series per rank, all parts together; tests/mixin/test_mixin_live.py counts them).
WAIT_BUCKETS = (0.0001, 0.0005, 0.002, 0.01, 0.05, 0.25, 1.0, 5.0, 30.0)
# Step time is read through _sum and _count (the SLI, steps per second); three decades
# of buckets are enough for a rough distribution and keep it at 6 series.
STEP_BUCKETS = (0.1, 1.0, 10.0)
LABELS = ("job", "rank", "pod", "namespace", "node")
MAX_DROP_PIDS = 64


class Histogram:
    __slots__ = ("bounds_ns", "bounds", "counts", "sum_ns", "count")

    def __init__(self, bounds):
        self.bounds = bounds
        self.bounds_ns = tuple(int(b * 1e9) for b in bounds)
        self.counts = [0] * (len(bounds) + 1)
        self.sum_ns = 0
        self.count = 0

    def observe_ns(self, value):
        i = 0
        for b in self.bounds_ns:
            if value <= b:
                break
            i += 1
        self.counts[i] += 1
        self.sum_ns += value
        self.count += 1

    def cumulative(self):
        """[(le, cumulative count)] in the form prometheus_client's families take."""
        out, acc = [], 0
        for b, c in zip(self.bounds + (float("inf"),), self.counts):
            acc += c
            out.append(("+Inf" if b == float("inf") else repr(b), acc))
        return out


class RankState:
    def __init__(self, key, ident, now, timeline_max):
        self.key = key
        self.ident = ident
        self.first_seen = now
        self.last_seen = now
        self.pid = None          # main process, agent's PID namespace (from SO_PEERCRED)
        self.ns_pid = None       # main process as the trainer sees itself
        self.pid_start = None    # /proc/<pid>/stat starttime, to tell PID reuse apart
        self.uid = None
        self.loader = None
        self.worker_pids = []    # agent's PID namespace
        self.wait = Histogram(WAIT_BUCKETS)
        self.step = Histogram(STEP_BUCKETS)
        # Wait already added to both sums for a next() call still in progress; the batch
        # that ends it adds only the rest (see _add_events and _note_blocked).
        self.provisional_ns = 0
        self.exited_at = None    # monotonic time its main process was found gone
        self.timeline = collections.deque(maxlen=timeline_max)
        self.dropped_by_pid = {}
        self.dropped_base = 0
        self.clock_offset_ns = 0  # wall_ns - mono_ns as the hook last reported it
        self.extra = {}          # room for other parts (worker samples, GPU, causes)

    def labels(self):
        i = self.ident
        return (i["job"], str(i["rank"]), i["pod"], i["namespace"], i["node"])

    @property
    def dropped_total(self):
        return self.dropped_base + sum(self.dropped_by_pid.values())

    def note_dropped(self, pid, value):
        old = self.dropped_by_pid.get(pid)
        if old is not None and value < old:  # PID reused by a new process
            self.dropped_base += old
        self.dropped_by_pid[pid] = value
        if len(self.dropped_by_pid) > MAX_DROP_PIDS:
            first = next(iter(self.dropped_by_pid))
            self.dropped_base += self.dropped_by_pid.pop(first)

    def as_json(self, now):
        i = self.ident
        return {
            "job": i["job"], "rank": i["rank"], "local_rank": i["local_rank"],
            "world_size": i["world_size"], "pod": i["pod"], "namespace": i["namespace"],
            "node": i["node"], "pid": self.pid, "ns_pid": self.ns_pid,
            "worker_pids": list(self.worker_pids), "loader": self.loader,
            "last_seen_seconds_ago": round(now - self.last_seen, 3),
            "batches": self.wait.count,
            "data_wait_seconds_total": self.wait.sum_ns / 1e9,
            "step_seconds_total": self.step.sum_ns / 1e9,
            "blocked_in_next_seconds": self.provisional_ns / 1e9,
            "exited": self.exited_at is not None,
            "dropped_events": self.dropped_total,
            **{k: v for k, v in self.extra.items() if k.startswith("json_")},
        }


class RankTable:
    """All live ranks on this node. Every method takes the lock; readers get copies."""

    def __init__(self, max_ranks=256, rank_ttl=120.0, exit_grace=30.0, timeline_seconds=900.0,
                 timeline_max=100_000, procfs="/proc", node=""):
        self.max_ranks = max_ranks
        self.rank_ttl = rank_ttl
        self.exit_grace = exit_grace
        self.timeline_ns = int(timeline_seconds * 1e9)
        self.timeline_max = timeline_max
        self.procfs = procfs
        self.node = node
        self.lock = threading.RLock()
        self.ranks = {}
        self.evictions = collections.Counter()
        self.handlers = []  # callables (msg, rank, peer) run under the lock per message

    def apply(self, msg, peer_pid=None, peer_uid=None, now=None):
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
            rank.ident = ident
            rank.last_seen = now
            pid = peer_pid or msg["pid"]
            if msg["role"] == "main":
                if pid != rank.pid:
                    rank.exited_at = None  # restarted under the same identity
                    rank.pid, rank.ns_pid = pid, msg["pid"]
                    rank.pid_start = pids.start_time(self.procfs, pid)
                    rank.uid = peer_uid
                if msg["loader"] is not None:
                    rank.loader = {k: v for k, v in msg["loader"].items() if k != "worker_pids"}
                    rank.worker_pids = pids.translate(
                        self.procfs, rank.pid, rank.ns_pid, msg["loader"]["worker_pids"])
                if msg["mono_ns"] and msg["wall_ns"]:
                    rank.clock_offset_ns = msg["wall_ns"] - msg["mono_ns"]
                self._add_events(rank, msg["events"])
                if msg.get("blocked_since_ns") is not None:
                    self._note_blocked(rank, msg["mono_ns"] - msg["blocked_since_ns"])
            rank.note_dropped(pid, msg["dropped_total"])
            for handler in self.handlers:
                handler(msg, rank, pid)
            return rank

    def _add_events(self, rank, events):
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
    def _note_blocked(rank, blocked_ns):
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

    def expire(self, now=None):
        """Drop ranks whose main process is gone or that went silent; returns their keys."""
        now = time.monotonic() if now is None else now
        gone = []
        with self.lock:
            for key, rank in list(self.ranks.items()):
                if rank.exited_at is None and rank.pid and not pids.alive(
                        self.procfs, rank.pid, rank.pid_start):
                    rank.exited_at = now
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

    def snapshot(self):
        with self.lock:
            return list(self.ranks.values())

    def find(self, **match):
        """Ranks whose identity has all the given values (e.g. pod=..., rank=3)."""
        with self.lock:
            return [r for r in self.ranks.values()
                    if all(str(r.ident.get(k)) == str(v) for k, v in match.items())]

    def timeline(self, rank, seconds):
        with self.lock:
            tl = list(rank.timeline)
        # Hook timestamps are CLOCK_MONOTONIC (perf_counter_ns), the clock of monotonic_ns.
        horizon = time.monotonic_ns() - int(seconds * 1e9)
        if tl and tl[0][0] >= horizon:
            return tl
        return [e for e in tl if e[0] >= horizon]
