"""Checkpoint bursts: ``python -m stallscope.lab.checkpointer URL [--mib N] [--every S]
[--streams K]``.

Every ``--every`` seconds uploads a ``--mib`` MiB checkpoint to the lab's object store
(objstore.py) as ``--streams`` parts in parallel, the way sharded checkpoint writers
(torch.distributed.checkpoint, multipart uploads) keep many requests in flight. The
store writes them through to the disk that holds the shards.
"""
import argparse
import http.client
import os
import threading
import time
import urllib.parse

CHUNK = 1 << 20


def upload(url, name, nbytes, block):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        conn.putrequest("PUT", "/checkpoints/" + name)
        conn.putheader("Content-Length", str(nbytes))
        conn.endheaders()
        left = nbytes
        while left > 0:
            n = min(CHUNK, left)
            conn.send(block[:n])
            left -= n
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def burst(url, seq, mib, streams, block):
    part = mib * (1 << 20) // streams
    threads = [threading.Thread(target=upload, args=(url, "ckpt-%05d.part%d" % (seq, k), part, block))
               for k in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.checkpointer")
    p.add_argument("url")
    p.add_argument("--mib", type=int, default=384)
    p.add_argument("--every", type=float, default=6.0)
    p.add_argument("--streams", type=int, default=8)
    a = p.parse_args(argv)
    block = os.urandom(CHUNK)  # incompressible, like real weights
    seq = 0
    while True:
        t0 = time.monotonic()
        burst(a.url, seq, a.mib, a.streams, block)
        print("checkpoint %d: %d MiB in %.2fs" % (seq, a.mib, time.monotonic() - t0), flush=True)
        seq += 1
        time.sleep(max(0.0, a.every - (time.monotonic() - t0)))


if __name__ == "__main__":
    main()
