"""Part ``shards``: shard reads and cache lookups reported by the hook (``"io"`` in a
message, see stallscope/hook/shards.py).

Storage is a pod's, not a rank's: the series carry the pod labels and ``tier``
(job, pod, namespace, node, tier), so 8 ranks reading one FUSE mount make one set of
series, and none count against the per-rank budget. At most MAX_TIERS tiers per pod
(further names fold into ``other``). Per rank, the agent keeps timeline samples for
the correlator: ``shard_read_seconds`` (one per read, at its end) and
``cache_miss_ratio`` (one per report with lookups), and the rank's slowest recent
reads with their shard IDs in /api/v1/ranks (``shard_reads``) as evidence.

The sliding-window quantiles (p50/p95/p99 over the last WINDOW_S, at most
SHARD_READS_PER_TIER reads per tier, budget.py) are computed every few seconds off the
scrape path and shown in /api/v1/ranks; Prometheus computes its own from the histogram.
"""
from __future__ import annotations

import collections
import math
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...host import Part
from ...host.families import buckets, family
from ...host.report import HookReport
from ...host.rings import Ring
from ...vocabulary import signal
from ..table.budget import SHARD_READS_PER_TIER, TIERS_PER_POD
from ..table.histogram import Histogram
from ..table.validate import MAX_AGE_NS, MAX_AHEAD_NS, MAX_INTERVAL_NS, MAX_NS, printable

# What parse() returns: (tiers, reads, cache, slowest, requests).
Parsed = tuple[list[str], list[list[int]], list[list[int]], list[list[Any]], list[list[int]]]

READ_BUCKETS = buckets("stallscope_shard_read_seconds")
SHARD_READ = signal("shard_read_seconds").name
SHARD_BYTES = signal("shard_read_bytes").name
CACHE_MISS = signal("cache_miss_ratio").name
STORAGE_ERRORS = signal("storage_error_ratio").name
# the hook's request outcomes, in its order (hook/shards.py OUTCOMES), then retries; the
# failures a storage_errors cause counts: throttling, server errors, no answer (a 4xx
# is the client's own mistake: a wrong key, a missing permission)
RESULTS = ("ok", "slow_down", "server_error", "client_error", "timeout")
FAILED = (1, 2, 4)
QUANTILES = (0.5, 0.95, 0.99)
WINDOW_S = 300.0
MAX_TIERS = TIERS_PER_POD
MAX_READS = 1000
MAX_BYTES = 1 << 53
MAX_COUNT = 1 << 40
SLOWEST_KEPT = 5
_TIER = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
_SHARD = re.compile(r"^[^\x00-\x1f\x7f]{0,200}$")


class Bad(Exception):
    pass


def _ints(row: Any, n: int, limits: Sequence[int]) -> list[int]:
    if not isinstance(row, list) or len(row) != n:
        raise Bad("bad_schema")
    for v, hi in zip(row, limits):
        if type(v) is not int or not 0 <= v <= hi:
            raise Bad("bad_schema")
    return row


def parse(io: Any, now_ns: int) -> Parsed:
    """The hook's ``io`` object -> (tiers, reads, cache, slowest, requests), or Bad(reason)."""
    if not isinstance(io, dict):
        raise Bad("bad_schema")
    tiers = io.get("tiers", [])
    if not isinstance(tiers, list) or len(tiers) > MAX_TIERS:
        raise Bad("too_many_tiers")
    for t in tiers:
        if not isinstance(t, str) or not _TIER.match(t):
            raise Bad("bad_tier")
    nt = len(tiers) - 1 if tiers else -1
    reads, cache, slowest = io.get("reads", []), io.get("cache", []), io.get("slowest", [])
    if not isinstance(reads, list) or len(reads) > MAX_READS:
        raise Bad("too_many_reads")
    if not isinstance(cache, list) or len(cache) > MAX_TIERS or \
            not isinstance(slowest, list) or len(slowest) > MAX_TIERS:
        raise Bad("bad_schema")
    reads = [_ints(r, 4, (MAX_NS, MAX_INTERVAL_NS, MAX_BYTES, nt)) for r in reads]
    if any(not now_ns - MAX_AGE_NS <= r[0] <= now_ns + MAX_AHEAD_NS for r in reads):
        raise Bad("bad_time")
    cache = [_ints(c, 3, (nt, MAX_COUNT, MAX_COUNT)) for c in cache]
    requests = io.get("requests", [])
    if not isinstance(requests, list) or len(requests) > MAX_TIERS:
        raise Bad("bad_schema")
    requests = [_ints(r, 7, (nt,) + (MAX_COUNT,) * 6) for r in requests]
    out = []
    for s in slowest:
        if not isinstance(s, list) or len(s) != 3 or not isinstance(s[2], str) \
                or not _SHARD.match(s[2]) or not printable(s[2]):
            raise Bad("bad_schema")
        _ints(s[:2], 2, (nt, MAX_NS))
        out.append(s)
    return tiers, reads, cache, out, requests


class TierStats:
    __slots__ = ("hist", "recent", "hits", "misses", "quantiles", "bytes", "requests")

    def __init__(self) -> None:
        self.bytes = 0
        self.requests = [0] * (len(RESULTS) + 1)  # per RESULTS, then retries
        self.hist = Histogram(READ_BUCKETS)
        self.recent = Ring(SHARD_READS_PER_TIER, 2)  # (t_end_ns, dur_ns)
        self.hits = 0
        self.misses = 0
        self.quantiles: list[int] | None = None


def quantiles(durations: Sequence[int], qs: Sequence[float] = QUANTILES) -> list[int] | None:
    """Nearest-rank quantiles of a list of numbers (None when empty)."""
    if not durations:
        return None
    xs = sorted(durations)
    n = len(xs)
    return [xs[min(n - 1, max(0, math.ceil(q * n) - 1))] for q in qs]


class ShardPart(Part):
    name = "shards"
    interval = 2.0

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.pods: dict[Any, Any] = {}   # (namespace, pod, job) -> (node, {tier: TierStats})
        self.mine: dict[Any, Any] = {}   # rank key -> {"tiers": {...}, "slowest": [...]}
        self.rejected: collections.Counter[str] = collections.Counter()

    def _tier(self, tiers: dict[str, TierStats], name: str) -> TierStats:
        t = tiers.get(name)
        if t is None:
            if len(tiers) >= MAX_TIERS:
                self.rejected["tier_overflow"] += 1
                name = "other"
                t = tiers.get(name)
            if t is None:
                t = tiers[name] = TierStats()
        return t

    def handle(self, report: HookReport, rank: Any) -> None:
        io = report.raw.get("io")
        if io is None:
            return
        try:
            names, reads, cache, slowest, requests = parse(io, time.monotonic_ns())
        except Bad as e:
            with self.lock:
                self.rejected[e.args[0]] += 1
            return
        i = rank.ident
        key = (i["namespace"], i["pod"], i["job"])
        record = self.host.samples.record
        with self.lock:
            entry = self.pods.get(key)
            if entry is None:
                entry = self.pods[key] = (i["node"], {})
            stats = [self._tier(entry[1], n) for n in names]
            mine = self.mine.get(rank.key)
            if mine is None:
                mine = self.mine[rank.key] = {"tiers": {}, "slowest": []}
            per_tier = [mine["tiers"].setdefault(n, {"reads": 0, "bytes": 0, "cache_hits": 0,
                                                     "cache_misses": 0, "requests": 0,
                                                     "failed_requests": 0, "retries": 0})
                        for n in names]
            for end, dur, nbytes, ti in reads:
                t = stats[ti]
                t.hist.observe_ns(dur)
                t.recent.extend(np.array([[end, dur]], np.int64))
                t.bytes += nbytes
                per_tier[ti]["reads"] += 1
                per_tier[ti]["bytes"] += nbytes
            hits = misses = 0
            for ti, h, m in cache:
                stats[ti].hits += h
                stats[ti].misses += m
                per_tier[ti]["cache_hits"] += h
                per_tier[ti]["cache_misses"] += m
                hits, misses = hits + h, misses + m
            asked = failed = 0
            for row in requests:
                counts = stats[row[0]].requests
                for k, n in enumerate(row[1:]):
                    counts[k] += n
                mine_tier = per_tier[row[0]]
                mine_tier["requests"] += sum(row[1:1 + len(RESULTS)])
                mine_tier["failed_requests"] += sum(row[1 + k] for k in FAILED)
                mine_tier["retries"] += row[-1]
                asked += sum(row[1:1 + len(RESULTS)])
                failed += sum(row[1 + k] for k in FAILED)
            if slowest:
                now = report.mono_ns
                kept = mine["slowest"] + [[d, names[ti], s, now] for ti, d, s in slowest]
                kept.sort(key=lambda x: -x[0])
                mine["slowest"] = kept[:SLOWEST_KEPT]
        if reads:
            record_many = self.host.samples.record_many
            record_many(rank.key, SHARD_READ, [r[0] for r in reads], [r[1] / 1e9 for r in reads])
            record_many(rank.key, SHARD_BYTES, [r[0] for r in reads], [float(r[2]) for r in reads])
        if hits + misses:
            record(rank.key, CACHE_MISS, misses / (hits + misses), report.mono_ns or None)
        if asked:
            record(rank.key, STORAGE_ERRORS, failed / asked, report.mono_ns or None)

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        i = rank.ident
        with self.lock:
            mine = self.mine.get(rank.key)
            if mine is None:
                return {}
            entry = self.pods.get((i["namespace"], i["pod"], i["job"]))
            return {"shard_reads": self._json(mine, entry[1] if entry else {})}

    @staticmethod
    def _json(mine: dict[str, Any], pod_tiers: dict[str, TierStats]) -> dict[str, Any]:
        tiers = {}
        for name, counts in mine["tiers"].items():
            doc = dict(counts)
            q = pod_tiers[name].quantiles if name in pod_tiers else None
            if q is not None:
                doc.update(("pod_p%g_seconds" % (p * 100), v / 1e9) for p, v in zip(QUANTILES, q))
            tiers[name] = doc
        slowest = [{"seconds": d / 1e9, "tier": t, "shard": s, "t_ns": at} for d, t, s, at in mine["slowest"]]
        return {"tiers": tiers, "slowest": slowest}

    def forget(self, key: Any) -> None:
        with self.lock:
            self.mine.pop(key, None)

    def tick(self) -> None:
        """Drop pods with no live rank; recompute the window quantiles."""
        now = time.monotonic_ns()
        horizon = now - int(WINDOW_S * 1e9)
        live = {(r.ident["namespace"], r.ident["pod"], r.ident["job"]) for r in self.host.ranks()}
        with self.lock:
            for key in [k for k in self.pods if k not in live]:
                del self.pods[key]
            work = [t for _node, tiers in self.pods.values() for t in tiers.values()]
            snapshot = [(t, t.recent.since(horizon)[:, 1].tolist()) for t in work]
        for t, durations in snapshot:  # sorting outside the lock
            t.quantiles = quantiles(durations)

    def collect(self) -> Iterator[Any]:
        hist = family("stallscope_shard_read_seconds")
        cache = family("stallscope_cache_requests_total")
        nbytes = family("stallscope_shard_read_bytes_total")
        requests = family("stallscope_storage_requests_total")
        failed = family("stallscope_storage_failed_requests_total")
        retries = family("stallscope_storage_retries_total")
        with self.lock:
            for (ns, pod, job), (node, tiers) in sorted(self.pods.items()):
                pod_labels = {"job": job, "pod": pod, "namespace": ns, "node": node or self.host.node}
                for name, t in sorted(tiers.items()):
                    if t.hist.count:
                        hist.add_histogram(pod_labels, t.hist.cumulative(), t.hist.sum_ns / 1e9, tier=name)
                        nbytes.add(pod_labels, t.bytes, tier=name)
                    if any(t.requests):
                        for k, result in enumerate(RESULTS):
                            requests.add(pod_labels, t.requests[k], tier=name, result=result)
                        failed.add(pod_labels, sum(t.requests[k] for k in FAILED), tier=name)
                        retries.add(pod_labels, t.requests[-1], tier=name)
                    if t.hits or t.misses:
                        cache.add(pod_labels, t.hits, tier=name, result="hit")
                        cache.add(pod_labels, t.misses, tier=name, result="miss")
            rejected = sorted(self.rejected.items())
        rej = family("stallscope_agent_rejected_io_reports_total")
        for reason, n in rejected:
            rej.add({}, n, reason=reason)
        yield from (hist.family, nbytes.family, requests.family, failed.family, retries.family, cache.family,
                    rej.family)
