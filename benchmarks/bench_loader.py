"""What the loader-side hook adds inside a worker, per sample, all measured in this run:

- batch timing: torch's own map-style fetcher (the call a DataLoader worker makes per
  batch) bare vs wrapped by stallscope, for a trivial dataset (worst case: the sample
  costs nothing) and one returning a small tensor with torch's default collate;
- the shard/cache API: ``shard_read`` (context manager), ``cache_lookup``, and a 4 KiB
  read through a ``DatasetRoot`` vs plain ``open().read()``.

    .venv/bin/python benchmarks/bench_loader.py
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("STALLSCOPE_SOCKET", "/nonexistent/stallscope-bench.sock")

import torch
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.fetch import _MapDatasetFetcher

import stallscope
from stallscope.hook import batches, shards

ROUNDS = 7
BATCH = 32


class Trivial:
    def __getitem__(self, i):
        return i


class Tensors:
    def __init__(self):
        self.x = torch.arange(16)

    def __getitem__(self, i):
        return self.x + i


def best(fn, *args):
    return min(fn(*args) for _ in range(ROUNDS))


def paired(fn_a, fn_b, *args, rounds=ROUNDS):
    """Best of each, measured alternately so that a busy machine hits both alike."""
    a, b = [], []
    for _ in range(rounds):
        a.append(fn_a(*args))
        b.append(fn_b(*args))
    return min(a), min(b)


def fetch_ns_per_sample(fetcher, n_batches):
    index = list(range(BATCH))
    t = time.perf_counter_ns()
    for _ in range(n_batches):
        fetcher.fetch(index)
    return (time.perf_counter_ns() - t) / (n_batches * BATCH)


def fetchers(dataset, collate):
    bare = _MapDatasetFetcher(dataset, True, collate, False)
    buf = []
    timed = batches._TimedFetcher(_MapDatasetFetcher(dataset, True, collate, False), buf)
    return bare, timed, buf


def per_call_ns(fn, n):
    t = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t) / n


def main():
    print("batch production timing, per sample (batch of %d), best of %d:" % (BATCH, ROUNDS))
    for name, ds, collate, n in (("trivial sample, list collate", Trivial(), list, 20_000),
                                 ("16-int tensor, default_collate", Tensors(), default_collate, 2_000)):
        bare, timed, buf = fetchers(ds, collate)
        b, w = [], []
        for _ in range(ROUNDS):
            b.append(fetch_ns_per_sample(bare, n))
            w.append(fetch_ns_per_sample(timed, n))
            del buf[:]
        b, w = min(b), min(w)
        print("  %-32s bare %8.1f ns  watched %8.1f ns  added %6.1f ns/sample  ratio %.3f"
              % (name, b, w, w - b, w / b))

    shards._registered_pid = os.getpid()  # measure the API, not a flush thread's drains
    n = 200_000

    def ctx():
        with stallscope.shard_read("s3://b/shard", tier="s3") as r:
            r.bytes = 1

    def empty():
        pass

    def lookup():
        stallscope.cache_lookup("page", True)

    c = best(per_call_ns, ctx, n) - best(per_call_ns, empty, n)
    shards._reads.clear()
    lk = best(per_call_ns, lookup, n) - best(per_call_ns, empty, n)
    print("shard/cache API, per call: shard_read %.0f ns, cache_lookup %.0f ns" % (c, lk))

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sample.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(4096))
        root = stallscope.DatasetRoot(d)

        def plain():
            with open(path, "rb") as f:
                f.read()

        def timed_read():
            root.read("sample.bin")
        p, t = paired(lambda: per_call_ns(plain, 20_000), lambda: per_call_ns(timed_read, 20_000))
        shards._reads.clear()
        print("4 KiB file read (page cache): plain %.0f ns, DatasetRoot.read %.0f ns, added %.0f ns, "
              "ratio %.2f" % (p, t, t - p, t / p))


if __name__ == "__main__":
    main()
