"""A real training loop for the loader tests: a DataLoader whose samples take a known
time (sleep, so that the cost does not depend on how loaded the machine is) and a
compute step of a known time. Prints one JSON line when done, then stays alive until
its stdin closes, so the agent keeps the rank while the test reads it.

    python tests/helpers/trainers/loader_trainer.py '{"workers": 2, "sample_s": 0.01,
        "batch": 4, "compute_s": 0.006, "batches": 30, "start": "fork"}'

"wrap" puts another tool's instrumentation in front of the loader's iterator first:
"generator" patches DataLoader.__iter__ with a generator around the original (the way
TraceML's auto mode does), "traceml" runs TraceML's own auto mode (traceml_ai.init,
reporting to the aggregator at TRACEML_AGGREGATOR_PORT, its logs in TRACEML_LOGS_DIR).
"""
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import stallscope
from stallscope.hook import channel


class SlowMap(Dataset):
    def __init__(self, n, sample_s):
        self.n, self.sample_s = n, sample_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sample_s)
        return torch.tensor([i])


class SlowIterable(IterableDataset):
    def __init__(self, n, sample_s):
        self.n, self.sample_s = n, sample_s

    def __iter__(self):
        info = get_worker_info()
        k, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(k, self.n, step):
            time.sleep(self.sample_s)
            yield torch.tensor([i])


def wrap_iter(how):
    if how == "generator":
        original = DataLoader.__iter__

        def patched(self):  # a generator: the DataLoader's iterator is built on first next()
            yield from original(self)

        DataLoader.__iter__ = patched
    elif how == "traceml":
        import traceml_ai

        traceml_ai.init(mode="auto", aggregator_port=int(os.environ["TRACEML_AGGREGATOR_PORT"]),
                        logs_dir=os.environ["TRACEML_LOGS_DIR"], on_missing_aggregator="raise")
        assert getattr(DataLoader, "_traceml_patched", False), "TraceML did not patch DataLoader"


def main():
    cfg = json.loads(sys.argv[1])
    wrap_iter(cfg.get("wrap"))
    workers = cfg.get("workers", 0)
    n = cfg.get("batches", 20) * cfg.get("batch", 4)
    kind = SlowIterable if cfg.get("iterable") else SlowMap
    kw = {}
    if workers:
        kw = dict(persistent_workers=True, multiprocessing_context=cfg.get("start", "fork"))
    dl = DataLoader(kind(n, cfg.get("sample_s", 0.01)), batch_size=cfg.get("batch", 4),
                    num_workers=workers, **kw)
    loader = stallscope.watch(dl)
    batches = 0
    for _epoch in range(cfg.get("epochs", 1)):
        for _batch in loader:
            time.sleep(cfg.get("compute_s", 0.005))
            batches += 1
    if cfg.get("then"):  # the loader restarted with other settings (issue 17's proof afterwards)
        cfg.update(cfg.pop("then"))
        kw = dict(persistent_workers=True, multiprocessing_context=cfg.get("start", "fork"))
        n = cfg.get("batches", 20) * cfg.get("batch", 4)
        dl = DataLoader(kind(n, cfg.get("sample_s", 0.01)), batch_size=cfg.get("batch", 4),
                        num_workers=cfg["workers"], **kw)
        for _batch in stallscope.watch(dl):
            time.sleep(cfg.get("compute_s", 0.005))
            batches += 1
        workers = cfg["workers"]
    pids = [w.pid for w in dl._iterator._workers] if workers else []
    channel.get().flush()
    print(json.dumps({"pid": os.getpid(), "worker_pids": pids, "batches": batches}), flush=True)
    sys.stdin.read()  # the test closes stdin (or kills us) when it has read the agent


if __name__ == "__main__":
    main()
