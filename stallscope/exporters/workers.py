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
figures are always in /api/v1/ranks (``json_workers``) and the rank's samples.
"""
import collections
import signal

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import base

L = list(base.RANK)


def exit_signal(ctx, pid):
    """The signal that ended a zombie ``pid`` (its wait status), or None."""
    stat = base.read_text(base.proc_path(ctx, pid, "stat")) or ""
    rest = stat[stat.rfind(")") + 2:].split()
    try:
        status = int(rest[49])  # field 52, exit_code, since Linux 3.5
    except (IndexError, ValueError):
        return None
    sig = status & 0x7F
    if not sig or sig == 0x7F:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


class WorkersExporter(base.Exporter):
    name = "workers"

    def __init__(self, ctx):
        super().__init__(ctx)
        if ctx.procfs != "/proc":
            psutil.PROCFS_PATH = ctx.procfs  # psutil reads one procfs per process
        self.per_worker = bool(ctx.option("exporter_workers_per_worker", False))
        self.procs = {}     # pid -> psutil.Process (kept: it remembers the create time)
        self.cpu_seen = {}  # (pid, create_time) -> CPU seconds at the last reading
        self.cpu_total = collections.Counter()  # rank key -> accumulated worker CPU seconds
        self.exits = collections.Counter()      # rank labels + (signal,) -> n
        self.exit_counted = set()               # zombie PIDs already counted
        self.rates = base.Rates(ctx)

    def _read(self, pid):
        p = self.procs.get(pid)
        try:
            if p is None:
                p = self.procs[pid] = psutil.Process(pid)
            with p.oneshot():
                status = p.status()
                if status == psutil.STATUS_ZOMBIE:
                    return {"pid": pid, "state": "zombie", "exit_signal": exit_signal(self.ctx, pid)}
                t = p.cpu_times()
                return {"pid": pid, "state": status, "cpu_seconds": t.user + t.system,
                        "rss_bytes": p.memory_info().rss, "created": p.create_time()}
        except psutil.ZombieProcess:
            return {"pid": pid, "state": "zombie", "exit_signal": exit_signal(self.ctx, pid)}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self.procs.pop(pid, None)
            return {"pid": pid, "state": "exited"}

    def collect(self, ranks):
        fams = {
            "alive": GaugeMetricFamily("stallscope_loader_workers_alive",
                                       "Loader worker processes of the rank that are alive.", labels=L),
            "dstate": GaugeMetricFamily("stallscope_loader_workers_dstate",
                                        "Loader workers in uninterruptible sleep (D state: blocked "
                                        "in the kernel, e.g. on a hung mount).", labels=L),
            "cpu": CounterMetricFamily("stallscope_loader_workers_cpu_seconds",
                                       "CPU time used by the rank's loader workers, all generations.",
                                       labels=L),
            "rss": GaugeMetricFamily("stallscope_loader_worker_max_resident_memory_bytes",
                                     "RSS of the rank's largest loader worker.", labels=L),
            "exits": CounterMetricFamily("stallscope_loader_worker_exits",
                                         "Loader workers seen ending by a signal.",
                                         labels=L + ["signal"]),
        }
        if self.per_worker:
            fams["wcpu"] = CounterMetricFamily("stallscope_loader_worker_cpu_seconds",
                                               "CPU time of one loader worker.", labels=L + ["worker"])
            fams["wrss"] = GaugeMetricFamily("stallscope_loader_worker_resident_memory_bytes",
                                             "RSS of one loader worker.", labels=L + ["worker"])
        seen = set()  # (pid, create time) of live workers
        for rank in ranks:
            if rank.worker_pids or rank.key in self.cpu_total:
                seen |= self._rank(rank, fams)
        # forget what belongs to ranks and workers that are gone
        keys, labels = {r.key for r in ranks}, {r.labels() for r in ranks}
        wanted = {p for r in ranks for p in r.worker_pids}
        self.cpu_total = collections.Counter({k: v for k, v in self.cpu_total.items() if k in keys})
        self.exits = collections.Counter({k: v for k, v in self.exits.items() if k[:-1] in labels})
        self.cpu_seen = {k: v for k, v in self.cpu_seen.items() if k in seen}
        self.procs = {p: v for p, v in self.procs.items() if p in wanted}
        self.exit_counted &= wanted
        for key, n in sorted(self.exits.items()):
            fams["exits"].add_metric(list(key), n)
        self.rates.prune()
        return list(fams.values())

    def _rank(self, rank, fams):
        ctx, labels = self.ctx, rank.labels()
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
                    fams["wcpu"].add_metric(list(labels) + [str(i)], r["cpu_seconds"])
                    fams["wrss"].add_metric(list(labels) + [str(i)], r["rss_bytes"])
        dstate = sum(1 for r in alive if r["state"] == psutil.STATUS_DISK_SLEEP)
        fams["alive"].add_metric(labels, len(alive))
        fams["dstate"].add_metric(labels, dstate)
        fams["cpu"].add_metric(labels, self.cpu_total[rank.key])
        if alive:
            fams["rss"].add_metric(labels, max(r["rss_bytes"] for r in alive))
        if rows:
            ctx.record(rank.key, "workers_alive", len(alive))
            ctx.record(rank.key, "workers_dstate", dstate)
            d = self.rates.delta(rank.key, (self.cpu_total[rank.key],))
            if d is not None:
                ctx.record(rank.key, "workers_cpu_ratio", d[1][0] / d[0])
        ctx.set_extra(rank, "json_workers", [
            {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "created"}
            for r in rows])
        return {(r["pid"], r["created"]) for r in alive}
