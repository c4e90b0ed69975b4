"""A real training loop with only the two public lines, whose 2 DataLoader workers do one
thing per sample, for tests/exporters/test_loaderstate.py:

- ``read DIR``: read a 64 KiB file from DIR with plain open()/read() (a slow FUSE mount
  there: the workers block in read());
- ``busy``: burn 100 ms of CPU (the workers on the CPU: 2 of them make a batch of 2
  every 100 ms, against 50 ms of compute);
- ``idle``: nothing (the loader keeps up; the workers wait on their index queues).

    STALLSCOPE_SOCKET=... python tests/helpers/trainers/state_trainer.py MODE [DIR] SECONDS
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stallscope

COMPUTE_S = 0.05


class Work(Dataset):
    def __init__(self, mode, directory):
        self.mode, self.directory = mode, directory
        self.files = sorted(os.listdir(directory)) if directory else []

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        if self.mode == "read":
            with open(os.path.join(self.directory, self.files[i % len(self.files)]), "rb") as f:
                f.seek((i * 65536) % (1 << 19))
                data = f.read(65536)
            return torch.tensor([len(data)])
        if self.mode == "busy":
            end = time.thread_time() + 0.1
            x = 0
            while time.thread_time() < end:
                x += 1
            return torch.tensor([x % 7])
        return torch.tensor([i])


def main():
    mode = sys.argv[1]
    directory = sys.argv[2] if mode == "read" else None
    seconds = float(sys.argv[-1])
    loader = DataLoader(Work(mode, directory), batch_size=2, num_workers=2, persistent_workers=True)
    loader = stallscope.watch(loader, job="state-%s" % mode, rank=0)
    t0 = time.monotonic()
    for _ in loader:
        time.sleep(COMPUTE_S)
        if time.monotonic() - t0 > seconds:
            break
    print("done", flush=True)
    sys.stdin.read()  # stay until the test has read the agent


if __name__ == "__main__":
    main()
