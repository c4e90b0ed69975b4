"""A tiny HTTP object store over a directory, the lab's shared storage:
``python -m stallscope.lab.objstore DIR PORT [--latency S] [--bandwidth MBPS]``.

``GET /<name>`` (with ``Range: bytes=a-b``) serves DIR/<name> after ``--latency``
seconds, as a remote store's first-byte latency; with ``--slow-every P --slow-for D
--slow-latency L`` after L seconds instead during the first D seconds of every P since
the server started (brownouts of a degraded endpoint). ``PUT /checkpoints/<name>`` stores a
body under DIR/checkpoints, flushed to the disk as it arrives (fdatasync every 8 MiB,
as durable checkpoint writers do) and keeps only the newest checkpoint set.

``--host`` is the address it listens on (127.0.0.1; the lab's shaped store listens in a
network namespace of its own, lab/faults/network.py). ``--log FILE`` appends a line per
GET it answered, ``<CLOCK_MONOTONIC ns> <status> <bytes sent>``: the bytes it served and
when, to check what the agent counted against (the hook stamps reads on the same clock).
``--error-rate F`` answers ``--error-status`` (503: "slow down") to that fraction of
GETs, evenly spread (every 1/F-th), before any latency or body.

``--bandwidth`` caps all transfers together, like the provisioned throughput of a
network volume or a shared file server: every 64 KiB chunk, read or written, reserves
the next free slot on one timeline. A checkpoint uploaded over 8 streams then holds 8
of every 9 slots, and a loader's read takes 9 times longer while it lasts. No root, no
FUSE: the scenarios that use it run anywhere.
"""
import argparse
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
CHUNK = 64 << 10
SYNC_EVERY = 8 << 20


class Bandwidth:
    """One shared timeline of transfer slots (FIFO across all connections)."""

    def __init__(self, bytes_per_s):
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.next_free = 0.0

    def take(self, n):
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + n / self.rate
            done = self.next_free
        time.sleep(max(0.0, done - time.monotonic()))


def brownout(latency, every=0.0, length=0.0, slow=0.0, t0=None):
    """() -> the first-byte latency now: ``slow`` during the first ``length`` seconds
    of every ``every`` since ``t0``, ``latency`` otherwise."""
    t0 = time.monotonic() if t0 is None else t0

    def now():
        if every and (time.monotonic() - t0) % every < length:
            return slow
        return latency
    return now


class Ledger:
    """What the store answered: a line per GET in ``path`` (None: kept nowhere), and
    which GETs fail (every 1/rate-th, from the first)."""

    def __init__(self, path=None, error_rate=0.0):
        self.path, self.rate = path, error_rate
        self.lock = threading.Lock()
        self.gets = 0

    def fails(self):
        with self.lock:
            self.gets += 1
            n = self.gets
        return self.rate > 0 and int(n * self.rate) > int((n - 1) * self.rate)

    def served(self, status, nbytes):
        if self.path:
            with self.lock, open(self.path, "a") as f:
                f.write("%d %d %d\n" % (time.monotonic_ns(), status, nbytes))


def served_bytes(path, since_ns=0, until_ns=None):
    """(GETs answered, bytes sent with a 2xx) from a ``--log`` file, of the GETs that
    ended between ``since_ns`` and ``until_ns`` (CLOCK_MONOTONIC)."""
    gets = sent = 0
    with open(path) as f:
        for line in f:
            t, status, nbytes = (int(x) for x in line.split())
            if t < since_ns or (until_ns is not None and t > until_ns):
                continue
            gets += 1
            if 200 <= status < 300:
                sent += nbytes
    return gets, sent


def handler(root, latency, bandwidth, ledger=None, error_status=503):
    """``latency``: seconds, or a function giving them (see brownout)."""
    ckpt_dir = os.path.join(root, "checkpoints")
    delay = latency if callable(latency) else (lambda: latency)
    ledger = ledger or Ledger()

    class ObjectHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if ledger.fails():
                self._head(error_status, 0)
                ledger.served(error_status, 0)
                return
            time.sleep(delay())
            path = os.path.join(root, os.path.basename(self.path.split("?", 1)[0]))
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    start, end, status = 0, size - 1, 200
                    m = _RANGE.match(self.headers.get("Range", ""))
                    if m:
                        start = int(m.group(1))
                        end = min(size - 1, int(m.group(2))) if m.group(2) else size - 1
                        status = 206
                    f.seek(start)
                    self._head(status, max(0, end - start + 1))
                    left = end - start + 1
                    sent = 0
                    while left > 0:
                        chunk = f.read(min(CHUNK, left))
                        if not chunk:
                            break
                        bandwidth.take(len(chunk))
                        self.wfile.write(chunk)
                        left -= len(chunk)
                        sent += len(chunk)
                    ledger.served(status, sent)
            except (FileNotFoundError, IsADirectoryError):
                self._head(404, 0)
                ledger.served(404, 0)

        def do_PUT(self):
            name = os.path.basename(self.path.split("?", 1)[0])
            left = int(self.headers.get("Content-Length", "0"))
            os.makedirs(ckpt_dir, exist_ok=True)
            path = os.path.join(ckpt_dir, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                unsynced = 0
                while left > 0:
                    chunk = self.rfile.read(min(CHUNK, left))
                    if not chunk:
                        break
                    bandwidth.take(len(chunk))
                    os.write(fd, chunk)
                    left -= len(chunk)
                    unsynced += len(chunk)
                    if unsynced >= SYNC_EVERY:
                        os.fdatasync(fd)
                        unsynced = 0
                os.fsync(fd)
            finally:
                os.close(fd)
            _keep_newest(ckpt_dir, name)
            self._head(201, 0)

        def _head(self, status, length):
            self.send_response(status)
            self.send_header("Content-Length", str(length))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()

    return ObjectHandler


def _keep_newest(directory, name):
    """Remove the parts of older checkpoints ("<set>.partN": keep the newest set)."""
    current = name.split(".part", 1)[0]
    for other in os.listdir(directory):
        if other.split(".part", 1)[0] < current:
            try:
                os.unlink(os.path.join(directory, other))
            except OSError:
                pass


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.objstore")
    p.add_argument("root")
    p.add_argument("port", type=int)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--log", default=None, help="append '<status> <bytes>' per GET answered")
    p.add_argument("--error-rate", type=float, default=0.0, metavar="F",
                   help="answer --error-status to this fraction of GETs (every 1/F-th)")
    p.add_argument("--error-status", type=int, default=503)
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each GET answers")
    p.add_argument("--bandwidth", type=float, default=0.0, help="MB/s shared by all transfers (0: no cap)")
    p.add_argument("--slow-every", type=float, default=0.0, metavar="P",
                   help="a brownout starts every P seconds (0: never)")
    p.add_argument("--slow-for", type=float, default=0.0, metavar="D", help="... and lasts D seconds")
    p.add_argument("--slow-latency", type=float, default=0.0, metavar="L",
                   help="... with L seconds before each GET answers")
    a = p.parse_args(argv)
    latency = brownout(a.latency, a.slow_every, a.slow_for, a.slow_latency)
    if not 0.0 <= a.error_rate <= 1.0:
        p.error("--error-rate is a fraction between 0 and 1")
    server = ThreadingHTTPServer((a.host, a.port),
                                 handler(a.root, latency, Bandwidth(a.bandwidth * 1e6),
                                         Ledger(a.log, a.error_rate), a.error_status))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
