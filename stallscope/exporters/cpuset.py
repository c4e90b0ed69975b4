"""cpuset: whether a pod's loader has CPUs of its own (issue 32, item 1).

Pinned decode cores are the practice's answer to a loader that shares its CPUs:
Guaranteed QoS with integer CPUs under the kubelet's static CPU manager policy gives a
container an exclusive cpuset (kubernetes.io, "Control CPU Management Policies on the
Node"); every other container runs on the shared pool, and so do the node's FUSE/CSI
daemons unless reserved CPUs keep them off. Per pod, each collection:

- its QoS class, from the kernel's cgroup path of the rank's main process
  (system/cgroups.py: ``kubepods-burstable``/``besteffort``, guaranteed pods have no
  level; none off Kubernetes);
- the CPUs its container's cpuset allows (v2 ``cpuset.cpus.effective``, v1
  ``cpuset.effective_cpus``; Documentation/admin-guide/cgroup-v2.rst "Cpuset"), and
  whether they are *exclusive*: fewer than the node's (the root cgroup's) and shared
  with no other container cgroup on the node (the tree is walked once a scan interval);
- how many of them the node's FUSE daemons may run on: the processes holding
  ``/dev/fuse`` open (their ``fd`` links, read once a scan interval; their
  ``Cpus_allowed_list``). A FUSE daemon serving the loader's reads on the loader's own
  cores takes its decode time. The walk reads every process's fd links: ~5 ms of CPU
  for 77 processes here, so ~0.2 % of a core for 2,000 at the default 60 s interval.

Only counts and the class are exported, per pod (off the per-rank series budget): never
another pod's path, and never which process a daemon is. The values are published as a
``RankCpuset`` fact for the parts that advise on pinning.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..host.facts import RankCpuset
from ..host.families import family
from ..host.options import flag
from ..system import cgroups
from ..system.cpus import allowed_cpus, parse_cpulist
from ..system.procfs import read_text
from ..vocabulary import signal
from . import base

EXCLUSIVE = signal("cpuset_exclusive").name
FUSE_DAEMON_CPUS = signal("cpuset_fuse_daemon_cpus").name
MAX_CGROUPS = 8192     # cgroup directories walked in one scan, at most
MAX_FDS = 4096         # fds of one process looked at, at most


@dataclasses.dataclass(frozen=True)
class CpusetOptions:
    scan_interval: float = flag(60.0, "--exporter.cpuset.scan-interval",
                                "Seconds between walks of the node's cgroup tree (other containers' "
                                "cpusets) and of the processes holding /dev/fuse open.",
                                metavar="SECONDS")


class CpusetExporter(base.Exporter):
    name = "cpuset"
    Options = CpusetOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.scanned_at: float | None = None
        self.containers: dict[str, frozenset[int]] = {}  # container cgroup path -> its CPUs
        self.daemon_cpus: frozenset[int] = frozenset()   # CPUs the FUSE daemons may run on

    def _where(self, layout: cgroups.Layout) -> tuple[str, str] | None:
        """(the hierarchy's directory, the cpuset file name) on this node."""
        if "cpuset" in layout.v1:
            return layout.v1["cpuset"], "cpuset.effective_cpus"
        controllers = read_text(os.path.join(layout.v2 or "/nonexistent", "cgroup.controllers"))
        if layout.v2 and controllers is not None and "cpuset" in controllers.split():
            return layout.v2, "cpuset.cpus.effective"
        return None

    def unavailable(self) -> str | None:
        if self._where(self.cgroup_layout()) is None:
            return "no cpuset cgroup controller under %s" % self.host.cgroupfs
        return None

    def _scan_containers(self, root: str, name: str) -> dict[str, frozenset[int]]:
        """{cgroup path: CPUs} of every container cgroup (one naming a container,
        system/cgroups.py) on the node."""
        out: dict[str, frozenset[int]] = {}
        seen = 0
        for d, subdirs, _files in os.walk(root):
            seen += 1
            if seen > MAX_CGROUPS:
                self.note("more than %d cgroups under %s: the exclusivity scan stops there"
                          % (MAX_CGROUPS, root))
                break
            rel = os.path.relpath(d, root)
            path = "/" if rel == "." else "/" + rel.replace(os.sep, "/")
            if cgroups.k8s_info(path)["container_id"]:
                cpus = parse_cpulist(read_text(os.path.join(d, name)))
                if cpus:
                    out[path] = cpus
                subdirs[:] = []  # a container's own children are its own
        return out

    def _scan_daemons(self) -> frozenset[int]:
        """The CPUs any process holding /dev/fuse open may run on (a FUSE daemon's
        connection is its open /dev/fuse: Documentation/filesystems/fuse.rst)."""
        cpus: set[int] = set()
        # The ranks' own trainers and workers are what the daemons are compared with, not
        # daemons (a loader serving FUSE itself decodes on its own cores): at 8 ranks x 8
        # workers they were 72 of the walk's ~100 processes and most of its fd links.
        loaders = {str(pid) for r in self.host.ranks() for pid in (r.pid, *r.worker_pids)}
        try:
            pids = [p for p in os.listdir(self.host.procfs) if p.isdigit() and p not in loaders]
        except OSError:
            return frozenset()
        for pid in pids:
            fd_dir = self.proc(pid, "fd")
            try:
                fds = os.listdir(fd_dir)[:MAX_FDS]
            except OSError:
                continue  # gone, or not ours to read
            for fd in fds:
                try:
                    target = os.readlink(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                if target == "/dev/fuse":
                    cpus |= allowed_cpus(self.host.procfs, pid)
                    break
        return frozenset(cpus)

    def _rescan(self, root: str, name: str) -> None:
        now = self.host.clock()
        if self.scanned_at is not None and now - self.scanned_at < self.options.scan_interval:
            return
        self.scanned_at = now
        self.containers = self._scan_containers(root, name)
        self.daemon_cpus = self._scan_daemons()

    def _container_path(self, layout: cgroups.Layout, cg: Any) -> str | None:
        if "cpuset" in layout.v1:
            return layout.resolve_v1("cpuset", cg.v1.get("cpuset"))
        return layout.resolve_v2(cg.v2)

    def collect(self) -> Any:
        cpus_fam = family("stallscope_pod_cpuset_cpus")
        exclusive_fam = family("stallscope_pod_cpuset_exclusive")
        fuse_fam = family("stallscope_pod_cpuset_fuse_daemon_cpus")
        layout = self.cgroup_layout()
        where = self._where(layout)
        if where is None:
            return [f.family for f in (cpus_fam, exclusive_fam, fuse_fam)]
        root, name = where
        node = parse_cpulist(read_text(os.path.join(root, name))) or parse_cpulist(
            read_text(os.path.join(self.host.sysfs, "devices", "system", "cpu", "online")))
        self._rescan(root, name)
        done: dict[Any, RankCpuset] = {}
        for rank in self.host.ranks():
            pod = (rank.ident.get("namespace"), rank.ident.get("pod"))
            if rank.cgroup is None:
                continue
            path = self._container_path(layout, rank.cgroup)
            if path is None:
                continue
            if pod not in done:
                mine = parse_cpulist(read_text(os.path.join(root, path.lstrip("/"), name)))
                if not mine:
                    continue
                shared = any(cpus & mine for other, cpus in self.containers.items() if other != path)
                fact = RankCpuset(rank.cgroup.qos, len(mine), bool(node) and mine < node and not shared,
                                  len(mine & self.daemon_cpus))
                done[pod] = fact
                labels = dict(rank.labels, qos_class=fact.qos or "")
                cpus_fam.add(labels, fact.cpus)
                exclusive_fam.add(rank.labels, 1 if fact.exclusive else 0)
                fuse_fam.add(rank.labels, fact.fuse_daemon_cpus)
            self.host.facts.publish(self.name, rank.key, done[pod])
            self.record(rank.key, EXCLUSIVE, 1.0 if done[pod].exclusive else 0.0)
            self.record(rank.key, FUSE_DAEMON_CPUS, float(done[pod].fuse_daemon_cpus))
        return [f.family for f in (cpus_fam, exclusive_fam, fuse_fam)]
