"""Nanoseconds the hook adds per batch: watch() vs bare iteration over a trivial iterable,
and vs one prometheus_client Histogram.observe; and the flush thread's CPU time per batch
(drain, encode, send to a real socket), for the binary wire format against the former
JSON lists, all measured in this run.

    .venv/bin/python benchmarks/bench_hook.py
"""
import json
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("STALLSCOPE_SOCKET", "/nonexistent/stallscope-bench.sock")
# The loop's cost alone: the flush thread (measured on its own below) must not run during
# the timed loop. At a million batches a second its work would land in the loop's time
# through the GIL, which no real training loop (milliseconds a batch) sees.
os.environ["STALLSCOPE_FLUSH_INTERVAL"] = "3600"

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


def sink():
    """A SEQPACKET listener that reads and discards, like an agent that keeps up."""
    path = os.path.join(tempfile.mkdtemp(), "sink.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(4)

    def run():
        while True:
            conn, _ = srv.accept()
            while conn.recv(1 << 17):
                pass
    threading.Thread(target=run, daemon=True).start()
    return path


FLUSH_BATCHES = 200_000
PER_FLUSH = 400  # a 250 ms flush of a loop at 1,600 batches/s


def flush_cost(path, legacy=False):
    """CPU ns per batch of the flush thread's work for FLUSH_BATCHES batches."""
    ch = channel.Channel(path=path)
    ch._connect().setblocking(True)  # both formats wait for the reader, none is dropped
    stream = channel.Stream({"job": "bench", "rank": 0})
    ch.streams.append(stream)
    t0 = time.perf_counter_ns()
    spent = 0
    for k in range(FLUSH_BATCHES // PER_FLUSH):
        base = t0 + k * PER_FLUSH * 2000
        stream.buf.extend(x for i in range(PER_FLUSH) for x in (base + 2000 * i, base + 2000 * i + 500))
        c = time.thread_time_ns()
        if legacy:
            legacy_flush(ch, stream)
        else:
            ch.flush()
        spent += time.thread_time_ns() - c
    return spent / FLUSH_BATCHES


def legacy_flush(ch, stream):
    """The former wire format: events as JSON lists of lists, one Python list a batch."""
    buf = stream.buf
    n = len(buf) & ~1
    pairs = buf[:n]
    del buf[:n]
    events = []
    prev = stream.prev_end
    for j in range(0, n, 2):
        start, end = pairs[j], pairs[j + 1]
        wait = end - start
        events.append([end, wait, end - prev if prev is not None else wait])
        prev = end
    stream.prev_end = prev
    for i in range(0, len(events), 1000):
        msg = ch._message(stream.ident, "main", {"events": events[i:i + 1000]})
        data = json.dumps(msg, separators=(",", ":")).encode()
        ch.sock.send(data)


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
    path = sink()
    f = min(flush_cost(path) for _ in range(3))
    legacy = min(flush_cost(path, legacy=True) for _ in range(3))
    print("flush thread, CPU per batch (drain + encode + send, %d-batch flushes):" % PER_FLUSH)
    print("  binary columns (wire v2): %7.1f ns/batch" % f)
    print("  JSON lists (wire v1):     %7.1f ns/batch" % legacy)
    print("  ratio v2/v1:              %7.2fx" % (f / legacy))
    print("all-in per batch (loop + flush thread): %.1f ns" % (added + f))


if __name__ == "__main__":
    main()
