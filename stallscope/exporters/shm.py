"""shm: size and use of /dev/shm as each rank sees it, and of the node's.

DataLoader workers hand batches to the trainer through shared memory; a full /dev/shm
kills workers ("Bus error", "unable to allocate shared memory(shm) ... No space left on
device"). Measured with statvfs, not by listing files: PyTorch unlinks its shm files
at once, so the space is used but invisible to ``du``. A rank's view is its mount
namespace's: ``/proc/<pid>/root/dev/shm`` (containerd's default pod /dev/shm is 64 MiB).
"""
import os

from prometheus_client.core import GaugeMetricFamily

from . import base


PTRACE_NOTE = ("cannot follow /proc/<pid>/root into the ranks' mount namespaces (%s; the agent "
               "needs CAP_SYS_PTRACE: deploy/kubernetes/overlays/ptrace)")


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

    def collect(self, ranks):
        ctx = self.ctx
        size = GaugeMetricFamily("stallscope_shm_size_bytes",
                                 "Size of /dev/shm as the pod's processes see it (node-wide: pod empty).",
                                 labels=base.POD)
        used = GaugeMetricFamily("stallscope_shm_used_bytes",
                                 "Bytes used in /dev/shm (statvfs: includes unlinked PyTorch segments).",
                                 labels=base.POD)
        node = usage(os.path.join(ctx.rootfs, "dev", "shm"))
        if isinstance(node, OSError):
            self.note("no /dev/shm under --path.rootfs %s" % ctx.rootfs)
        else:
            size.add_metric(base.node_labels(ctx, len(base.POD)), node[0])
            used.add_metric(base.node_labels(ctx, len(base.POD)), node[1])
            self._record("node", node)
        seen = set()
        for rank in ranks:
            if not rank.pid:
                continue
            u = usage(base.proc_path(ctx, rank.pid, "root", "dev", "shm"))
            if isinstance(u, PermissionError):
                self.note(PTRACE_NOTE % u.strerror + ": the pods' /dev/shm is not available")
            if isinstance(u, OSError):
                continue  # gone, or a namespace without /dev/shm
            self._record(rank.key, u)
            labels = base.pod_labels(ctx, rank)
            if labels in seen:
                continue  # ranks of one pod share its /dev/shm
            seen.add(labels)
            size.add_metric(labels, u[0])
            used.add_metric(labels, u[1])
        return [size, used]

    def _record(self, scope, u):
        size, used_, free, _dev = u
        self.ctx.record(scope, "shm_used_ratio", used_ / size if size else 0.0)
        self.ctx.record(scope, "shm_free_bytes", free)
