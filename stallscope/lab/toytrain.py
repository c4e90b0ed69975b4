"""A small instrumented training loop for tests and the lab: a real
``torch.utils.data.DataLoader`` with worker processes, wrapped in ``stallscope.watch``,
whose per-sample cost, compute step and cgroups are set from the command line.

    python -m stallscope.lab.toytrain --job J --rank R --pod P --namespace N --node X \\
        [--workers 2] [--batch-size 4] [--sample-sleep S] [--sample-cpu S] [--compute S] \\
        [--cgroup DIR]... [--worker-cgroup DIR]... [--duration S] \\
        [--shard-dir DIR [--shard-files N] [--cache-tier NAME --cache-hit-ratio R]]

A slowed rank is a real one: ``--sample-sleep`` is I/O-like latency per sample,
``--sample-cpu`` burns CPU time per sample (so a CFS quota on ``--worker-cgroup``
really throttles it). ``--cgroup`` moves the whole process tree (e.g. into a cgroup2
child for per-pod PSI) before torch loads; ``--worker-cgroup`` moves each loader worker
as it starts. ``--shard-dir`` makes each sample read one shard (file000 ...) through
``stallscope.DatasetRoot`` (its tier follows the mount: fuse, local ...), after a lookup
in a cache tier that hits ``--cache-hit-ratio`` of the time (hits skip the read). Runs
for ``--duration`` seconds or until SIGTERM/SIGINT.
"""
import argparse
import os
import signal
import sys
import time


def _join(cgroup_dir, pid):
    with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
        f.write(str(pid))


def _burn(cpu_seconds):
    # CPU time, not wall time: under a CFS quota the same work takes longer.
    end = time.thread_time() + cpu_seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.toytrain", description=__doc__.split("\n\n")[0])
    for name in ("job", "pod", "namespace", "node"):
        p.add_argument("--" + name, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-sleep", type=float, default=0.0, metavar="S")
    p.add_argument("--sample-cpu", type=float, default=0.0, metavar="S")
    p.add_argument("--compute", type=float, default=0.04, metavar="S", help="loop time per batch")
    p.add_argument("--cgroup", action="append", default=[], metavar="DIR")
    p.add_argument("--worker-cgroup", action="append", default=[], metavar="DIR")
    p.add_argument("--duration", type=float, default=120.0, metavar="S")
    p.add_argument("--shard-dir", metavar="DIR")
    p.add_argument("--shard-files", type=int, default=8)
    p.add_argument("--cache-tier", metavar="NAME")
    p.add_argument("--cache-hit-ratio", type=float, default=0.0, metavar="R")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    for d in args.cgroup:
        _join(d, os.getpid())
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))

    import torch
    from torch.utils.data import DataLoader, Dataset

    import stallscope

    root = stallscope.DatasetRoot(args.shard_dir) if args.shard_dir else None

    class Samples(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            if root is not None:
                hit = (i % 100) < args.cache_hit_ratio * 100
                if args.cache_tier:
                    stallscope.cache_lookup(args.cache_tier, hit=hit)
                if not (args.cache_tier and hit):
                    root.read("file%03d" % (i % args.shard_files))
            if args.sample_sleep:
                time.sleep(args.sample_sleep)
            if args.sample_cpu:
                _burn(args.sample_cpu)
            return torch.full((8,), float(i))

    def worker_init(_worker_id):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        torch.set_num_threads(1)
        for d in args.worker_cgroup:
            _join(d, os.getpid())

    loader = DataLoader(Samples(), batch_size=args.batch_size, num_workers=args.workers,
                        worker_init_fn=worker_init if args.workers else None,
                        persistent_workers=args.workers > 0)
    loader = stallscope.watch(loader, job=args.job, rank=args.rank, pod=args.pod,
                              namespace=args.namespace, node=args.node, world_size=args.world_size)
    deadline = time.monotonic() + args.duration
    for _batch in loader:
        time.sleep(args.compute)
        if stop or time.monotonic() > deadline:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
