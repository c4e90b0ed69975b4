"""The per-batch handoff and what each transfer_cost fix buys (issue 30, item 5): a real
DataLoader whose 2 workers keep far ahead (samples cost nothing, the loop computes
100 ms a step), so every next() is the handoff alone: receiving the batch, unpickling it
and taking over its tensors. Measured per configuration, in one run:

- torch's default: 256 tensors a sample (8 a batch: 2,048), ``file_descriptor`` sharing
  (each tensor's storage taken over through the worker's resource sharer);
- the ``file_system`` sharing strategy (torch.multiprocessing.set_sharing_strategy);
- the sample's tensors packed into one (the same bytes), under either strategy;
- a pin-memory thread (pin_memory=True) needs an accelerator: torch starts none without
  one, so it is reported as not measured here.

    .venv/bin/python benchmarks/bench_handoff.py [--batches 60] [--tensors 256]

Prints the median and p90 of next() per batch, and each fix's ratio to the default.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = r"""
import json, sys, time, torch
from torch.utils.data import DataLoader, Dataset
strategy, tensors, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.multiprocessing.set_sharing_strategy(strategy)
torch.set_num_threads(1)

class Parts(Dataset):
    def __len__(self):
        return 1 << 20
    def __getitem__(self, i):
        if tensors == 1:
            return torch.zeros(1024)              # 4 KiB, one tensor
        return [torch.zeros(1024 // 256) for _ in range(256)]  # the same 4 KiB in 256 tensors

loader = DataLoader(Parts(), batch_size=8, num_workers=2, prefetch_factor=2, persistent_workers=True)
it = iter(loader)
next(it)
time.sleep(0.5)  # the workers fill the queue
took = []
for _ in range(batches):
    time.sleep(0.1)  # the step: the workers keep far ahead
    t = time.perf_counter()
    next(it)
    took.append(time.perf_counter() - t)
print(json.dumps(took))
"""

CONFIGS = (("default: 256 tensors a sample, file_descriptor", "file_descriptor", 256),
           ("file_system sharing", "file_system", 256),
           ("one tensor a sample, file_descriptor", "file_descriptor", 1),
           ("one tensor a sample, file_system", "file_system", 1))


def measure(strategy, tensors, batches):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", RUN, strategy, str(tensors), str(batches)],
                         capture_output=True, text=True, timeout=300, env=env)
    if out.returncode:
        raise SystemExit("bench_handoff: the loader run failed: %s" % out.stderr.strip()[-500:])
    took = sorted(json.loads(out.stdout.strip().splitlines()[-1]))
    return statistics.median(took), took[int(0.9 * (len(took) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--tensors", type=int, default=256, help="tensors a sample in the default")
    a = ap.parse_args()
    rows = []
    for name, strategy, tensors in CONFIGS:
        tensors = a.tensors if tensors != 1 else 1
        rows.append((name, *measure(strategy, tensors, a.batches)))
    base = rows[0][1]
    print("%-48s %10s %10s %8s %s" % ("handoff per batch (8 samples)", "median", "p90", "x",
                                      "of a 150 ms step"))
    for name, med, p90 in rows:
        print("%-48s %8.2fms %8.2fms %7.2fx %6.1f%%" % (name, 1e3 * med, 1e3 * p90, med / base,
                                                        100 * med / 0.15))
    print("%-48s %10s" % ("pin_memory=True (a pin-memory thread)", "not measured: needs an accelerator"))


if __name__ == "__main__":
    main()
