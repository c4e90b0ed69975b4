"""sched: how long each rank's loader workers sat runnable without a CPU.

``/proc/<pid>/schedstat`` (kernel Documentation/scheduler/sched-stats.rst): time on the
CPU, time spent waiting on a run queue, and timeslices, in nanoseconds. The run-queue
wait per second, averaged over the rank's workers, is the direct sign of CPU starvation
(``workers_runqueue_ratio``): node-wide CPU pressure cannot tell whether the workers or
some other tenant waited, and a worker that sleeps on I/O does not wait here at all.
Needs CONFIG_SCHED_INFO (set by distribution kernels).

No metric family (the per-rank series budget is tight); the correlator reads the sample.
"""
import os

from . import base


def run_delay_ns(ctx, pid):
    """The task's accumulated run-queue wait in ns, or None when unreadable."""
    text = base.read_text(base.proc_path(ctx, pid, "schedstat")) or ""
    parts = text.split()
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


class SchedExporter(base.Exporter):
    name = "sched"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.rates = base.Rates(ctx)

    def unavailable(self):
        if os.path.exists(base.proc_path(self.ctx, "self", "schedstat")):
            return None
        return "no /proc/<pid>/schedstat (a kernel without CONFIG_SCHED_INFO)"

    def collect(self, ranks):
        for rank in ranks:
            shares = []
            for pid in list(rank.worker_pids):
                delay = run_delay_ns(self.ctx, pid)
                if delay is None:
                    continue
                d = self.rates.delta((rank.key, pid), (delay,))  # a new PID starts afresh
                if d is not None:
                    shares.append(d[1][0] / 1e9 / d[0])
            if shares:
                self.ctx.record(rank.key, "workers_runqueue_ratio", sum(shares) / len(shares))
        self.rates.prune()
        return []
