"""sched: how long each rank's loader workers sat runnable without a CPU.

``/proc/<pid>/schedstat`` (kernel Documentation/scheduler/sched-stats.rst): time on the
CPU, time spent waiting on a run queue, and timeslices, in nanoseconds. The run-queue
wait per second, averaged over the rank's workers, is the direct sign of CPU starvation
(``workers_runqueue_ratio``): node-wide CPU pressure cannot tell whether the workers or
some other tenant waited, and a worker that sleeps on I/O does not wait here at all.
Needs CONFIG_SCHED_INFO (set by distribution kernels).

The node's idle CPUs (``node_cpu_idle_cores``): the idle and iowait time of the
aggregate ``cpu`` line of ``/proc/stat`` (proc(5), in USER_HZ ticks) a second, in
cores. What the workers use now plus this is the cores free to them (the predictions'
capacity, correlate/capacity.py), measured where a whole core was assumed for the
training process and nothing for the node's other tasks.

No metric family (the per-rank series budget is tight; node_exporter's
``node_cpu_seconds_total`` has the counters); the correlator reads the samples.
"""
from __future__ import annotations

import os
from typing import Any

from ..system.procfs import KeptFiles, read_text
from ..vocabulary import signal
from . import base

RUNQUEUE = signal("workers_runqueue_ratio").name
IDLE = signal("node_cpu_idle_cores").name
# /proc/stat counts in USER_HZ, 100 on every Linux architecture whatever CONFIG_HZ
USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def idle_ticks(text: str | None) -> int | None:
    """Idle plus iowait ticks of all CPUs from ``/proc/stat`` text (its ``cpu`` line:
    user nice system idle iowait ...), or None when unreadable."""
    for line in (text or "").splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                return int(parts[4]) + int(parts[5])
            except (IndexError, ValueError):
                return None
    return None


def run_delay_ns(text: str | None) -> int | None:
    """The accumulated run-queue wait in ns of a ``schedstat``, or None when unreadable."""
    parts = (text or "").split()
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


class SchedExporter(base.Exporter):
    name = "sched"

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.rates = base.Rates(host)
        self.files = KeptFiles(host.procfs, "schedstat")

    def unavailable(self):
        if os.path.exists(self.proc("self", "schedstat")):
            return None
        return "no /proc/<pid>/schedstat (a kernel without CONFIG_SCHED_INFO)"

    def collect(self) -> Any:
        idle = idle_ticks(read_text(os.path.join(self.host.procfs, "stat")))
        if idle is not None:
            d = self.rates.delta("node idle", (idle,))
            if d is not None:
                self.record("node", IDLE, d[1][0] / USER_HZ / d[0])
        read = []
        for rank in self.host.ranks():
            shares = []
            for pid in list(rank.worker_pids):
                read.append(pid)
                delay = run_delay_ns(self.files.read(pid))
                if delay is None:
                    continue
                d = self.rates.delta((rank.key, pid), (delay,))  # a new PID starts afresh
                if d is not None:
                    shares.append(d[1][0] / 1e9 / d[0])
            if shares:
                self.record(rank.key, RUNQUEUE, sum(shares) / len(shares))
        self.rates.prune()
        self.files.keep(read)
        return []
