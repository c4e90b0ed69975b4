"""Label sets. Identity comes first, always in one order (job, rank, pod, namespace,
node); a family's other labels follow. A reading that is not a rank's (a node-wide
PSI or /dev/shm reading) leaves the identity labels it lacks empty, by name: select it
with ``{pod=""}``.

Series carrying ``rank`` count against the per-rank budget (at most 40 series per
rank, all parts together); signals of a cgroup, a pod or its storage carry pod labels
and are exported once however many ranks share them.
"""
IDENTITY = ("job", "rank", "pod", "namespace", "node")
RANK = IDENTITY
POD = ("job", "pod", "namespace", "node")
CONTAINER = POD + ("container",)
TIER = POD + ("tier",)
MOUNT = POD + ("mountpoint", "fstype", "driver")
LOADER_CONFIG = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers",
                 "batch_size")
GPU = ("gpu", "uuid", "source")
PER_RANK_SERIES_BUDGET = 40


def values(names, labels, **extra):
    """Label values in the order of ``names`` from a mapping (``labels``, then ``extra``);
    a name neither gives is empty."""
    return tuple(str(extra[n]) if n in extra else str(labels.get(n, "")) for n in names)
