"""pagefaults: the major page faults of each rank's loader, a counter of the kernel's
(``majflt``, field 12 of /proc/<pid>/stat, proc(5)): a page a worker touched that was not
in memory and was read from storage while it waited.

A dataset read through a memory map (numpy.memmap, Arrow and Hugging Face datasets,
LMDB, a safetensors file) reads storage in its page faults, which no read() shows: the
kernel's rchar (loaderio) does not count them, and no shard-read adapter sees them. A
loader whose mapped data stopped fitting the page cache faults all along; one that
stalls while its faults rise waits on that storage, which the ``storage_latency`` alert
``StallscopeLoaderPageFaults`` says.

Per rank, the correlator samples ``loader_major_faults_rate`` (faults a second of the
loader's producers: the workers, every generation, or the training process without
workers); per pod, ``stallscope_loader_major_faults_total``. Only the rank's accepted
PIDs are read.
"""
from __future__ import annotations

from typing import Any

from ..host.families import family
from ..system.procfs import KeptFiles, split_stat
from ..vocabulary import signal
from . import base

RATE = signal("loader_major_faults_rate").name


def major_faults(text: str | None) -> tuple[int, float] | None:
    """(start time, major faults) from a /proc/<pid>/stat text, or None."""
    f = split_stat(text)
    try:
        return (int(f[19]), float(f[9])) if f and len(f) > 19 else None
    except ValueError:
        return None


class PageFaultsExporter(base.Exporter):
    name = "pagefaults"

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.faults = base.WorkerCounters(host)  # faults before the rank's first reading: not counted
        self.pods = base.PodTotals()
        self.files = KeptFiles(host.procfs, "stat")

    def collect(self) -> Any:
        fam = family("stallscope_loader_major_faults_total")
        live, looked = [], []
        for rank in self.host.ranks():
            producers = list(rank.worker_pids) or ([rank.pid] if rank.pid else [])
            if not producers:
                continue
            live.append(rank.key)
            looked += producers
            readings = [(pid, got[0], (got[1],)) for pid in producers
                        if (got := major_faults(self.files.read(pid))) is not None]
            counted = self.faults.update(rank.key, readings)
            self.pods.add(rank, counted.moved)
            if counted.seconds and readings:  # none read: not measured, not 0
                self.record(rank.key, RATE, counted.moved[0] / counted.seconds)
        for pod_values, (faults,) in self.pods.rows():
            fam.add_values(pod_values, faults)
        self.faults.prune(live)
        self.files.keep(looked)
        return [fam.family]
