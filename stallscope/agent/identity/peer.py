"""Who is on the other end of a hook connection, from the kernel, never from the message.

``SO_PEERCRED`` gives the peer's PID and UID in the agent's namespaces; the PID's
cgroup gives its pod (the pod UID in a Kubernetes cgroup path) and container. A
connection's **domain** is what its reports may speak for: its pod under Kubernetes,
else its cgroup and UID (bare metal, Slurm, the lab). The rank table binds every rank,
and every pod name the ranks claim, to the domain that first reported them while they
live, and only that domain may report for them again (threat model: docs/deploy.md).
"""
from __future__ import annotations

import dataclasses

from ...system import cgroups, procfs

Domain = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Source:
    pid: int                 # in the agent's PID namespace
    uid: int
    start: int | None     # /proc/<pid>/stat starttime: tells a reused PID apart
    pod_uid: str | None
    container_id: str | None
    cgroup: str              # the v2 path, else the v1 cpu (or first) path
    # (pid, starttime) of its parent, grandparent ... when it connected: a worker that
    # reports at exit is judged by the ancestry it had while alive.
    ancestors: tuple[tuple[int, int | None], ...] = ()
    # (controller, path) of each v1 hierarchy: a name's binding is released when one of
    # its claimant's cgroups is gone (names.py), and the allow-list matches these too
    v1: tuple[tuple[str, str], ...] = ()

    @property
    def domain(self) -> Domain:
        if self.pod_uid:
            return ("pod", self.pod_uid)
        return ("cgroup", self.cgroup, str(self.uid))

    def alive(self, root: str) -> bool:
        return procfs.alive(root, self.pid, self.start)


def of_peer(root: str, pid: int, uid: int) -> Source | None:
    """The Source of a connected peer, or None when its process is already gone."""
    start = procfs.start_time(root, pid)
    cg = cgroups.of_pid(root, pid)
    if start is None or cg is None:
        return None
    path = cg.v2 if cg.v2 is not None else (cg.v1.get("cpu") or next(iter(sorted(cg.v1.values())), "/"))
    return Source(pid, uid, start, cg.pod_uid, cg.container_id, path or "/", ancestry(root, pid),
                  tuple(sorted(cg.v1.items())))


def ancestry(root: str, pid: int, max_depth: int = 64) -> tuple[tuple[int, int | None], ...]:
    out = []
    for _ in range(max_depth):
        st = procfs.stat(root, pid)
        if st is None or st.ppid <= 0:
            break
        pid = st.ppid
        out.append((pid, procfs.start_time(root, pid)))
    return tuple(out)


def descends_from(source: Source, pid: int, start: int | None) -> bool:
    """Whether the process ``pid`` (started at ``start``) was an ancestor of ``source``
    when it connected."""
    return (pid, start) in source.ancestors


def descends(root: str, pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (the ppid chain)."""
    return procfs.is_descendant(root, pid, ancestor)
