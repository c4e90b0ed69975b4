"""workers: health of each rank's DataLoader worker processes (/proc/<pid>/stat).

Per rank: workers alive, workers in D state (uninterruptible sleep: blocked in the
kernel, typically on I/O such as a hung FUSE mount), CPU seconds of all its workers
(accumulated across worker generations, since non-persistent workers are replaced
every epoch) and the largest worker's RSS (copy-on-access growth of a dataset held in
Python objects shows as steady RSS growth per worker: pytorch/pytorch#13246). Exits
by a signal are counted per pod with their reason (worker_deaths.py: SIGBUS with
/dev/shm full, SIGKILL with an OOM kill in the worker's memory cgroup, a native
crash): the exit status is readable only while the worker is a zombie (field 52 of
/proc/<pid>/stat, proc(5)), so it is read when the worker's hook connection closes
(``peer_gone``, from the ingest thread: the kernel closes it as the worker dies, before
its parent can reap it) and on each collection.

Series per worker (``worker`` = its index) multiply the per-rank budget by
num_workers, so they are off unless ``--exporter.workers.per-worker``; the per-worker
figures are always in /api/v1/ranks (``workers``) and the rank's samples.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import time
from typing import Any

from ..host.facts import RankMemory
from ..host.families import family
from ..host.options import flag
from ..system import cgroups, procfs
from ..system.procfs import exit_signal, signal_name
from ..vocabulary import labels as label_sets
from ..vocabulary import signal
from ..vocabulary.agent import DEPARTED_PODS_KEPT
from . import base, worker_deaths

ALIVE, DSTATE, CPU_RATIO = (signal(n).name for n in ("workers_alive", "workers_dstate", "workers_cpu_ratio"))
# the deaths the correlator scores as causes (correlate/deaths.py): reason -> signal
KILLED = {"memory_limit": signal("workers_oom_killed").name,
          "shm_exhaustion": signal("workers_shm_killed").name}
SHM_USED = signal("shm_used_ratio").name
SHM_LOOKBACK_S = 10.0
# proc(5) state letters, named as psutil and ps(1) name them (the API's ``state``)
STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop",
          "X": "dead", "I": "idle", "W": "waking", "P": "parked", "K": "wake-kill"}
DISK_SLEEP = STATES["D"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
DEATHS_KEPT = 64        # recent deaths kept for the API and diagnose (all ranks)
DEATH_KEEP_S = 900.0    # a pod's exit counters outlive its ranks this long, for the alert
# ... and at most DEPARTED_PODS_KEPT departed pods keep them (vocabulary/agent.py)


@dataclasses.dataclass(frozen=True)
class WorkersOptions:
    per_worker: bool = flag(False, "--exporter.workers.per-worker",
                            "Also export CPU and RSS per loader worker (num_workers more series per "
                            "rank; per-worker figures are always in /api/v1/ranks).")


class WorkersExporter(base.Exporter):
    name = "workers"
    Options = WorkersOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.per_worker = self.options.per_worker
        self.rows: dict[Any, Any] = {}          # rank key -> per-worker rows (/api/v1/ranks)
        # each rank's workers' CPU seconds, every generation, each worker from its start
        self.cpu = base.WorkerCounters(host, before_first=True)
        self.exits = collections.Counter()      # pod labels + (reason,) -> n
        self.exits_seen: dict[tuple, float] = {}  # pod labels -> when one of its ranks was last seen
        self.exit_counted: collections.OrderedDict = collections.OrderedDict()  # dead PIDs counted
        self.deaths: collections.deque = collections.deque(maxlen=DEATHS_KEPT)
        self.layout = cgroups.Layout(host.cgroupfs)
        self.memory: dict[Any, tuple] = {}      # rank key -> (memory cgroup dir, version, oom_kill)
        self.killed: collections.Counter = collections.Counter()  # (rank key, reason) -> n since last
        self.rss_seen: dict[int, tuple] = {}    # pid -> (t first, rss first, t last, rss last)
        self.files = procfs.KeptFiles(host.procfs, "stat")

    def _read(self, pid):
        """One worker from one read of /proc/<pid>/stat (proc(5)): its state, CPU time,
        RSS and start time. psutil read two files and cost 2.5x as much for the 64 workers
        of 8 ranks, every second (issue 15)."""
        f = procfs.split_stat(self.files.read(pid))
        if f is None or len(f) < 22:
            return {"pid": pid, "state": "exited"}
        if f[0] == "Z":
            return {"pid": pid, "state": "zombie", "exit_signal": exit_signal(self.host.procfs, pid)}
        try:
            return {"pid": pid, "state": STATES.get(f[0], f[0]),
                    "cpu_seconds": (int(f[11]) + int(f[12])) / CLOCK_TICKS,
                    "rss_bytes": int(f[21]) * PAGE_BYTES, "created": int(f[19])}
        except ValueError:
            return {"pid": pid, "state": "exited"}

    def collect(self) -> Any:
        ranks = self.host.ranks()
        fams = {
            "alive": family("stallscope_loader_workers_alive"),
            "dstate": family("stallscope_loader_workers_dstate"),
            "cpu": family("stallscope_loader_workers_cpu_seconds_total"),
            "rss": family("stallscope_loader_worker_max_resident_memory_bytes"),
            "exits": family("stallscope_loader_worker_exits_total"),
        }
        if self.per_worker:
            fams["wcpu"] = family("stallscope_loader_worker_cpu_seconds_total")
            fams["wrss"] = family("stallscope_loader_worker_resident_memory_bytes")
        for rank in ranks:
            if rank.worker_pids or self.cpu.knows(rank.key):
                self._rank(rank, fams)
        # forget what belongs to ranks and workers that are gone
        keys = {r.key for r in ranks}
        now = time.monotonic()
        wanted = {p for r in ranks for p in r.worker_pids}
        live = {self._pod(r) for r in ranks}  # each rank's pod labels, once a collection
        with self.lock:
            for pod in live:
                self.exits_seen[pod] = now
                for reason in worker_deaths.REASONS:  # every reason from 0: increase() sees the first
                    self.exits[pod + (reason,)] += 0
            self.exits_seen = {k: t for k, t in self.exits_seen.items() if now - t < DEATH_KEEP_S}
            departed = sorted((t, k) for k, t in self.exits_seen.items() if k not in live)
            for _t, k in departed[:max(0, len(departed) - DEPARTED_PODS_KEPT)]:
                del self.exits_seen[k]
            self.exits = collections.Counter({k: v for k, v in self.exits.items()
                                              if k[:-1] in self.exits_seen})
            exits = sorted(self.exits.items())
        self.cpu.prune(keys)
        self.memory = {k: v for k, v in self.memory.items() if k in keys}
        with self.lock:
            self.killed = collections.Counter({k: v for k, v in self.killed.items() if k[0] in keys})
        self.rss_seen = {p: v for p, v in self.rss_seen.items() if p in wanted}
        self.files.keep(wanted)
        self.rows = {k: v for k, v in self.rows.items() if k in keys}
        for key, n in exits:
            fams["exits"].add_values(key, n)
        return [f.family for f in fams.values()]

    def _rank(self, rank, fams):
        rows = [self._read(pid) for pid in list(rank.worker_pids)]
        alive = [r for r in rows if r["state"] not in ("zombie", "exited")]
        now = time.monotonic()
        self._reported_exits(rank, now)
        for i, r in enumerate(rows):
            r["worker"] = i
            if r.get("exit_signal"):
                self._died(rank, r["pid"], r["exit_signal"], now)
            if r.get("rss_bytes"):  # 0: a process tearing down its memory (an OOM victim)
                first = self.rss_seen.get(r["pid"])
                self.rss_seen[r["pid"]] = first[:2] + (now, r["rss_bytes"]) if first else \
                    (now, r["rss_bytes"], now, r["rss_bytes"])
            if "cpu_seconds" in r and self.per_worker:
                fams["wcpu"].add(rank.labels, r["cpu_seconds"], worker=i)
                fams["wrss"].add(rank.labels, r["rss_bytes"], worker=i)
        cpu = self.cpu.update(rank.key, [(r["pid"], r["created"], (r["cpu_seconds"],))
                                         for r in rows if "cpu_seconds" in r])
        dstate = sum(1 for r in alive if r["state"] == DISK_SLEEP)
        fams["alive"].add(rank.labels, len(alive))
        fams["dstate"].add(rank.labels, dstate)
        fams["cpu"].add(rank.labels, cpu.total[0])
        if alive:
            fams["rss"].add(rank.labels, max(r["rss_bytes"] for r in alive))
            largest_rss = max(r["rss_bytes"] for r in alive)
        if rows:
            self.record(rank.key, ALIVE, len(alive))
            self.record(rank.key, DSTATE, dstate)
            if cpu.seconds:
                self.record(rank.key, CPU_RATIO, cpu.moved[0] / cpu.seconds)
        with self.lock:
            killed = {reason: self.killed.pop((rank.key, reason), 0) for reason in KILLED}
        # every collection, 0 included: the correlator scores the death causes from them
        for reason, name in KILLED.items():
            self.record(rank.key, name, killed[reason])
        d, v = self._memory_of(rank)
        self._baseline_oom(rank, d, v)
        if alive:
            # what more workers would cost: the correlator caps its worker counts with it
            self.host.facts.publish(self.name, rank.key, RankMemory(
                worker_deaths.memory_limit(d, v), worker_deaths.memory_used(d, v), largest_rss or None))
        self.rows[rank.key] = [
            {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "created"}
            for r in rows]

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        rows = self.rows.get(rank.key)
        out: dict[str, Any] = {"workers": rows} if rows is not None else {}
        with self.lock:
            deaths = [d for d in self.deaths if d["key"] == rank.key]
        if deaths:
            out["worker_deaths"] = [{k: v for k, v in d.items() if k != "key"} for d in deaths]
        return out

    # -- why a worker died ---------------------------------------------------------------
    @staticmethod
    def _pod(rank: Any) -> tuple:
        return label_sets.values(label_sets.POD, rank.labels)

    def _memory_of(self, rank: Any) -> tuple:
        """(memory cgroup dir, version) of the rank's main process: its workers live in
        its cgroup (the container's), and a zombie's own /proc/<pid>/cgroup may already
        name the root."""
        return worker_deaths.memory_dir(self.layout, rank.cgroup or cgroups.of_pid(
            self.host.procfs, rank.pid))

    def _baseline_oom(self, rank: Any, d: str | None, v: str | None) -> None:
        """The OOM-kill count of the rank's memory cgroup when first seen: a worker's
        SIGKILL is an OOM kill when the count rose since then or since the previous
        death (not since the last collection, which may fall between the kill and the
        moment its victim's exit is read)."""
        with self.lock:
            known = self.memory.get(rank.key)
            if known is None or known[0] != d:
                self.memory[rank.key] = (d, v, worker_deaths.oom_kills(d, v))

    def _rank_of(self, source: Any) -> Any:
        parents = {p for p, _start in source.ancestors}
        for rank in self.host.ranks():
            if source.pid in rank.worker_pids or (rank.pid is not None and rank.pid in parents):
                return rank
        return None

    def _reported_exits(self, rank: Any, now: float) -> None:
        """Exits the trainer's own waitpid saw (the hook sends them once the loader
        raised): the record that survives a worker its parent reaped at once. Queued at
        ingest (agent/table/rankworkers.py: only PIDs the report named as its workers, mapped into
        the agent's PID namespace); _died counts each PID once."""
        queue = rank.exits_reported
        while queue:
            host, code = queue.popleft()  # the ingest thread appends: deque ops are atomic
            self._died(rank, host, signal_name(-code), now)

    def peer_gone(self, source: Any) -> None:
        """A hook connection closed (ingest thread): if its process died by a signal,
        read why now, while it is a zombie and the evidence is fresh."""
        sig = exit_signal(self.host.procfs, source.pid)
        if not sig:
            return
        rank = self._rank_of(source)
        if rank is not None:
            self._died(rank, source.pid, sig, time.monotonic())

    def _died(self, rank: Any, pid: int, sig: str, now: float) -> None:
        with self.lock:
            if pid in self.exit_counted:
                return
            self.exit_counted[pid] = True
            while len(self.exit_counted) > 4 * DEATHS_KEPT:
                self.exit_counted.popitem(last=False)
            before = self.memory.get(rank.key)
            rss = self.rss_seen.get(pid)
        d, v = self._memory_of(rank)
        count = worker_deaths.oom_kills(d, v)
        delta = None
        if count is not None:
            base = before[2] if before and before[0] == d and before[2] is not None else 0
            delta = count - base
        # /dev/shm now, or at its fullest over the last seconds (the shm exporter's
        # samples): the dead worker's own segments, or another's, may be gone already
        shm = worker_deaths.shm_used_ratio(self.proc(rank.pid, "root", "dev", "shm")) \
            if rank.pid is not None else None
        recent = [v for _t, v in self.host.samples.series(rank.key, SHM_USED, SHM_LOOKBACK_S)]
        if recent:
            shm = max(recent + ([shm] if shm is not None else []))
        death = {"key": rank.key, "rank": rank.labels.get("rank"), "pid": pid, "signal": sig,
                 "reason": worker_deaths.classify(sig, shm, delta), "at": time.time(),
                 "shm_used_ratio": None if shm is None else round(shm, 4),
                 "oom_kill_delta": delta, "memory_cgroup": d,
                 "memory_limit_bytes": worker_deaths.memory_limit(d, v),
                 "last_rss_bytes": rss[3] if rss else None,
                 "rss_growth_bytes_per_second": round((rss[3] - rss[1]) / (rss[2] - rss[0]))
                 if rss and rss[2] - rss[0] >= 1.0 else None}
        death["summary"] = worker_deaths.explain(death)
        with self.lock:
            self.deaths.append(death)
            self.exits[self._pod(rank) + (death["reason"],)] += 1
            if death["reason"] in KILLED:
                self.killed[(rank.key, death["reason"])] += 1
            self.exits_seen[self._pod(rank)] = now
            if count is not None:
                # An OOM-killed worker accounts for one kill of the count; the next death
                # counts from there. Both workers of a rank can be killed before the first
                # exit is read (CI: the second read a delta of 0 and was "killed").
                used = base + 1 if death["reason"] == "memory_limit" else count
                self.memory[rank.key] = (d, v, min(count, used))
