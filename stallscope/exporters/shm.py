"""shm: size and use of /dev/shm as each rank sees it, and of the node's.

DataLoader workers hand batches to the trainer through shared memory; a full /dev/shm
kills workers ("Bus error", "unable to allocate shared memory(shm) ... No space left on
device"). Measured with statvfs, not by listing files: PyTorch unlinks its shm files
at once, so the space is used but invisible to ``du``. A rank's view is its mount
namespace's: ``/proc/<pid>/root/dev/shm`` (containerd's default pod /dev/shm is 64 MiB).
"""
from __future__ import annotations

import os
from typing import Any

from ..host.facts import RankShm
from ..host.families import family
from ..system.procfs import PTRACE_NOTE
from ..vocabulary import signal
from . import base

USED_RATIO = signal("shm_used_ratio").name
FREE_BYTES = signal("shm_free_bytes").name


def usage(path):
    """(size_bytes, used_bytes, free_bytes, st_dev) of the filesystem at ``path``; or the
    OSError that prevented reading it."""
    try:
        st = os.statvfs(path)
        dev = os.stat(path).st_dev
    except OSError as e:
        return e
    size = st.f_blocks * st.f_frsize
    return size, (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize, dev


class ShmExporter(base.Exporter):
    name = "shm"

    def collect(self) -> Any:
        size = family("stallscope_shm_size_bytes")
        used = family("stallscope_shm_used_bytes")
        node = usage(os.path.join(self.host.rootfs, "dev", "shm"))
        if isinstance(node, OSError):
            self.note("no /dev/shm under --path.rootfs %s" % self.host.rootfs)
        else:
            size.add(self.node_labels, node[0])
            used.add(self.node_labels, node[1])
            self._record("node", node)
        seen = set()
        for rank in self.host.ranks():
            if not rank.pid:
                continue
            u = usage(self.proc(rank.pid, "root", "dev", "shm"))
            if isinstance(u, PermissionError):
                self.note(PTRACE_NOTE % u.strerror + ": the pods' /dev/shm is not available")
            if isinstance(u, OSError):
                continue  # gone, or a namespace without /dev/shm
            self._record(rank.key, u)
            self.host.facts.publish(self.name, rank.key, RankShm(u[0]))
            pod = (rank.labels["namespace"], rank.labels["pod"], rank.labels["job"])
            if pod in seen:
                continue  # ranks of one pod share its /dev/shm
            seen.add(pod)
            size.add(rank.labels, u[0])
            used.add(rank.labels, u[1])
        return [size.family, used.family]

    def _record(self, scope, u):
        size, used_, free, _dev = u
        self.record(scope, USED_RATIO, used_ / size if size else 0.0)
        self.record(scope, FREE_BYTES, free)
