"""loaderio: how many bytes each rank's loader reads, from the kernel's own I/O
accounting, with no line of instrumentation (issue 31, item 1: "do the bytes/s math").

``/proc/<pid>/io`` (kernel Documentation/filesystems/proc.rst, "/proc/<pid>/io - Display
the IO accounting fields"): ``rchar`` counts every byte the task's read(), pread() and
readv() calls returned, page-cache hits and pipes included; ``read_bytes`` the bytes the
task caused to be fetched from the block layer. A socket read with recv(), recvfrom()
or recvmsg() is *not* counted (measured here: 1 MB received with recv() moved rchar by
106 bytes, with read() by 1,000,109), and that is how Python's sockets, urllib,
requests and the cloud SDKs read: the bytes of an object store come from the hook's
shard reads (adapters, ``stallscope.DatasetRoot``), not from here. Reading the file
needs ptrace-read access to the task, as ``syscall`` does (the agent's DaemonSet runs
with it).

Whose reads count: the loader's producers. With workers, the workers' (every
generation, summed by base.WorkerCounters: a worker that ends loses nothing already
counted, and one that started since the previous collection is counted from its first
byte); the training process then reads only the handoff from its workers (the pickled
batch through a pipe), which is not input. Without workers, the training process's own,
which includes whatever else it reads (a checkpoint load is a burst here).

Per rank: the correlator samples ``loader_read_bytes_rate`` and
``loader_block_read_bytes_rate``, and ``/api/v1/ranks``' ``loader_io``: bytes a second
bytes per batch and per sample, batches and samples a second (the loader's batch_size)
over the last collection interval, and the totals; and
``loader_life_read_bytes_per_batch``: the bytes read per batch delivered since the agent
first read the rank's producers. A window of the loader's life can hold none of the reads
of a tier it used earlier: a local cache whose hits all came first, the misses fetched
from the network after (budget.py, the cache_miss draws whose published analysis named
storage_latency, issue 49). Per pod (summed
over its ranks, off the per-rank series budget, which the worst-case rank filled):
``stallscope_loader_read_bytes_total{io="all"|"block"}``. Bytes a worker read after the
last reading before it ended are not counted (one collection interval per worker
generation, at most), nor what the rank's first workers read before the agent first
looked. Only the rank's accepted PIDs are read.
"""
from __future__ import annotations

import os
from typing import Any

from ..host.families import family
from ..report import UNREPORTED
from ..system.procfs import KeptFiles
from ..vocabulary import signal
from . import base

READ_RATE = signal("loader_read_bytes_rate").name
BLOCK_READ_RATE = signal("loader_block_read_bytes_rate").name
LIFE_READ_PER_BATCH = signal("loader_life_read_bytes_per_batch").name


def parse_io(text: str | None) -> tuple[int, int] | None:
    """(rchar, read_bytes) from a ``/proc/<pid>/io`` text, or None when either is missing."""
    fields = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "read_bytes"):
            try:
                fields[key] = int(value)
            except ValueError:
                return None
    if len(fields) != 2 or min(fields.values()) < 0:
        return None
    return fields["rchar"], fields["read_bytes"]


class LoaderIoExporter(base.Exporter):
    name = "loaderio"

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        # bytes counted per rank (all reads, block reads), every worker generation
        self.read = base.WorkerCounters(host, width=2)
        self.batches = base.Rates(host)
        self.files = KeptFiles(host.procfs, "io")
        self.pods = base.PodTotals(width=2)  # what a rank read stays counted when it ends
        # the rank's batch count at the agent's first reading of its producers: the batches
        # its counted reads fed (loader_life_read_bytes_per_batch)
        self.first_batches: dict[Any, int] = {}
        self.last: dict[Any, dict[str, float | None]] = {}

    def unavailable(self) -> str | None:
        if os.path.exists(self.proc("self", "io")):
            return None
        return "no /proc/<pid>/io (a kernel without CONFIG_TASK_IO_ACCOUNTING)"

    def collect(self) -> Any:
        fam = family("stallscope_loader_read_bytes_total")
        live, looked = set(), []
        for rank in self.host.ranks():
            producers = list(rank.worker_pids) or ([rank.pid] if rank.pid else [])
            if not producers:
                continue
            live.add(rank.key)
            looked += producers
            readings = [(pid, None, got) for pid in producers
                        if (got := parse_io(self.files.read(pid))) is not None]
            total, moved, dt = self.read.update(rank.key, readings)
            self.pods.add(rank, moved)
            batches = self.batches.delta(rank.key, (float(rank.wait.count),))
            fed = rank.wait.count - self.first_batches.setdefault(rank.key, rank.wait.count)
            if fed > 0:
                self.record(rank.key, LIFE_READ_PER_BATCH, total[0] / fed)
            if dt:
                self.record(rank.key, READ_RATE, moved[0] / dt)
                self.record(rank.key, BLOCK_READ_RATE, moved[1] / dt)
                n = batches[1][0] if batches is not None else 0
                size = (rank.loader or UNREPORTED).batch_size
                size = size if type(size) is int and size > 0 else None
                self.last[rank.key] = {
                    "read_bytes_per_second": moved[0] / dt,
                    "block_read_bytes_per_second": moved[1] / dt,
                    "read_bytes_per_batch": moved[0] / n if n > 0 else None,
                    "read_bytes_per_sample": moved[0] / (n * size) if n > 0 and size else None,
                    "batches_per_second": n / dt,
                    "samples_per_second": n * size / dt if size else None,
                    "interval_seconds": dt,
                }
        for pod_values, (read, block) in self.pods.rows():
            fam.add_values(pod_values + ("all",), read)
            fam.add_values(pod_values + ("block",), block)
        self.read.prune(live)
        for key in [k for k in self.last if k not in live]:
            del self.last[key]
        for key in [k for k in self.first_batches if k not in live]:
            del self.first_batches[key]
        self.batches.prune()
        self.files.keep(looked)
        return [fam.family]

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        got, total = self.last.get(rank.key), self.read.total(rank.key)
        if got is None or total is None:
            return {}
        return {"loader_io": dict(got, read_bytes_total=total[0], block_read_bytes_total=total[1])}
