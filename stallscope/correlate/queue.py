"""The DataLoader's queue, replayed (issue 17): one rank's measured numbers
(``Measured``) and ``replay``, which the predictions (predict.py) and the
too_few_workers evidence (workers.py) share.

W workers take batches in turn (batch i goes to worker i mod W), at most
prefetch_factor x W are in flight, and the loop takes them *in order*. Service and
compute times are drawn (seeded) from the measured per-batch samples, so their spread
counts: with variable service time one slow batch holds up every later one
(head-of-line blocking). A closed form for an in-order, bounded, multi-server queue
does not exist; a 600-batch replay takes about 0.3 ms on an idle core.

Where the load samples' times are known, a batch's service time is drawn from the samples
measured around the same moment of the window (the replay's clock, from a seeded phase,
around the window as a loop): a storage brownout slows every batch for seconds, and
drawn independently its slow samples were spread thin through the replay. The lab's
brownout reruns with the workers so predicted waited 4.6-7.6 % where the iid replay said
0.0-0.8 % (issue 17).
"""
from __future__ import annotations

import bisect
import dataclasses
import random
from typing import Any

import numpy as np

from ..vocabulary import DATA_WAIT_LINE, line_of
from .model import Prediction, ProposedSettings

TARGET = DATA_WAIT_LINE / 2      # a fix aims at half the alert line
# a link at this share of its capacity carries no more (bandwidth_bound's line)
LINK_LINE = line_of("bandwidth_bound", "link_receive_ratio").threshold
CROWDED = 0.1                    # run-queue wait per worker, beyond the quota's, of a crowded node
MAIN_CORE = 1.0                  # a rank's training process keeps one core (where not measured)
REPLAY_BATCHES = 600
SEED = 17
NEAR_S = 0.5                     # a time-indexed draw takes a sample measured this close
MAX_WORKERS = 64                 # no model proposes more


@dataclasses.dataclass(frozen=True)
class Memory:
    """What more loader workers would cost in memory (the agent's workers exporter): the
    limit of the rank's memory cgroup (None: none), what the cgroup charges now, and the
    largest live worker's RSS, what one more worker is taken to need (an upper bound: RSS
    counts the pages a forked worker still shares with the training process)."""
    limit_bytes: int | None
    used_bytes: int | None
    worker_rss_bytes: int | None

    @property
    def more_workers(self) -> int | None:
        """How many more workers the limit holds (None: no limit, or not measured)."""
        if not self.limit_bytes or self.used_bytes is None or not self.worker_rss_bytes:
            return None
        return max(0, (self.limit_bytes - self.used_bytes) // self.worker_rss_bytes)


@dataclasses.dataclass(frozen=True)
class Link:
    """The busiest link of the node against the rank's reads (issue 31): its share of
    capacity and capacity (bytes/s, the links exporter's), the bytes a second the rank's
    loader got and the bytes a batch it reads."""
    ratio: float
    capacity: float | None
    rank_bytes_per_second: float
    bytes_per_batch: float

    @property
    def saturated(self) -> bool:
        return self.ratio >= LINK_LINE

    @property
    def share(self) -> float:
        """The rank's share of what the link carried (1: the link is all its)."""
        if not self.capacity or self.ratio <= 0:
            return 1.0
        return min(1.0, self.rank_bytes_per_second / (self.ratio * self.capacity))

    def floor(self) -> float:
        """The shortest batch time the link allows the rank: its bytes a batch at the most
        it could get with the link full (what it got, over the link's share of capacity
        in use; a link measured over its capacity gives no more than it gave)."""
        if self.rank_bytes_per_second <= 0:
            return 0.0
        return self.bytes_per_batch * min(1.0, max(self.ratio, 1e-3)) / self.rank_bytes_per_second


@dataclasses.dataclass(frozen=True)
class Measured:
    """One rank's numbers over the window (seconds; None: not measured)."""
    step_seconds: float                    # mean interval between batches (steady)
    compute: np.ndarray                    # per-batch compute samples (interval - wait)
    data_wait_ratio: float                 # every batch, as the alert counts it
    load: np.ndarray | None = None      # per-batch load time samples from the workers
    load_times: np.ndarray | None = None  # when each was measured (seconds, ascending)
    workers: int | None = None
    prefetch: int | None = None
    persistent: bool | None = None
    quota_cores: float | None = None    # the CFS quota over the loader (cores)
    quota_ranks: int | None = None      # ranks whose main process shares that quota
    workers_cpu_cores: float | None = None  # all workers' CPU use (cores)
    iterator_starts: int = 0
    iterator_start_wait_seconds: float = 0.0
    steady_wait_seconds: float = 0.0       # mean wait of a steady batch
    batches: int = 0
    window_seconds: float = 0.0
    shard_read_p99: float | None = None
    shard_reads_per_second: float | None = None
    shm_size_bytes: float | None = None
    shm_used_bytes: float | None = None
    worker_loads: tuple[np.ndarray, ...] | None = None  # each worker's load time samples (slow_worker.py)
    throttled_seconds_rate: float | None = None  # threads held back by the quota, per second
    held_back_ratio: float | None = None    # a runnable worker's share held back (cfs exporter)
    runqueue_ratio: float | None = None     # run-queue wait per second, per worker
    waits: np.ndarray | None = None         # per-batch steady waits (the load itself without workers)
    memory: Memory | None = None            # the memory limit more workers must fit in
    link: Link | None = None                # the node's busiest link and the rank's bytes
    cpus: int | None = None                 # CPUs the rank's cpuset allows (capacity.py)
    io_read_limit: float | None = None      # bytes/s its cgroup may read from its device
    block_read_bytes_per_second: float | None = None  # what its workers read from block devices
    dataset_shards: int | None = None       # an iterable dataset's shards: workers that get data
    main_cpu_cores: float | None = None     # the training thread's measured on-CPU share (cores)
    others_cpu_cores: float | None = None   # the node's other ranks' loaders, measured (cores)
    others_ranks: int = 0                   # how many other ranks others_cpu_cores sums
    node_idle_cores: float | None = None    # the node's idle CPUs, measured (cores)
    # the node's idle CPUs while the workers waited for a CPU (weighted by their run-queue
    # wait): idle CPUs beside queued workers are outside their affinity (capacity.py)
    idle_while_queued: float | None = None

    @property
    def block_read_bytes_per_batch(self) -> float | None:
        if not self.block_read_bytes_per_second or self.step_seconds <= 0:
            return None
        return self.block_read_bytes_per_second * self.step_seconds

    @property
    def compute_mean(self) -> float:
        return float(np.mean(self.compute)) if len(self.compute) else 0.0

    @property
    def cpu_per_batch(self) -> float | None:
        if self.workers_cpu_cores is None or self.step_seconds <= 0:
            return None
        return self.workers_cpu_cores * self.step_seconds

    @property
    def held_back(self) -> float | None:
        """Share of each worker's time the quota held it back (None: not measured). The
        cfs exporter's held-back share (the cgroup's throttled seconds over the CPUs its
        processes spread across); in traces recorded before it, the throttled seconds per
        worker. Never more than the run-queue wait, which counts throttled tasks too."""
        if self.held_back_ratio is not None:
            share = self.held_back_ratio
        elif self.throttled_seconds_rate is None or not self.workers:
            return None
        else:
            share = self.throttled_seconds_rate / self.workers
        if self.runqueue_ratio is not None:
            share = min(share, self.runqueue_ratio)
        return float(min(max(share, 0.0), 0.95))

    @property
    def crowded(self) -> float:
        """Run-queue wait per worker that the quota does not explain: the node's other tasks."""
        if self.runqueue_ratio is None:
            return 0.0
        return max(0.0, self.runqueue_ratio - (self.held_back or 0.0))

    @property
    def node_cores(self) -> float | None:
        """On a crowded node: the CPU the node would give all the workers without the quota,
        what they got plus their held-back time at the rate they ran while runnable. A
        fixed share, so the model does not promise that more workers or a larger limit
        win CPU from the node's other tasks (the lab's cpu-throttle rerun at load 32: 4
        workers under 0.8 cores waited 32 %, where a per-worker rate predicted 1 %)."""
        if self.crowded < CROWDED or not self.workers_cpu_cores or not self.workers:
            return None
        per = self.workers_cpu_cores / self.workers
        rate = per / (per + self.crowded)
        return self.workers * (per + (self.held_back or 0.0) * rate)

    @property
    def memory_workers(self) -> int | None:
        """The most workers the rank's memory limit holds (None: not bounded, or not measured)."""
        more = self.memory.more_workers if self.memory is not None else None
        return None if more is None else (self.workers or 0) + more

    @property
    def loader_cores(self) -> float | None:
        """Cores of the quota the workers may use (a shared quota keeps a core per rank)."""
        if not self.quota_cores:
            return None
        if self.quota_ranks:
            return max(0.1, self.quota_cores / self.quota_ranks - MAIN_CORE)
        return self.quota_cores


@dataclasses.dataclass(frozen=True)
class _Timed:
    """Load samples in the order they were measured, for draws that follow the window's
    time: ``at`` (seconds from the first), ``values``, the window's ``span``, the
    replay's seeded ``phase`` in it and the seeded ``pick`` that draws among them."""
    at: list[float]
    values: list[float]
    span: float
    phase: float
    pick: random.Random


def _service(load: np.ndarray, times: np.ndarray | None, n: int, seed: int) -> list[float] | _Timed:
    """The service times: ``n`` drawn (seeded) where the samples' times are not known,
    else the samples to draw from by replay time."""
    if times is None or len(times) != len(load) or len(load) < 2:
        drawn: list[float] = np.random.default_rng(seed).choice(load, n).tolist()
        return drawn
    order = np.argsort(times, kind="stable")
    t = np.asarray(times, float)[order]
    at = (t - t[0]).tolist()
    values: list[float] = np.asarray(load, float)[order].tolist()
    span = at[-1] + (at[-1] / (len(at) - 1))  # the window, one mean gap past its last sample
    if not span > 0:  # every sample at one moment: nothing to follow in time
        return _service(load, None, n, seed)
    pick = random.Random(seed)
    return _Timed(at, values, span, pick.random() * span, pick)


def replay(load: np.ndarray, compute: np.ndarray, workers: int, prefetch: int = 2,
           floor: float = 0.0, n: int = REPLAY_BATCHES, seed: int = SEED,
           times: np.ndarray | None = None) -> tuple[float, float]:
    """(data-wait share, mean step seconds) of the DataLoader queue replayed with
    service times ``load`` and compute times ``compute`` (drawn with replacement; with
    ``times``, the load times measured at the moment of the window a batch starts);
    ``floor``: the loader delivers at most one batch per ``floor`` seconds (a CPU cap).
    The loop is written flat (the draw by time inline, locals bound): the replays were
    most of a stall's analysis, and the analyses most of the agent's jobs thread."""
    rng = np.random.default_rng(seed)
    service = _service(load, times, n, seed)
    comp = rng.choice(compute, n).tolist()
    w = max(1, workers)
    depth = max(1, prefetch) * w
    free = [0.0] * w                # when each worker is free
    taken = [0.0] * n               # when the loop took batch i
    cap_free = 0.0                  # the CPU cap as one shared pipe
    loop = 0.0
    waits = steps = 0.0
    skip = min(n // 4, 2 * depth)   # the start-up: the queue fills
    timed = isinstance(service, _Timed)
    if isinstance(service, _Timed):
        at, values, span, phase = service.at, service.values, service.span, service.phase
        last, draw = len(values) - 1, service.pick.random
        left, right = bisect.bisect_left, bisect.bisect_right
    else:
        drawn = service
    for i in range(n):
        j = i % w
        start = free[j]
        if i >= depth and taken[i - depth] > start:
            start = taken[i - depth]
        if timed:  # a sample measured near this moment of the window (NEAR_S either side)
            u = (phase + start) % span
            lo = left(at, u - NEAR_S)
            hi = right(at, u + NEAR_S)
            if hi < lo + 1:
                hi = lo + 1
            k = lo + int(draw() * (hi - lo))
            ready = start + values[k if k < last else last]
        else:
            ready = start + drawn[i]
        if floor > 0:
            ready = cap_free = max(ready, cap_free + floor)
        free[j] = ready
        got = ready if ready > loop else loop
        if i >= skip:
            waits += got - loop
            steps += got - loop + comp[i]
        taken[i] = got
        loop = got + comp[i]
    n_steady = n - skip
    return (waits / steps if steps > 0 else 0.0), steps / max(1, n_steady)


def prediction(change: str, settings: ProposedSettings, wait: float, step: float, m: Measured,
               basis: str, confidence: str, **more: Any) -> Prediction:
    """One modelled change: the change, its settings, the data-wait share and step time to
    expect, the speedup, how it was found (its cause is set by predict.for_cause)."""
    return Prediction("", change, settings, round(max(0.0, wait), 4), round(step, 6),
                      round(m.step_seconds / step, 3) if step > 0 else None, basis, confidence,
                      **more)
