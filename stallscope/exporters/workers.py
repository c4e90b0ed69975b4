"""workers: health of each rank's DataLoader worker processes (psutil).

Per rank: workers alive, workers in D state (uninterruptible sleep: blocked in the
kernel, typically on I/O such as a hung FUSE mount), CPU seconds of all its workers
(accumulated across worker generations, since non-persistent workers are replaced
every epoch) and the largest worker's RSS (copy-on-access growth of a dataset held in
Python objects shows as steady RSS growth per worker: pytorch/pytorch#13246). Exits
by a signal (SIGBUS from a full /dev/shm, SIGKILL from the OOM killer) are counted
when seen: the exit status is readable only while the worker is a zombie (field 52
of /proc/<pid>/stat, proc(5)), so quickly reaped workers may go uncounted.

Series per worker (``worker`` = its index) multiply the per-rank budget by
num_workers, so they are off unless ``--exporter.workers.per-worker``; the per-worker
figures are always in /api/v1/ranks (``workers``) and the rank's samples.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any

import psutil

from ..host.families import family
from ..host.options import flag
from ..system.procfs import exit_signal
from ..vocabulary import signal
from . import base

ALIVE, DSTATE, CPU_RATIO = (signal(n).name for n in ("workers_alive", "workers_dstate", "workers_cpu_ratio"))


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
        if host.procfs != "/proc":
            psutil.PROCFS_PATH = host.procfs  # psutil reads one procfs per process
        self.per_worker = self.options.per_worker
        self.rows: dict[Any, Any] = {}          # rank key -> per-worker rows (/api/v1/ranks)
        self.procs = {}     # pid -> psutil.Process (kept: it remembers the create time)
        self.cpu_seen = {}  # (pid, create_time) -> CPU seconds at the last reading
        self.cpu_total = collections.Counter()  # rank key -> accumulated worker CPU seconds
        self.exits = collections.Counter()      # rank labels + (signal,) -> n
        self.exit_counted = set()               # zombie PIDs already counted
        self.rates = base.Rates(host)

    def _read(self, pid):
        p = self.procs.get(pid)
        try:
            if p is None:
                p = self.procs[pid] = psutil.Process(pid)
            with p.oneshot():
                status = p.status()
                if status == psutil.STATUS_ZOMBIE:
                    return {"pid": pid, "state": "zombie", "exit_signal": exit_signal(self.host.procfs, pid)}
                t = p.cpu_times()
                return {"pid": pid, "state": status, "cpu_seconds": t.user + t.system,
                        "rss_bytes": p.memory_info().rss, "created": p.create_time()}
        except psutil.ZombieProcess:
            return {"pid": pid, "state": "zombie", "exit_signal": exit_signal(self.host.procfs, pid)}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self.procs.pop(pid, None)
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
        seen = set()  # (pid, create time) of live workers
        for rank in ranks:
            if rank.worker_pids or rank.key in self.cpu_total:
                seen |= self._rank(rank, fams)
        # forget what belongs to ranks and workers that are gone
        keys = {r.key for r in ranks}
        labels = {tuple(r.labels.values()) for r in ranks}
        wanted = {p for r in ranks for p in r.worker_pids}
        self.cpu_total = collections.Counter({k: v for k, v in self.cpu_total.items() if k in keys})
        self.exits = collections.Counter({k: v for k, v in self.exits.items() if k[:-1] in labels})
        self.cpu_seen = {k: v for k, v in self.cpu_seen.items() if k in seen}
        self.procs = {p: v for p, v in self.procs.items() if p in wanted}
        self.exit_counted &= wanted
        self.rows = {k: v for k, v in self.rows.items() if k in keys}
        for key, n in sorted(self.exits.items()):
            fams["exits"].add_values(key, n)
        self.rates.prune()
        return [f.family for f in fams.values()]

    def _rank(self, rank, fams):
        labels = tuple(rank.labels.values())
        rows = [self._read(pid) for pid in list(rank.worker_pids)]
        alive = [r for r in rows if r["state"] not in ("zombie", "exited")]
        for i, r in enumerate(rows):
            r["worker"] = i
            if r.get("exit_signal") and r["pid"] not in self.exit_counted:
                self.exit_counted.add(r["pid"])
                self.exits[labels + (r["exit_signal"],)] += 1
            if "cpu_seconds" in r:
                key = (r["pid"], r["created"])
                self.cpu_total[rank.key] += r["cpu_seconds"] - self.cpu_seen.get(key, 0.0)
                self.cpu_seen[key] = r["cpu_seconds"]
                if self.per_worker:
                    fams["wcpu"].add(rank.labels, r["cpu_seconds"], worker=i)
                    fams["wrss"].add(rank.labels, r["rss_bytes"], worker=i)
        dstate = sum(1 for r in alive if r["state"] == psutil.STATUS_DISK_SLEEP)
        fams["alive"].add(rank.labels, len(alive))
        fams["dstate"].add(rank.labels, dstate)
        fams["cpu"].add(rank.labels, self.cpu_total[rank.key])
        if alive:
            fams["rss"].add(rank.labels, max(r["rss_bytes"] for r in alive))
        if rows:
            self.record(rank.key, ALIVE, len(alive))
            self.record(rank.key, DSTATE, dstate)
            d = self.rates.delta(rank.key, (self.cpu_total[rank.key],))
            if d is not None:
                self.record(rank.key, CPU_RATIO, d[1][0] / d[0])
        self.rows[rank.key] = [
            {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "created"}
            for r in rows]
        return {(r["pid"], r["created"]) for r in alive}

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        rows = self.rows.get(rank.key)
        return {"workers": rows} if rows is not None else {}
