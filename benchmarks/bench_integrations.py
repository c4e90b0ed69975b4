"""What each framework integration adds to the hook's per-batch cost: the same trivial
DataLoader (num_workers=0, so the loop's own cost is all there is to see) iterated the
way each framework iterates it, unwatched and watched, best of several rounds, in this
run. The hook's own cost (a watched list against a bare one) is the reference: an
integration adds nothing when its extra is that cost (the DataLoader's single-process
fetch timing comes on top for every DataLoader, integration or not).

    .venv/bin/python benchmarks/bench_integrations.py [--batches 20000]
    .venv-composer/bin/python benchmarks/bench_integrations.py   # Composer's line (make test-composer's venv)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("STALLSCOPE_SOCKET", "/nonexistent/stallscope-bench.sock")
os.environ["STALLSCOPE_FLUSH_INTERVAL"] = "3600"  # the flush thread's work is not the loop's

import torch
from torch.utils.data import DataLoader

import stallscope

ROUNDS = 40  # short epochs, plain and watched alternating: the best of each finds the
# machine's quiet moments, which a shared 2-core machine has few of


def _epoch_ns(make_iterable):
    # CPU time of this thread (num_workers=0: the loader's work is all in it): a loaded
    # machine's scheduler does not land in the figure, as it does in wall-clock time
    it = make_iterable()
    t = time.thread_time_ns()
    count = sum(1 for _ in it)
    return (time.thread_time_ns() - t) / max(1, count)


def per_batch_ns(plain, watched):
    a = b = float("inf")
    for _ in range(ROUNDS):
        a = min(a, _epoch_ns(plain))
        b = min(b, _epoch_ns(watched))
    return a, b


def loader(n):
    return DataLoader(list(range(n)), batch_size=1, num_workers=0)


def cases(n):
    out = {"list (hook alone)": (lambda: list(range(n)), lambda: stallscope.watch(list(range(n)))),
           "DataLoader": (lambda: loader(n), lambda: stallscope.watch(loader(n)))}

    try:
        from accelerate import Accelerator

        from stallscope.integrations.huggingface import watch_prepared
        acc = Accelerator(cpu=True)
        out["accelerate prepare (generator)"] = (lambda: acc.prepare(loader(n)),
                                                 lambda: watch_prepared(acc.prepare(loader(n))))

        def trainer_style():
            shard = acc.prepare(loader(n))
            shard.base_dataloader = stallscope.watch(shard.base_dataloader)  # the HF callback
            return shard
        out["transformers Trainer callback"] = (lambda: acc.prepare(loader(n)), trainer_style)
    except ImportError:
        print("accelerate not installed: skipped")
    try:
        from pytorch_lightning.utilities import CombinedLoader
        out["Lightning CombinedLoader"] = (
            lambda: CombinedLoader(loader(n), "max_size_cycle"),
            lambda: CombinedLoader(stallscope.watch(loader(n)), "max_size_cycle"))
    except ImportError:
        print("pytorch-lightning not installed: skipped")
    try:
        out["Composer callback (islice)"] = composer_case(n)
    except ImportError:
        print("composer not installed (it has a venv of its own: make test-composer): skipped")
    return out


def composer_case(n):
    """Composer iterates ``itertools.islice(state.dataloader, dataloader_len)``; the
    callback, on a real State, swaps the watched loader in at EPOCH_START."""
    import itertools

    from composer.core import State
    from composer.devices import DeviceCPU

    from stallscope.integrations.composer import StallscopeCallback

    def state_for(dl):
        return State(model=torch.nn.Linear(1, 1), rank_zero_seed=0, run_name="bench", device=DeviceCPU(),
                     train_dataloader=dl, dataloader=dl, dataloader_label="train", max_duration="1ep")

    def plain():
        st = state_for(loader(n))
        return itertools.islice(st.dataloader, int(st.dataloader_len))

    def watched():
        st = state_for(loader(n))
        StallscopeCallback().epoch_start(st, None)
        return itertools.islice(st.dataloader, int(st.dataloader_len))
    return plain, watched


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=2000, help="batches an epoch")
    n = p.parse_args().batches
    torch.set_num_threads(1)
    results = {}
    for name, (plain, watched) in cases(n).items():
        a, b = per_batch_ns(plain, watched)
        results[name] = (a, b, b - a)
    ref = results["DataLoader"][2]
    print("%-32s %12s %12s %12s %10s" % ("iterated as", "plain ns", "watched ns", "added ns", "vs DL"))
    for name, (a, b, d) in results.items():
        print("%-32s %12.0f %12.0f %12.0f %9.2fx" % (name, a, b, d, d / ref if ref else float("nan")))


if __name__ == "__main__":
    main()
