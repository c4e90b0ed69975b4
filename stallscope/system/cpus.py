"""CPU lists as the kernel writes them (``0-3,8,10-11``: sysfs node and device
cpulists, cpuset.cpus, ``Cpus_allowed_list`` in /proc/<pid>/status), and the CPUs a
task may run on. Shared by the numa and cpuset exporters."""
from __future__ import annotations

from typing import Any

from .procfs import pid_path, read_text


def parse_cpulist(text: str | None) -> frozenset[int]:
    """"0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11} (kernel cpulist format); empty on junk."""
    out: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            return frozenset()
        if b < a or b - a > 65536:
            return frozenset()
        out.update(range(a, b + 1))
    return frozenset(out)


def allowed_cpus(procfs: str, pid: Any, tid: Any = None) -> frozenset[int]:
    """The CPUs process ``pid`` (or its thread ``tid``) may run on (``Cpus_allowed_list``);
    empty when it cannot be read."""
    parts = ("task", str(tid), "status") if tid is not None else ("status",)
    for line in (read_text(pid_path(procfs, pid, *parts)) or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    return frozenset()
