"""numa: where each rank's loader runs against its GPU's NUMA node (issue 32, item 1).

A loader on socket 0 feeding a GPU on socket 1 crosses the inter-socket link for every
batch. Per rank, each collection:

- its GPU: the gpu exporter's ``RankGpu`` fact on the host (its UUID), found in the
  NVIDIA driver's ``/proc/driver/nvidia/gpus/<bus id>/information`` ("GPU UUID:"), whose
  directory name is the PCI bus id; the GPU's node is ``/sys/bus/pci/devices/<bus
  id>/numa_node`` (-1: the platform does not say) and the node's CPUs
  ``/sys/devices/system/node/node<N>/cpulist`` (Documentation/ABI/stable/sysfs-devices-node);
- its loader's threads (the main process's and every accepted worker's,
  ``/proc/<pid>/task/<tid>/stat``): the CPU each last ran on (field 39, ``processor``)
  and the CPU time it used since the previous collection (utime + stime, fields 14-15).
  A thread's time since then is counted on the CPU it ran on last: at 1 Hz an
  approximation for a thread that migrates, exact for one pinned or confined by its
  cpuset. A collection in which no thread ran judges by the CPUs the threads are
  allowed (``Cpus_allowed_list`` in status): a loader confined to the far node is remote
  however idle it is.

``numa_remote_cpu_ratio`` (the share on CPUs outside the GPU's node) is recorded and
exported per pod (its most remote rank: off the per-rank series budget); the
correlator's standing cause ``numa_remote`` reads it
(correlate/standing_causes.py). Without a GPU fact, a bus id or NUMA information (a
single-node machine: one node directory, or numa_node -1), nothing is recorded: the
placement is not measured. Only the rank's own accepted PIDs are read.
"""
from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any

from ..host.facts import RankGpu
from ..host.families import family
from ..host.options import flag
from ..system.cpus import allowed_cpus, parse_cpulist
from ..system.procfs import pid_path, read_text, stat_fields
from ..vocabulary import signal
from . import base

REMOTE = signal("numa_remote_cpu_ratio").name
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_THREADS = 256  # a process's threads read per collection, at most


@dataclasses.dataclass(frozen=True)
class NumaOptions:
    nvidia_gpus: str = flag("", "--exporter.numa.nvidia-gpus",
                            "The NVIDIA driver's per-GPU directories (default: "
                            "<procfs>/driver/nvidia/gpus), whose information files map a GPU's "
                            "UUID to its PCI bus id.", metavar="PATH")


class NumaExporter(base.Exporter):
    name = "numa"
    Options = NumaOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.rates = base.Rates(host)
        self.bus_of: dict[str, str] = {}     # GPU UUID -> PCI bus id (the driver's information files)

    def unavailable(self) -> str | None:
        if len(self.nodes()) >= 2:
            return None
        return "one NUMA node (or none) in %s/devices/system/node: nothing to place" % self.host.sysfs

    def nodes(self) -> dict[int, frozenset[int]]:
        """{node: its CPUs}."""
        out = {}
        for path in glob.glob(os.path.join(self.host.sysfs, "devices", "system", "node", "node[0-9]*")):
            try:
                n = int(os.path.basename(path)[4:])
            except ValueError:
                continue
            out[n] = parse_cpulist(read_text(os.path.join(path, "cpulist")))
        return out

    def bus_id(self, uuid: str) -> str | None:
        if uuid not in self.bus_of:
            gpus = self.options.nvidia_gpus or os.path.join(self.host.procfs, "driver", "nvidia", "gpus")
            pattern = os.path.join(gpus, "*", "information")
            for path in glob.glob(pattern):
                for line in (read_text(path) or "").splitlines():
                    key, _, value = line.partition(":")
                    if key.strip() == "GPU UUID":
                        self.bus_of[value.strip()] = os.path.basename(os.path.dirname(path))
        return self.bus_of.get(uuid)

    def gpu_node(self, bus: str) -> int | None:
        text = read_text(os.path.join(self.host.sysfs, "bus", "pci", "devices", bus.lower(), "numa_node"))
        try:
            n = int((text or "").strip())
        except ValueError:
            return None
        return n if n >= 0 else None

    def _threads(self, pid: int) -> list[tuple[str, list[str] | None]]:
        """(tid, its stat fields) of the process's threads; the process's own stat for its
        main thread where the task directory does not say (a procfs without task/)."""
        try:
            tids = sorted(os.listdir(pid_path(self.host.procfs, pid, "task")))[:MAX_THREADS]
        except OSError:
            tids = [str(pid)]
        out = []
        for tid in tids:
            fields = stat_fields(self.host.procfs, pid, "task", tid)
            if fields is None and tid == str(pid):
                fields = stat_fields(self.host.procfs, pid)
            out.append((tid, fields))
        return out

    def remote_share(self, rank: Any, local: frozenset[int]) -> float | None:
        """The share of the loader's CPU time since the previous collection on CPUs
        outside ``local``; by the allowed CPUs when no thread ran; None unreadable."""
        used = remote = 0.0
        allowed: list[frozenset[int]] = []
        pids = [p for p in [rank.pid, *rank.worker_pids] if p]
        for pid in pids:
            for tid, fields in self._threads(pid):
                if fields is None or len(fields) < 37:
                    continue
                try:
                    ticks, cpu = int(fields[11]) + int(fields[12]), int(fields[36])
                except ValueError:
                    continue
                d = self.rates.delta((rank.key, pid, tid), (ticks / TICKS,))
                if d is not None and d[1][0] > 0:
                    used += d[1][0]
                    remote += d[1][0] if cpu not in local else 0.0
            allowed.append(allowed_cpus(self.host.procfs, pid))
        if used > 0:
            return remote / used
        cpus = [a for a in allowed if a]
        if not cpus:
            return None
        return sum(len(a - local) / len(a) for a in cpus) / len(cpus)

    def collect(self) -> Any:
        fam = family("stallscope_loader_numa_remote_cpu_ratio")
        nodes = self.nodes()
        by_pod: dict[Any, tuple[float, Any]] = {}  # the pod's most remote rank: one series a pod
        for rank in self.host.ranks():
            gpu = self.host.facts.value(RankGpu, rank.key)
            bus = self.bus_id(gpu.uuid) if gpu is not None else None
            node = self.gpu_node(bus) if bus is not None else None
            if node is None or node not in nodes or len(nodes) < 2:
                continue
            share = self.remote_share(rank, nodes[node])
            if share is None:
                continue
            self.record(rank.key, REMOTE, share)
            pod = (rank.ident.get("namespace"), rank.ident.get("pod"))
            if pod not in by_pod or share > by_pod[pod][0]:
                by_pod[pod] = (share, rank.labels)
        for share, labels in by_pod.values():
            fam.add(labels, share)
        self.rates.prune()
        return [fam.family]
