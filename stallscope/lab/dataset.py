"""What a lab rank's DataLoader loads: the plan's per-sample work (reads, CPU, sleeps,
pacing, one slow worker, tensors that cost a transfer), its collate and its workers'
start (a cgroup, CPUs, a start-up cost). The plan's keys are described in trainer.py.
"""
import os
import random
import time

FEATURES = 64
SLOT_CREDIT_S = 0.002  # sample_pace_s: lateness a worker may make up


def _busy(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def _draw(batch):
    """A fixed pseudo-random number in [0, 1) per batch index, the same in every worker.
    Random, not every Nth: batch i goes to worker i mod W, so every 4th batch with 2
    workers put every costly batch on worker 0, a worker imbalance, not a spread."""
    return random.Random(batch).random()


def lab_dataset(plan):
    """The plan's dataset (its per-sample keys: trainer.py's docstring)."""
    import torch
    from torch.utils.data import Dataset

    from . import growth, sources

    class LabDataset(Dataset):
        def __init__(self):
            self.source = None
            self.keepers = None
            self.floats = max(FEATURES, plan.get("sample_bytes", 4096) // 4)
            self.tensors = max(1, plan.get("tensors_per_sample", 1))
            self.sleep_s, self.read_at = plan.get("sample_sleep_s", 0.0), 0.0
            self.pace_s, self.next_slot = plan.get("sample_pace_s", 0.0), 0.0

        def sleep_seconds(self):
            path = plan.get("sample_sleep_file")
            if path and time.monotonic() - self.read_at >= 0.2:
                self.read_at = time.monotonic()
                try:
                    with open(path) as f:
                        self.sleep_s = float(f.read().strip() or 0)
                except (OSError, ValueError):
                    pass
            return self.sleep_s

        def __len__(self):
            if plan.get("epoch_batches"):  # short epochs: the loader restarts its iterator
                return plan["epoch_batches"] * plan.get("batch_size", 8)
            return 10 ** 8  # one epoch outlasts any run: no worker restarts

        def __getitem__(self, i):
            if self.source is None:  # opened in the worker, after the fork
                self.source = sources.from_plan(plan) or False
            if self.keepers is None:
                self.keepers = growth.from_plan(plan)
            for keeper in self.keepers:
                keeper.keep()
            n = plan.get("reads_per_sample", 1)
            data = b"".join(self.source.read(i * n + k) for k in range(n)) if self.source else b""
            if plan.get("sample_cpu_s"):
                _busy(plan["sample_cpu_s"])
            sleep_s = self.sleep_seconds() + self.slow_worker_extra()
            heavy = plan.get("heavy_batch_every")
            if heavy and _draw(i // plan.get("batch_size", 8)) < 1.0 / heavy:
                sleep_s = plan["heavy_sleep_s"]  # a costly batch now and then: a wide spread
            if sleep_s:
                time.sleep(sleep_s)
            if self.pace_s:
                self.wait_for_slot()
            if self.tensors > 1:
                part = -(-self.floats // self.tensors)
                return tuple(torch.full((part,), float(len(data) % 7)) for _ in range(self.tensors))
            return torch.full((self.floats,), float(len(data) % 7))

        def slow_worker_extra(self):
            # One slow worker (issue 18): the loader worker with id slow_worker_id waits
            # slow_worker_sleep_s more per sample, as on a slow shard or a crowded core.
            extra = plan.get("slow_worker_sleep_s")
            if not extra:
                return 0.0
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            return extra if info is not None and info.id == plan.get("slow_worker_id", 0) else 0.0

        def wait_for_slot(self):
            # This worker's next delivery slot. Lateness of up to SLOT_CREDIT_S (a sleep
            # that overran on a busy machine) is made up; more is not: a worker that sat
            # idle with a full prefetch queue gets no burst, so the cap holds as a cap.
            now = time.monotonic()
            slot = max(self.next_slot, now - SLOT_CREDIT_S)
            if slot > now:
                time.sleep(slot - now)
            self.next_slot = slot + self.pace_s

    return LabDataset()


def retrying_collate(backoff_s):
    """default_collate, retried while /dev/shm has no room for the batch. Without the
    retry torch raises "unable to allocate shared memory(shm) ... No space left on
    device" into the training loop; a retrying loader stalls instead."""
    from torch.utils.data import default_collate

    state = {"errors": 0}

    def collate(samples):
        while True:
            try:
                return default_collate(samples)
            except RuntimeError as e:
                if "shared memory" not in str(e):
                    raise
                state["errors"] += 1
                if state["errors"] == 1 or state["errors"] % 100 == 0:
                    print("lab rank worker: %s [%d], retrying" % (
                        str(e).strip().splitlines()[-1], state["errors"]), flush=True)
                time.sleep(backoff_s)
    return collate


def worker_init(cgroup, cpus, start_s=0.0):
    # A fault made this cgroup with a CFS quota, or chose the CPUs the workers share with
    # busy neighbours; each loader worker moves itself as it starts, so only the workers
    # are affected. ``start_s``: an expensive worker start-up (an index built, a file
    # opened and mapped), paid again by every worker of every epoch without
    # persistent_workers.
    def init(_worker_id):
        if start_s:
            time.sleep(start_s)
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if cpus:
            os.sched_setaffinity(0, cpus)
        if start_s:
            time.sleep(start_s)
    return init
