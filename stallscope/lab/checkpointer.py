"""Checkpoint bursts: ``python -m stallscope.lab.checkpointer DIR [--mib N] [--every S]``.

Every ``--every`` seconds writes a ``--mib`` MiB file into DIR in 4 MiB chunks, fsyncs
it (as torch.save followed by os.fsync, or a checkpoint library's durable write) and
removes the previous one. The writes go to the disk that holds DIR; readers of that
disk that miss the page cache queue behind the flush.
"""
import argparse
import os
import time

CHUNK = 4 << 20


def burst(directory, mib, seq):
    path = os.path.join(directory, "checkpoint-%04d.pt" % seq)
    block = os.urandom(CHUNK)  # incompressible, like real weights
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max(1, mib * (1 << 20) // CHUNK)):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.checkpointer")
    p.add_argument("directory")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--every", type=float, default=5.0)
    a = p.parse_args(argv)
    os.makedirs(a.directory, exist_ok=True)
    previous, seq = None, 0
    while True:
        t0 = time.monotonic()
        path = burst(a.directory, a.mib, seq)
        if previous:
            os.unlink(previous)
        previous, seq = path, seq + 1
        print("checkpoint %s: %d MiB in %.2fs" % (os.path.basename(path), a.mib,
                                                 time.monotonic() - t0), flush=True)
        time.sleep(max(0.0, a.every - (time.monotonic() - t0)))


if __name__ == "__main__":
    main()
