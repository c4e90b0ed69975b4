"""A small instrumented training loop for the integration tests.

Runs a real torch DataLoader (or a plain list with --plain) wrapped by stallscope.watch,
sleeps --compute seconds per batch as the "compute step", and writes what it measured
itself (elapsed time per epoch, compute time, batches, max gap) to --out as JSON, so
tests can compare the agent's numbers with the loop's own.
"""
import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository root
import stallscope


class SleepyDataset:
    def __init__(self, n, sleep):
        self.n, self.sleep = n, sleep

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        return i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--sample-sleep", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--compute", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--duration", type=float, default=0.0, help="repeat epochs until this many seconds")
    p.add_argument("--plain", action="store_true", help="iterate a list instead of a DataLoader")
    p.add_argument("--linger", type=float, default=0.6, help="seconds to stay alive after the loop")
    p.add_argument("--out")
    a = p.parse_args()

    if a.plain:
        loader = list(range(a.samples))
    else:
        from torch.utils.data import DataLoader
        loader = DataLoader(SleepyDataset(a.samples, a.sample_sleep), batch_size=a.batch_size,
                            num_workers=a.workers)
    loader = stallscope.watch(loader)
    stats = {"epochs": [], "batches": 0, "compute_s": 0.0, "max_gap_s": 0.0, "pid": os.getpid()}
    t_begin = time.perf_counter()
    epoch = 0
    while epoch < a.epochs or (a.duration and time.perf_counter() - t_begin < a.duration):
        it = iter(loader)
        start = time.perf_counter()
        last = start
        n = 0
        epoch_compute = []
        for _ in it:
            now = time.perf_counter()
            stats["max_gap_s"] = max(stats["max_gap_s"], now - last)
            n += 1
            end_of_batch = now
            if a.compute:
                c0 = time.perf_counter()
                time.sleep(a.compute)
                epoch_compute.append(time.perf_counter() - c0)
            last = time.perf_counter()
            if a.duration and last - t_begin >= a.duration:
                break
        # the hook's step sum for an epoch spans first next() → last batch's arrival
        # the last batch's compute happens after the span the hook measures
        stats["epochs"].append({"batches": n, "elapsed_s": end_of_batch - start,
                                "compute_in_span_s": sum(epoch_compute[:-1])})
        stats["compute_s"] += sum(epoch_compute)
        stats["batches"] += n
        epoch += 1
        if a.duration and time.perf_counter() - t_begin >= a.duration:
            break
    stats["loop_s"] = time.perf_counter() - t_begin
    time.sleep(a.linger)  # let the flush thread deliver; atexit flushes the rest
    if a.out:
        with open(a.out, "w") as f:
            json.dump(stats, f)


if __name__ == "__main__":
    main()
