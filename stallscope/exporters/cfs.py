"""cfs: CFS bandwidth control of the cgroups the ranks' main and worker processes run in.

Counters come from ``cpu.stat`` (kernel Documentation/scheduler/sched-bwc.rst):
v1 ``nr_periods nr_throttled throttled_time`` (ns), v2 ``nr_periods nr_throttled
throttled_usec`` (µs; present only where the cpu controller is enabled, so absent keys
mean "no CFS data", not zero). The quota is v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``
(-1 = none) or v2 ``cpu.max`` ("max 100000" = none); the effective quota of a cgroup is
the tightest along its ancestors, since a parent's quota throttles its children.

PyTorch sizes DataLoader workers from CPU affinity, not the CFS quota
(pytorch/pytorch#46867), so a 4-CPU pod on a 96-core node may run 90 workers:
``stallscope_cpu_cfs_quota_oversubscribed`` flags a cgroup holding more rank processes
(main + workers) than its quota has cores. Each rank's quota (cores, None without one)
and the ranks sharing it are published on the host as a ``RankQuota`` fact, for the
loader sizing and the correlator.
"""
from __future__ import annotations

import os
import time
from typing import Any

from ..host.facts import RankQuota
from ..host.families import family
from ..system import cgroups
from ..system.cpus import allowed_cpus
from ..system.procfs import read_keyed, read_text
from ..vocabulary import signal
from . import base

THROTTLED_RATIO = signal("cfs_throttled_ratio").name
THROTTLED_RATE = signal("cfs_throttled_seconds_rate").name
HELD_BACK = signal("cfs_held_back_ratio").name
# A worker's cgroup is read again this often: a worker is moved only by hand, and reading
# every worker's /proc/<pid>/cgroup each collection was a third of this exporter's cost
# at 8 ranks x 8 workers (benchmarks/bench_exporters.py). A rank's main process is the
# rank table's, refreshed there.
WORKER_CGROUP_S = 10.0


def _quota_v1(d):
    q = read_text(os.path.join(d, "cpu.cfs_quota_us"))
    p = read_text(os.path.join(d, "cpu.cfs_period_us"))
    try:
        q, p = int(q), int(p)
    except (TypeError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def _quota_v2(d):
    text = (read_text(os.path.join(d, "cpu.max")) or "").split()
    if len(text) != 2 or text[0] == "max":
        return None
    try:
        q, p = int(text[0]), int(text[1])
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def parse_stat(stat, version):
    """cpu.stat dict → (periods, throttled periods, throttled seconds), or None when the
    file carries no CFS counters (v2 without the cpu controller)."""
    if "nr_periods" not in stat or "nr_throttled" not in stat:
        return None
    if version == 1:
        secs = stat.get("throttled_time", 0) / 1e9
    else:
        secs = stat.get("throttled_usec", 0) / 1e6
    return stat["nr_periods"], stat["nr_throttled"], secs


class Group:
    __slots__ = ("version", "path", "dir", "cg", "labels", "ranks", "procs", "cpus", "quota", "counters")

    def __init__(self, version, path, directory, cg, labels):
        self.version, self.path, self.dir, self.cg, self.labels = version, path, directory, cg, labels
        self.ranks = []   # ranks whose main process lives here
        self.procs = 0    # rank processes (main + workers) living here
        self.cpus = set()  # the CPUs they may run on
        self.quota = None
        self.counters = None


class CfsExporter(base.Exporter):
    name = "cfs"

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.rates = base.Rates(host)
        # pid -> (read at, its Cgroup or None, where that is: _locate's answer)
        self.worker_cgroups: dict[int, tuple[float, Any, Any]] = {}
        # pid -> (read at, the CPUs it may run on), read as rarely as a worker's cgroup
        self.pid_cpus: dict[int, tuple[float, frozenset[int]]] = {}

    def _cpus(self, pid, now):
        hit = self.pid_cpus.get(pid)
        if hit is None or now - hit[0] >= WORKER_CGROUP_S:
            hit = self.pid_cpus[pid] = (now, allowed_cpus(self.host.procfs, pid))
        return hit[1]

    def _worker_cgroup(self, layout, pid, now, live):
        """(Cgroup, location) of a worker, read again every WORKER_CGROUP_S."""
        live.add(pid)
        hit = self.worker_cgroups.get(pid)
        if hit is not None and now - hit[0] < WORKER_CGROUP_S:
            return hit[1], hit[2]
        cg = cgroups.of_pid(self.host.procfs, pid)
        where = self._locate(layout, cg) if cg is not None else None
        self.worker_cgroups[pid] = (now, cg, where)
        return cg, where

    def unavailable(self):
        layout = self.cgroup_layout()
        if "cpu" in layout.v1:
            return None
        controllers = read_text(os.path.join(layout.v2 or "/nonexistent", "cgroup.controllers"))
        if controllers is not None and "cpu" in controllers.split():
            return None
        return "no cpu cgroup controller under %s" % self.host.cgroupfs

    def _locate(self, layout, cg):
        if "cpu" in layout.v1 and "cpu" in cg.v1:
            path = layout.resolve_v1("cpu", cg.v1["cpu"])
            return (1, path, layout.v1_dir("cpu", path)) if path else None
        if layout.v2 and cg.v2 is not None:
            path = layout.resolve_v2(cg.v2)
            return (2, path, layout.v2_dir(path)) if path else None
        return None

    def _quota(self, layout, version, path, cache):
        best = None
        for p in cgroups.ancestors(path):
            if (version, p) not in cache:
                d = layout.v1_dir("cpu", p) if version == 1 else layout.v2_dir(p)
                cache[(version, p)] = _quota_v1(d) if version == 1 else _quota_v2(d)
            q = cache[(version, p)]
            if q is not None and (best is None or q < best):
                best = q
        return best

    def collect(self) -> Any:
        ranks = self.host.ranks()
        layout = self.cgroup_layout()
        groups, rank_groups, quota_cache = {}, {}, {}
        now, live = time.monotonic(), set()
        for rank in ranks:
            pids = ([rank.pid] if rank.pid else []) + list(rank.worker_pids)
            mine = rank_groups[rank.key] = []
            for i, pid in enumerate(pids):
                main = i == 0 and rank.pid
                if main:
                    cg = rank.cgroup
                    where = self._locate(layout, cg) if cg is not None else None
                else:
                    cg, where = self._worker_cgroup(layout, pid, now, live)
                if where is None or where[1] == "/":
                    continue  # the root cgroup has no quota to enforce
                g = groups.get(where[:2])
                if g is None:
                    labels = dict(rank.labels, container=cgroups.container_label(cg, where[1]))
                    g = groups[where[:2]] = Group(where[0], where[1], where[2], cg, labels)
                g.procs += 1
                g.cpus |= self._cpus(pid, now)
                live.add(pid)
                if i == 0 and rank.pid:
                    g.ranks.append(rank)
                if g not in mine:
                    mine.append(g)
        for pid in [p for p in self.worker_cgroups if p not in live]:
            del self.worker_cgroups[pid]
        for pid in [p for p in self.pid_cpus if p not in live]:
            del self.pid_cpus[pid]
        return self._emit(layout, groups, ranks, rank_groups, quota_cache)

    def _emit(self, layout, groups, ranks, rank_groups, quota_cache):
        periods = family("stallscope_cpu_cfs_periods_total")
        throttled = family("stallscope_cpu_cfs_throttled_periods_total")
        seconds = family("stallscope_cpu_cfs_throttled_seconds_total")
        quota = family("stallscope_cpu_cfs_quota_cores")
        over = family("stallscope_cpu_cfs_quota_oversubscribed")
        for _key, g in sorted(groups.items()):
            g.counters = parse_stat(read_keyed(os.path.join(g.dir, "cpu.stat")), g.version)
            if g.counters is None:
                self.note("no CFS counters in %s/cpu.stat (cpu controller not enabled there)" % g.dir)
                continue
            g.quota = self._quota(layout, g.version, g.path, quota_cache)
            periods.add(g.labels, g.counters[0])
            throttled.add(g.labels, g.counters[1])
            seconds.add(g.labels, g.counters[2])
            if g.quota is not None:
                quota.add(g.labels, g.quota)
                over.add(g.labels, 1 if g.procs > g.quota else 0)
        self._record(groups, ranks, rank_groups)
        return [f.family for f in (periods, throttled, seconds, quota, over)]

    def _record(self, groups, ranks, rank_groups):
        ratio, rate, held = {}, {}, {}
        for key, g in groups.items():
            if g.counters is None:
                continue
            d = self.rates.delta(key, g.counters)
            if d is not None:
                dt, (dp, dthr, dsec) = d
                ratio[key] = dthr / dp if dp else 0.0
                rate[key] = dsec / dt
                # The kernel adds a cfs_rq's throttled time per CPU (sched-bwc.rst
                # "throttled_time"; fair.c unthrottle_cfs_rq: throttled_time += now -
                # throttled_clock), so three workers throttled on two CPUs count 2 s a
                # second, and every one of them was held back for its CPU's whole span: the
                # held-back share of a runnable process is the rate over the CPUs they
                # spread across, not over the processes (a 0.18-CPU quota on 3 workers of
                # 2 cores: 1.81 s/s, 0.60 a worker read as 0.28 of "crowding" no limit
                # gives back, where their run-queue wait was 0.88; issue 49's apply-fix)
                spread = min(g.procs, len(g.cpus)) if g.cpus else g.procs
                held[key] = min(1.0, rate[key] / max(spread, 1))
        self.rates.prune()
        for rank in ranks:
            mine = [g for g in rank_groups.get(rank.key, ()) if g.counters is not None]
            keys = [(g.version, g.path) for g in mine if (g.version, g.path) in ratio]
            if keys:  # the worst of the rank's cgroups: a throttled worker cgroup is enough
                self.record(rank.key, THROTTLED_RATIO, max(ratio[k] for k in keys))
                self.record(rank.key, THROTTLED_RATE, max(rate[k] for k in keys))
                self.record(rank.key, HELD_BACK, max(held[k] for k in keys))
            found = [g.quota for g in mine if g.quota is not None]
            q = min(found) if found else None
            main = next((g for g in mine if rank in g.ranks), None)
            self.host.facts.publish(self.name, rank.key, RankQuota(
                q, len(main.ranks) if main and q is not None else None))
