"""The capacities a loader's fix runs into (issue 49, item 2): one model for every
prediction that changes how much the loader asks of the node.

Each tier and resource the workers use has a capacity: the cores they may run on (a CFS
quota, else the CPUs of their cpuset less a core for the training process), the node's
busiest link, the bytes a second the rank's cgroup may read from its device (cgroup
``blkio.throttle.read_bps_device`` / ``io.max``), the dataset's shards (an iterable
dataset of N shards feeds at most N workers: Hugging Face ``datasets`` stops the rest)
and the memory limit. On a crowded node the cores are what the node gave the workers (what
they used plus their wait for a CPU at the rate they ran), not the cpuset's count: more
workers would share the same busy CPUs. A capacity bounds a prediction two ways: a *floor* on the time
between batches, however many workers share it (CPU-seconds or bytes a batch over the
capacity), and a *count* of workers past which none does more work. A predicted fix is
the queue replayed under every floor and count it touches (predict.py), and says which
binds.

A capacity that is not measured is still named: a prediction that asks more of it than
the loader gets now (more CPU, more bytes a second) is at most of ``medium`` confidence
and says what it assumes, since nothing says the node has it to give (issue 49: "more
than doubling num_workers more than doubles the speed", confidence high, under a
bytes-a-second cap that more workers share).
"""
from __future__ import annotations

import dataclasses

from .queue import MAIN_CORE, Measured

# more CPU or bytes than the loader gets now, by this share, asks a capacity for more
CROSS = 0.2
# block reads below this many bytes a second put no device near any capacity
DEVICE_BYTES_MIN = 1e6


@dataclasses.dataclass(frozen=True)
class Capacity:
    """One capacity of the loader's path. ``floor``: the shortest time between batches it
    allows (0: none); ``workers``: the most workers that get work from it (None: no
    count); ``measured``: its limit was read (not assumed)."""
    name: str           # cpu_quota, cores, link, device, shards, memory
    limit: float | None
    unit: str           # cores, bytes/s, shards, workers
    floor: float = 0.0
    workers: int | None = None
    measured: bool = True

    @property
    def short(self) -> str:
        return SHORT.get(self.name, self.name)

    @property
    def words(self) -> str:
        if self.limit is None:
            return "the %s (not measured)" % NAMES.get(self.name, self.name)
        value = ("%.3g MB/s" % (self.limit / 1e6) if self.unit == "bytes/s"
                 else "%.3g %s" % (self.limit, self.unit))
        return "the %s (%s)" % (NAMES.get(self.name, self.name), value)


SHORT = {"cpu_quota": "CPU quota", "cores": "cores", "link": "link", "device": "read limit",
         "shards": "shards", "memory": "memory"}
NAMES = {"cpu_quota": "CPU quota for the workers", "cores": "cores the workers may run on",
         "link": "node's link", "device": "cgroup's read limit on its device",
         "shards": "dataset's shards", "memory": "pod's memory limit"}


def of(m: Measured) -> tuple[Capacity, ...]:
    """Every capacity of the rank's loader path that bears on a worker-count change,
    measured or named as not measured."""
    out: list[Capacity] = []
    cpu = m.cpu_per_batch
    if m.loader_cores:
        out.append(Capacity("cpu_quota", m.loader_cores, "cores", cpu / m.loader_cores if cpu else 0.0))
    elif m.node_cores is not None:
        # a crowded node: the workers get what they got plus their held-back time at the
        # rate they ran while runnable (queue.Measured.node_cores); more of them share it
        cores = max(m.node_cores, 0.1)
        out.append(Capacity("cores", cores, "cores", cpu / cores if cpu else 0.0))
    elif m.cpus:
        # the workers have the cpuset's CPUs less the training process's core, and at least
        # what they use now (the training process may need less than a core)
        cores = max(float(m.cpus) - MAIN_CORE, m.workers_cpu_cores or 0.0, 0.5)
        out.append(Capacity("cores", cores, "cores", cpu / cores if cpu else 0.0))
    else:
        out.append(Capacity("cores", None, "cores", measured=False))
    link = m.link
    if link is not None and link.capacity:
        out.append(Capacity("link", link.capacity, "bytes/s",
                            link.floor() if link.saturated else 0.0))
    if m.io_read_limit:
        per_batch = m.block_read_bytes_per_batch
        out.append(Capacity("device", m.io_read_limit, "bytes/s",
                            per_batch / m.io_read_limit if per_batch else 0.0))
    elif m.block_read_bytes_per_second and m.block_read_bytes_per_second >= DEVICE_BYTES_MIN:
        out.append(Capacity("device", None, "bytes/s", measured=False))
    if m.dataset_shards:
        out.append(Capacity("shards", m.dataset_shards, "shards", workers=m.dataset_shards))
    fit = m.memory_workers
    if fit is not None:
        out.append(Capacity("memory", fit, "workers", workers=fit))
    return tuple(out)


def floor(caps: tuple[Capacity, ...]) -> tuple[float, Capacity | None]:
    """(the highest floor among the measured capacities, the capacity that sets it)."""
    best = max((c for c in caps if c.measured and c.floor > 0), key=lambda c: c.floor, default=None)
    return (best.floor, best) if best is not None else (0.0, None)


def most_workers(caps: tuple[Capacity, ...]) -> tuple[int | None, Capacity | None]:
    """(the fewest workers any capacity lets work, the capacity), or (None, None)."""
    best = min((c for c in caps if c.workers is not None), key=lambda c: c.workers or 0, default=None)
    return (best.workers, best) if best is not None else (None, None)


def assumed(m: Measured, caps: tuple[Capacity, ...], workers: int, speedup: float | None) -> list[str]:
    """The capacities not measured that ``workers`` workers running ``speedup`` times as
    fast would ask for more than the loader gets now: what the prediction assumes."""
    out = []
    now = max(1, m.workers or 0)
    for c in caps:
        if c.measured:
            continue
        if c.name == "cores" and m.workers_cpu_cores is not None:
            more = m.workers_cpu_cores * (workers / now - 1)
            if more > max(CROSS * m.workers_cpu_cores, 0.25):
                out.append("%.2g more cores free on the node (%s)" % (more, c.words))
        elif c.name == "device" and speedup is not None and speedup > 1 + CROSS:
            rate = m.block_read_bytes_per_second or 0.0
            out.append("the device to deliver %.3g MB/s, %.3g now (%s)" % (
                rate * speedup / 1e6, rate / 1e6, c.words))
    return out
