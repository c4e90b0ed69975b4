"""The exporters the agent knows, one line each (like node_exporter's collectors).

Adding a signal: write ``stallscope/exporters/<name>.py`` with an ``Exporter``
subclass and add its line here; the ``--exporter.<name>/--no-exporter.<name>`` flags,
scheduling, deadline and self-health metrics come with it. Modules are imported only
when their exporter is enabled.
"""
import collections

Entry = collections.namedtuple("Entry", "name target default help")

EXPORTERS = (
    Entry("cfs", "cfs:CfsExporter", True, "CFS quota and throttling of the ranks' cgroups."),
    Entry("psi", "psi:PsiExporter", True, "Pressure stall information of the node and the ranks' cgroups."),
    Entry("shm", "shm:ShmExporter", True, "/dev/shm size and use, as the ranks and the node see it."),
    Entry("fuse", "fuse:FuseExporter", True, "Health of the FUSE mounts the ranks read from (stuck, ENOTCONN)."),
    Entry("workers", "workers:WorkersExporter", True, "Loader workers: alive, D state, CPU, RSS, exits."),
    Entry("gpu", "gpu:GpuExporter", True, "GPU busy samples (NVML), SM-active (dcgm-exporter), GPU-to-rank map; see --gpu.*."),
    Entry("disk", "disk:DiskExporter", True, "Node block-device write rate (checkpoint bursts), a correlator sample only."),
    Entry("sched", "sched:SchedExporter", True, "Run-queue wait of the loader workers (CPU starvation), a correlator sample only."),
)


def load(entry):
    """The exporter class of ``entry`` (imported on first use)."""
    import importlib

    module, _, cls = entry.target.partition(":")
    return getattr(importlib.import_module("stallscope.exporters." + module), cls)
