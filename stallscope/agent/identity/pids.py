"""PIDs across PID namespaces (``--path.procfs``; /host/proc in a pod).

A trainer in a pod reports its loader workers' PIDs as its own PID namespace numbers
them. The agent (hostPID) knows the trainer's host PID from SO_PEERCRED and maps the
workers through the NSpid line of /proc/<pid>/status, whose last field is the PID in
the innermost namespace (proc(5)).
"""
from __future__ import annotations

from collections.abc import Sequence

from ...system import procfs


def translate(root: str, host_pid: int | None, reported_pid: int | None,
              worker_pids: Sequence[int]) -> list[int]:
    """Worker PIDs as the trainer reported them -> PIDs in the agent's namespace."""
    if not worker_pids:
        return []
    if host_pid is None or host_pid == reported_pid:
        return list(worker_pids)
    wanted = set(worker_pids)
    found = {}
    for child in procfs.children(root, host_pid):
        inner = procfs.ns_pid(root, child)
        if inner in wanted:
            found[inner] = child
    # Workers not found among the children (forkserver/spawn start methods) keep their
    # reported PID until their own reports (role=worker) give their real one.
    return [found.get(p, p) for p in worker_pids]
