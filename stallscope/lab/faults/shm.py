"""A tiny /dev/shm, mostly taken by the leftovers of an earlier crash."""
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
        plan.update(sample_bytes=self.sample_kib * 1024, shm_retry_s=0.5, in_order=False)

    def setup_lines(self):
        # In the target's own mount namespace: the host's /dev/shm is not touched.
        return ["mount -t tmpfs -o size=%dm,mode=1777 lab-shm /dev/shm" % self.size_mib,
                "head -c %d /dev/zero > /dev/shm/torch_leftover_of_crashed_run" % (self.leftover_mib << 20)]
