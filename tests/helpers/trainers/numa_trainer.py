"""A real training loop whose DataLoader worker burns CPU on every sample and is pinned
by ``worker_init_fn`` to the CPUs in $PIN_CPUS (os.sched_setaffinity, the runbook's own
fix, here used to place it): tests/exporters/test_numa.py runs it on the CPU a NUMA
fixture puts on the GPU's node or the other one. One worker, a batch of 84 CPU-ms
against 80 ms of compute: it falls short by a twentieth, which the placement's modelled
cost (standing_causes.REMOTE_SLOWDOWN) more than covers, and still does on a machine busy
enough to stretch it by half; its core is its own (one worker on
a CPU of its own: no run-queue wait to blur it).

    PIN_CPUS=0 python tests/helpers/trainers/numa_trainer.py SECONDS
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stallscope

SAMPLE_S = 0.021  # CPU-seconds per sample (a busy loop: decode-like work)
BATCH = 4
COMPUTE_S = 0.08


class Busy(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        end = time.thread_time() + SAMPLE_S
        x = 0
        while time.thread_time() < end:
            x += 1
        return torch.tensor([i, x % 7])


def pin(_worker_id):
    os.sched_setaffinity(0, {int(c) for c in os.environ["PIN_CPUS"].split(",")})


def main():
    seconds = float(sys.argv[1])
    loader = DataLoader(Busy(), batch_size=BATCH, num_workers=1, worker_init_fn=pin,
                        persistent_workers=True)
    loader = stallscope.watch(loader, job="numa", rank=0)
    t0 = time.monotonic()
    for _ in loader:
        time.sleep(COMPUTE_S)
        if time.monotonic() - t0 > seconds:
            break
    print("done", flush=True)
    sys.stdin.read()  # stay until the test has read the agent


if __name__ == "__main__":
    main()
