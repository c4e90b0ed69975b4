"""A pod memory limit that the target's loader workers outgrow: each keeps every sample in
its heap (growth.py), its RSS grows until the OOM killer of the pod's memory cgroup kills
it, the DataLoader raises, and the rank restarts its loader, whose new workers grow again.

The limit is on the whole rank (its main process and workers, as a pod's is): a memory
cgroup the target joins before it starts, v1 where the memory controller is there (this
kind of hybrid host), else v2 ``memory.max``."""
import os

from ...processes import teardown
from .. import needs
from .base import Fault


class MemoryLimit(Fault):
    needs = ("root", "memory_cgroup")

    def __init__(self, limit_mib=768, leak_kib=2048):
        self.limit_mib, self.leak_kib = limit_mib, leak_kib
        self.summary = ("the target rank runs under a %d MiB memory limit and its loader workers "
                        "keep %d KiB a sample in their heap" % (limit_mib, leak_kib))
        self.path = None

    def prepare(self, run):
        version, base = needs.memory_cgroup()
        path = os.path.join(base, "stallscope-lab-mem-%d-%s" % (os.getpid(), run.job))
        run.td.push("remove cgroup %s" % path, teardown.rmdir_cgroup, path)
        os.mkdir(path)
        run.created("cgroup", path)
        name = "memory.limit_in_bytes" if version == 1 else "memory.max"
        with open(os.path.join(path, name), "w") as f:
            f.write(str(self.limit_mib << 20))
        self.path = path
        run.plans[run.target].update(worker_leak_bytes=self.leak_kib << 10, restart_on_worker_death=True)

    def setup_lines(self):
        # the rank joins before it execs: its loader workers start inside
        return ["echo $$ > %s/cgroup.procs" % self.path]
