"""CPU faults: a CFS quota too tight for the loader, and CPUs crowded by other work.

Both leave the loader workers short of CPU, which stallscope names ``cpu_throttle``; they
differ in what shows it: the quota in the cgroup's throttled periods, the crowding in the
workers' time runnable but not running (schedstat run-queue delay).
"""
import os
import sys

from ...processes import teardown
from .. import needs
from .base import Fault


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


class CpuQuota(Fault):
    """A cgroup with a CFS quota of ``cpus`` that the target's loader workers join as they
    start (``worker_cgroup``), or with ``trainer`` that its training process joins after
    its first batch (``trainer_cgroup``): its workers, forked before, stay outside, as in
    the issue's measured case (issue 30: "the main process in a CFS quota, four idle
    workers"), and its start-up (torch's imports, the workers' first batch) is not
    stretched by a quota of a few hundredths of a core."""
    needs = ("root", "cpu_cgroup")

    def __init__(self, cpus=0.1, trainer=False):
        self.cpus, self.trainer = cpus, trainer
        # a throttled consumer is told from the sampler's and the hook's numbers: the lab
        # checks that Prometheus alone and the agent's own answer name it too
        self.both_paths = trainer
        self.summary = "the target rank's %s a cgroup with a %.2g-CPU CFS quota" % (
            "training process runs in" if trainer else "loader workers share", cpus)

    def prepare(self, run):
        version, base = needs.cpu_cgroup()
        path = os.path.join(base, "stallscope-lab-%d-%s" % (os.getpid(), run.job))
        run.td.push("remove cgroup %s" % path, teardown.rmdir_cgroup, path)
        os.mkdir(path)
        run.created("cgroup", path)
        period = 100000
        if version == 1:
            _write(os.path.join(path, "cpu.cfs_period_us"), period)
            _write(os.path.join(path, "cpu.cfs_quota_us"), int(self.cpus * period))
        else:
            _write(os.path.join(path, "cpu.max"), "%d %d" % (int(self.cpus * period), period))
        run.plans[run.target]["trainer_cgroup" if self.trainer else "worker_cgroup"] = path


# A busy loop pinned to one CPU: what a noisy neighbour without a CPU limit does.
_HOG = "import os\nos.sched_setaffinity(0, {%d})\nwhile True:\n    pass\n"


class CpuHogs(Fault):
    """The target's loader workers run on one CPU (their cpuset, as a pod's CPUs are)
    that ``hogs`` busy processes with no quota share with them: the workers get about
    2 / (2 + hogs) of it. Confined to one CPU, the crowding is the same on any machine
    and leaves the other CPUs to the rest of the job."""

    def __init__(self, hogs=3):
        self.hogs = hogs
        self.summary = ("the target rank's loader workers share their CPU with %d busy processes "
                        "(no CPU quota anywhere)" % hogs)

    def missing(self):
        if len(os.sched_getaffinity(0)) < 2:
            return "needs 2 CPUs (one is crowded, the other keeps the rest of the job going)"
        return None

    def prepare(self, run):
        cpu = max(os.sched_getaffinity(0))
        run.plans[run.target]["worker_cpus"] = [cpu]
        for i in range(self.hogs):
            run.spawn("hog%d" % i, [sys.executable, "-c", _HOG % cpu])
