"""The capacities a loader's fix runs into (issue 49, item 2): one model for every
prediction that changes how much the loader asks of the node.

Each tier and resource the workers use has a capacity: the cores they may run on (a CFS
quota, else the cores free to them on the node: ``free_cores``), the node's
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

The cores free to the workers, without a quota and off a crowded node, are measured, not
assumed: what the workers use now plus the node's idle CPUs (``node_cpu_idle_cores``,
the sched exporter's /proc/stat), within the cpuset's CPUs less the training thread's
use; in traces without the node's idle CPUs, the cpuset's CPUs less what the rank's
training thread and the node's other ranks' loaders were measured to use (the sampler's
``loader_main_on_cpu_ratio``, their ``workers_cpu_ratio``), never less than what the
workers use now. Only where the training thread's use was not measured is a whole core
kept for it (``MAIN_CORE``): on the 2-CPU lab node that left the workers 1 core, where
the training thread (its compute a sleep) was on a CPU 0.4-17 % of the time and 10 of 19
drawn too_few_workers runs were told to cut the per-sample work instead of adding the
workers the node had room for.

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
# the fewest cores a measured capacity gives the workers (as a crowded node's, queue.py)
MIN_CORES = 0.1
# the node's idle cores, on average while the workers queued for a CPU, past which those
# CPUs are not the workers' to run on (their affinity keeps them off): pinned workers on a
# busy CPU queued beside 0.72-0.95 idle cores in the recorded draws, workers too few on a
# node their bursts fill beside 0.19-0.26
IDLE_BESIDE_QUEUED = 0.5


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
    basis: str = ""     # what the limit was found from, in words (cores: what was measured)
    # a measured limit's part that was not measured (the node's other tasks' CPU): a
    # prediction that asks more of it than the loader gets now assumes it
    unmeasured: str = ""

    @property
    def short(self) -> str:
        return SHORT.get(self.name, self.name)

    @property
    def words(self) -> str:
        if self.limit is None:
            return "the %s (not measured)" % NAMES.get(self.name, self.name)
        value = ("%.3g MB/s" % (self.limit / 1e6) if self.unit == "bytes/s"
                 else "%.3g %s" % (self.limit, self.unit))
        if self.basis:
            value += ": " + self.basis
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
    elif m.node_cores is not None and (m.node_idle_cores is None or
                                       (m.idle_while_queued or 0.0) >= IDLE_BESIDE_QUEUED):
        # a crowded node: the workers get what they got plus their held-back time at the
        # rate they ran while runnable (queue.Measured.node_cores); more of them share it.
        # Where the node's idle CPUs were measured they say it directly, unless the workers
        # queued for a CPU while the node had idle ones: those are outside the workers'
        # affinity, since the scheduler pulls a runnable task onto an idle CPU it may run
        # on (Documentation/scheduler/sched-domains.rst). Drawn 426: 3 workers pinned to a
        # busy CPU queued 95 % of their time beside 0.90 idle cores and were told 17
        # workers would keep up, under cpu_contention's "more workers share the same CPUs"
        cores = max(m.node_cores, 0.1)
        out.append(Capacity("cores", cores, "cores", cpu / cores if cpu else 0.0))
    else:
        free = free_cores(m)
        if free is None:
            out.append(Capacity("cores", None, "cores", measured=False))
        else:
            cores, basis, unmeasured = free
            out.append(Capacity("cores", cores, "cores", cpu / cores if cpu else 0.0, basis=basis,
                                unmeasured=unmeasured))
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


def _cores(x: float) -> str:
    return "%.2g" % x


def free_cores(m: Measured) -> tuple[float, str, str] | None:
    """(the cores free to the workers on the node, what that was found from, what of it
    was not measured), or None where neither the node's idle CPUs nor the cpuset's CPUs
    were measured. Never less than what the workers use now: they got that."""
    used = m.workers_cpu_cores or 0.0
    main = m.main_cpu_cores
    if m.node_idle_cores is not None:
        # what the node left idle, beside what the workers ran on: the training process,
        # the node's other ranks and tasks are in what was not idle, whatever they are
        cores = used + m.node_idle_cores
        basis = "the workers' %s and the node's %s idle" % (_cores(used), _cores(m.node_idle_cores))
        if m.cpus and float(m.cpus) - (main or 0.0) < cores:
            cores = float(m.cpus) - (main or 0.0)
            basis = "%d CPUs of the cpuset less the training thread's %s" % (m.cpus, _cores(main or 0.0))
        return max(cores, used, MIN_CORES), basis, ""
    if not m.cpus:
        return None
    others_not = "the node's other tasks' CPU use"
    if main is None:
        # the training process's use not measured: a core kept for it (it may need less)
        return (max(float(m.cpus) - MAIN_CORE, used, 0.5),
                "%d CPUs less a core assumed for the training process; %s not measured" % (
                    m.cpus, others_not), others_not)
    others = m.others_cpu_cores or 0.0
    cores = float(m.cpus) - main - others
    basis = "%d CPUs less the training thread's %s" % (m.cpus, _cores(main))
    if m.others_ranks:
        basis += " and %d other %s %s" % (m.others_ranks, "rank's" if m.others_ranks == 1 else "ranks'",
                                          _cores(others))
    return max(cores, used, MIN_CORES), basis + "; " + others_not + " not measured", others_not


def floor(caps: tuple[Capacity, ...]) -> tuple[float, Capacity | None]:
    """(the highest floor among the measured capacities, the capacity that sets it)."""
    best = max((c for c in caps if c.measured and c.floor > 0), key=lambda c: c.floor, default=None)
    return (best.floor, best) if best is not None else (0.0, None)


def most_workers(caps: tuple[Capacity, ...]) -> tuple[int | None, Capacity | None]:
    """(the fewest workers any capacity lets work, the capacity), or (None, None)."""
    best = min((c for c in caps if c.workers is not None), key=lambda c: c.workers or 0, default=None)
    return (best.workers, best) if best is not None else (None, None)


def assumed(m: Measured, caps: tuple[Capacity, ...], workers: int, speedup: float | None) -> list[str]:
    """The capacities (or their parts) not measured that ``workers`` workers running
    ``speedup`` times as fast would ask for more than the loader gets now: what the
    prediction assumes."""
    out = []
    now = max(1, m.workers or 0)
    for c in caps:
        if c.measured and not c.unmeasured:
            continue
        if c.name == "cores" and m.workers_cpu_cores is not None:
            more = m.workers_cpu_cores * (workers / now - 1)
            if more > max(CROSS * m.workers_cpu_cores, 0.25):
                out.append("%.2g more cores free on the node (%s)" % (more, c.words))
            continue
        if c.name == "device" and speedup is not None and speedup > 1 + CROSS:
            rate = m.block_read_bytes_per_second or 0.0
            out.append("the device to deliver %.3g MB/s, %.3g now (%s)" % (
                rate * speedup / 1e6, rate / 1e6, c.words))
    return out
