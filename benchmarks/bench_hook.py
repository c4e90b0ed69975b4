"""Nanoseconds the hook adds per batch: watch() vs bare iteration over a trivial iterable,
and vs one prometheus_client Histogram.observe, all measured in this run.

    .venv/bin/python benchmarks/bench_hook.py
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("STALLSCOPE_SOCKET", "/nonexistent/stallscope-bench.sock")

import stallscope
from stallscope.hook import channel

N = 1_000_000
ROUNDS = 7


def bare(data):
    t = time.perf_counter_ns()
    for _ in data:
        pass
    return time.perf_counter_ns() - t


def watched(data):
    w = stallscope.watch(data)
    t = time.perf_counter_ns()
    for _ in w:
        pass
    dt = time.perf_counter_ns() - t
    channel.get().flush()  # drain outside the timed loop, as the flush thread would
    return dt


def histogram(data):
    from prometheus_client import CollectorRegistry, Histogram
    h = Histogram("bench_seconds", "bench", registry=CollectorRegistry())
    obs = h.observe
    t = time.perf_counter_ns()
    for _ in data:
        obs(0.001)
    return time.perf_counter_ns() - t


def best(fn, data):
    return min(fn(data) for _ in range(ROUNDS)) / len(data)


def main():
    data = list(range(N))
    b = best(bare, data)
    w = best(watched, data)
    h = best(histogram, data)
    added = w - b
    print("items per round: %d, best of %d rounds, python %s" % (N, ROUNDS, sys.version.split()[0]))
    print("bare iteration:          %7.1f ns/batch" % b)
    print("watched iteration:       %7.1f ns/batch" % w)
    print("added by watch():        %7.1f ns/batch   (target <= 300 ns)" % added)
    print("Histogram.observe alone: %7.1f ns/batch" % (h - b))
    print("ratio watched/bare:      %7.2fx" % (w / b))
    print("ratio added/observe:     %7.2fx" % (added / (h - b)))


if __name__ == "__main__":
    main()
