"""A real DataLoader training loop for the simulated-GPU check (run by
tests/exporters/gpu/test_sim_e2e.py).

One loader worker makes each batch in ~LOAD_S; the loop "computes" for COMPUTE_S per
batch, so it waits for data part of the time. The loop records its own compute
intervals (CLOCK_MONOTONIC ns, the hook's clock) independently of the hook, writes them
to argv[1], then stays alive until stdin closes (the agent forgets ranks whose process
exited).
"""
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stallscope

LOAD_S, COMPUTE_S, BATCHES = 0.030, 0.020, 100


class Slow(Dataset):
    def __len__(self):
        return BATCHES

    def __getitem__(self, i):
        time.sleep(LOAD_S)
        return torch.full((4,), float(i))


def main(out):
    loader = stallscope.watch(DataLoader(Slow(), batch_size=1, num_workers=1),
                              job="simjob", rank=0, pod="trainer-0", namespace="lab")
    compute = []
    for _batch in loader:
        t0 = time.perf_counter_ns()
        deadline = t0 + int(COMPUTE_S * 1e9)
        while time.perf_counter_ns() < deadline:  # compute: the simulated GPU's busy time
            pass
        compute.append((t0, time.perf_counter_ns()))
    with open(out, "w") as f:
        json.dump({"compute": compute, "cuda_initialized": torch.cuda.is_initialized()}, f)
    print("done", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
