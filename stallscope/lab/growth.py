"""What a lab loader worker keeps, sample after sample, until the kernel kills it (issue 18:
the shm-bus-error and oom-kill scenarios). Runs in the loader workers.

- ``ShmCache``: each sample is also kept in a mapping of a /dev/shm file that is sized
  with ftruncate, not fallocate'd, as numpy memmaps, ``multiprocessing.shared_memory`` or
  a native decoder's staging buffers are (torch's own batch buffers are fallocate'd and
  fail with ENOSPC instead). Once the tmpfs is full, the next page written cannot be
  backed: the worker dies of SIGBUS ("DataLoader worker (pid N) is killed by signal: Bus
  error"). The files are unlinked once mapped, so a dead worker's pages go with it.
- ``Heap``: each sample is also kept in the worker's heap (an unbounded cache; the
  copy-on-access growth of a dataset held in Python lists looks the same from outside):
  the worker's RSS grows until the pod's memory limit gets it OOM-killed.
"""
import mmap
import os

SHM = "/dev/shm"


class ShmCache:
    def __init__(self, per_sample):
        self.per_sample = per_sample
        self.maps = []

    def keep(self):
        path = os.path.join(SHM, "stallscope-lab-cache-%d-%d" % (os.getpid(), len(self.maps)))
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.per_sample)  # sized, not allocated: pages come on first write
            m = mmap.mmap(fd, self.per_sample)
        finally:
            os.unlink(path)
            os.close(fd)
        m[:] = b"\1" * self.per_sample  # a page tmpfs cannot back: SIGBUS here
        self.maps.append(m)


class Heap:
    def __init__(self, per_sample):
        self.per_sample = per_sample
        self.kept = []

    def keep(self):
        self.kept.append(bytearray(b"\1" * self.per_sample))  # written: resident, not just mapped


def from_plan(plan):
    """The keepers a worker's dataset calls once per sample (none unless the plan asks)."""
    out = []
    if plan.get("worker_shm_cache_bytes"):
        out.append(ShmCache(plan["worker_shm_cache_bytes"]))
    if plan.get("worker_leak_bytes"):
        out.append(Heap(plan["worker_leak_bytes"]))
    return out
