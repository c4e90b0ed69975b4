"""A tiny /dev/shm, mostly taken by the leftovers of an earlier crash: one pod's, or a
whole lab node's."""
import subprocess

from .base import Fault


class TinyShm(Fault):
    needs = ("root", "unshare")

    def __init__(self, size_mib=16, leftover_mib=14, sample_kib=96):
        self.size_mib, self.leftover_mib, self.sample_kib = size_mib, leftover_mib, sample_kib
        self.summary = ("the target rank runs in its own mount namespace with a %d MiB /dev/shm, "
                        "%d MiB of it held by leftovers of an earlier crash" % (size_mib, leftover_mib))

    def prepare(self, run):
        # Batches of 8 x 96 KiB = 768 KiB: two fit in the 2 MiB left (and /dev/shm
        # stays over 90% full), the loop holds one while the next is made, so at most
        # one is in flight instead of workers x prefetch_factor = 4, and a worker gets
        # its slot only on a retry (0.5 s backoff). Out-of-order delivery (in_order=False)
        # keeps a later batch that took the last slot from deadlocking the pipeline.
        plan = run.plans[run.target]
        plan.update(sample_bytes=self.sample_kib * 1024, shm_retry_s=0.5, in_order=False,
                    sharing_strategy="file_descriptor")  # torch's default, whose error users meet

    def setup_lines(self):
        # In the target's own mount namespace: the host's /dev/shm is not touched.
        return ["mount -t tmpfs -o size=%dm,mode=1777 lab-shm /dev/shm" % self.size_mib,
                "head -c %d /dev/zero > /dev/shm/torch_leftover_of_crashed_run" % (self.leftover_mib << 20)]


class ShmBusError(Fault):
    """The target's /dev/shm (its own mount namespace) is mostly held by a crashed run's
    leftovers, and each loader worker keeps every sample in a /dev/shm mapping that is not
    fallocate'd (growth.py): once the tmpfs is full a worker dies of SIGBUS, the DataLoader
    raises, and the rank restarts its loader, whose new workers start up again
    (``worker_start_s``) and fill it again. The leftovers keep /dev/shm over the shm line
    when a worker dies, after its own pages are gone, as a full /dev/shm does."""
    needs = ("root", "unshare")

    def __init__(self, size_mib=128, leftover_mib=112, cache_kib=64):
        self.size_mib, self.leftover_mib, self.cache_kib = size_mib, leftover_mib, cache_kib
        self.summary = ("the target rank's /dev/shm is %d MiB, %d MiB of it held by leftovers; its "
                        "loader workers keep %d KiB a sample in /dev/shm until a page cannot be "
                        "backed (SIGBUS)" % (size_mib, leftover_mib, cache_kib))

    def prepare(self, run):
        run.plans[run.target].update(worker_shm_cache_bytes=self.cache_kib << 10,
                                     restart_on_worker_death=True,
                                     sharing_strategy="file_descriptor")  # torch's default

    def setup_lines(self):
        return TinyShm(self.size_mib, self.leftover_mib).setup_lines()


class NodeShm(Fault):
    """The /dev/shm of the target's lab node (lab/nodes.py: its mount namespace, which its
    pods' copy) is tiny and mostly held by leftovers: every rank on that node places its
    batches there as TinyShm's target does, and they share what is left (issue 35: a
    node-wide cause named for that node's ranks only)."""
    needs = ("root", "unshare")

    def __init__(self, size_mib=26, leftover_mib=20, sample_kib=96):
        self.size_mib, self.leftover_mib, self.sample_kib = size_mib, leftover_mib, sample_kib
        self.summary = ("the target's node has a %d MiB /dev/shm, %d MiB of it held by leftovers, "
                        "shared by every rank on that node" % (size_mib, leftover_mib))

    def prepare(self, run):
        node = run.node(run.target)
        if node is None or not node.isolated:
            raise RuntimeError("NodeShm needs the job on lab nodes")
        # over the node's own tmpfs, in its mount namespace only: gone with the node
        lines = TinyShm(self.size_mib, self.leftover_mib).setup_lines()
        subprocess.run(node.enter() + ["sh", "-c", "; ".join(lines)], check=True, capture_output=True)
        for rank, plan in enumerate(run.plans):
            if run.node(rank) is node:
                plan.update(sample_bytes=self.sample_kib * 1024, shm_retry_s=0.5, in_order=False,
                            sharing_strategy="file_descriptor")
