"""What a change will buy (issue 17): for each cause with a configuration fix, the
change, and the data-wait share and step time to expect afterwards, from what the
rank measured. Pure: numbers in, a dict out (docs/correlator.md, "Predictions").

The models, and why each:
- headroom: the most *any* input-side fix can give is the step with no wait at all,
  the measured compute per batch (interval - wait); exact by definition.
- workers (too_few_workers, storage_latency): a replay of the DataLoader's queue. W
  workers take batches in turn (batch i goes to worker i mod W), at most
  prefetch_factor x W are in flight, and the loop takes them *in order*. Service and
  compute times are drawn from the measured per-batch samples, so their spread counts:
  with variable service time one slow batch holds up every later one (head-of-line
  blocking), and ceil(T_l / T_c) workers, enough on the means, are not. A closed form
  for an in-order, bounded, multi-server queue does not exist; a 600-batch replay
  takes about a millisecond per candidate W.
- the CPU cap: workers need C CPU-seconds per batch (their measured CPU rate x the
  interval between batches; this holds throttled or not, since throttling stretches
  the wall time, not the work). Under a quota of Q cores the loader cannot deliver
  faster than one batch per C / Q, whatever W. When that floor is above the compute,
  more workers buy nothing: the change is the CPU limit C / T_c plus a margin.
- persistent_workers: each iterator's first batch waits for its workers to start; with
  persistent workers that wait becomes one ordinary steady-state wait.
- /dev/shm: the workers hold up to workers x prefetch_factor batches there.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..vocabulary import DATA_WAIT_LINE
from . import slow_worker

TARGET = DATA_WAIT_LINE / 2      # a fix aims at half the alert line
CPU_MARGIN = 1.25                # headroom over the measured CPU demand (spread, bursts)
MAIN_CORE = 1.0                  # a rank's training process keeps one core of a shared quota
REPLAY_BATCHES = 600
MAX_WORKERS = 64
SEED = 17


@dataclasses.dataclass(frozen=True)
class Measured:
    """One rank's numbers over the window (seconds; None: not measured)."""
    step_seconds: float                    # mean interval between batches (steady)
    compute: np.ndarray                    # per-batch compute samples (interval - wait)
    data_wait_ratio: float                 # every batch, as the alert counts it
    load: np.ndarray | None = None      # per-batch load time samples from the workers
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
    worker_loads: tuple | None = None   # each worker's load time samples (slow_worker.py)

    @property
    def compute_mean(self) -> float:
        return float(np.mean(self.compute)) if len(self.compute) else 0.0

    @property
    def cpu_per_batch(self) -> float | None:
        if self.workers_cpu_cores is None or self.step_seconds <= 0:
            return None
        return self.workers_cpu_cores * self.step_seconds

    @property
    def loader_cores(self) -> float | None:
        """Cores of the quota the workers may use (a shared quota keeps a core per rank)."""
        if not self.quota_cores:
            return None
        if self.quota_ranks:
            return max(0.1, self.quota_cores / self.quota_ranks - MAIN_CORE)
        return self.quota_cores


def replay(load: np.ndarray, compute: np.ndarray, workers: int, prefetch: int = 2,
           floor: float = 0.0, n: int = REPLAY_BATCHES, seed: int = SEED) -> tuple[float, float]:
    """(data-wait share, mean step seconds) of the DataLoader queue replayed with
    service times ``load`` and compute times ``compute`` (drawn with replacement);
    ``floor``: the loader delivers at most one batch per ``floor`` seconds (a CPU cap)."""
    rng = np.random.default_rng(seed)
    svc = rng.choice(load, n).tolist()
    comp = rng.choice(compute, n).tolist()
    w = max(1, workers)
    depth = max(1, prefetch) * w
    free = [0.0] * w                # when each worker is free
    taken = [0.0] * n               # when the loop took batch i
    cap_free = 0.0                  # the CPU cap as one shared pipe
    loop = 0.0
    waits = steps = 0.0
    skip = min(n // 4, 2 * depth)   # the start-up: the queue fills
    for i in range(n):
        issued = taken[i - depth] if i >= depth else 0.0
        start = max(free[i % w], issued)
        ready = start + svc[i]
        if floor > 0:
            ready = cap_free = max(ready, cap_free + floor)
        free[i % w] = ready
        got = max(ready, loop)
        if i >= skip:
            waits += got - loop
            steps += got - loop + comp[i]
        taken[i] = got
        loop = got + comp[i]
    n_steady = n - skip
    return (waits / steps if steps > 0 else 0.0), steps / max(1, n_steady)


def _result(change: str, settings: dict, wait: float, step: float, m: Measured, basis: str,
            confidence: str, **more: Any) -> dict[str, Any]:
    out = {"change": change, "settings": settings,
           "predicted_data_wait_ratio": round(max(0.0, wait), 4),
           "predicted_step_seconds": round(step, 6),
           "speedup": round(m.step_seconds / step, 3) if step > 0 else None,
           "basis": basis, "confidence": confidence}
    out.update(more)
    return out


def headroom(m: Measured) -> dict[str, Any]:
    """The most any input-side fix can give this rank: the step with no wait."""
    step = m.compute_mean
    return {"step_seconds": round(m.step_seconds, 6), "step_seconds_without_wait": round(step, 6),
            "data_wait_ratio": round(m.data_wait_ratio, 4),
            "speedup": round(m.step_seconds / step, 3) if step > 0 else None}


def _cpu_floor(m: Measured, cores: float | None) -> float:
    c = m.cpu_per_batch
    return c / cores if c and cores else 0.0


def workers(m: Measured, basis: str = "") -> dict[str, Any] | None:
    """The worker count that keeps up (replayed with the measured spread), capped by
    the CPU quota; when the cap binds, the CPU limit that would be needed."""
    if m.load is None or not len(m.load) or not len(m.compute) or not m.workers:
        return None
    prefetch = m.prefetch or 2
    floor = _cpu_floor(m, m.loader_cores)
    mean_need = max(1, math.ceil(float(np.mean(m.load)) / max(m.compute_mean, 1e-9)))
    # a worker uses its share of the workers' CPU; W workers can use no more cores than the quota
    per_worker = (m.workers_cpu_cores / m.workers) if m.workers_cpu_cores else None
    best = None
    for w in range(m.workers, MAX_WORKERS + 1):
        wait, step = replay(m.load, m.compute, w, prefetch, floor)
        best = (w, wait, step)
        if wait <= TARGET:
            break
    w, wait, step = best
    spread = float(np.std(m.load) / np.mean(m.load)) if np.mean(m.load) > 0 else 0.0
    text = ("replayed the DataLoader queue (%d workers, prefetch %d, in-order delivery) with the "
            "%d measured load times (mean %.3gs, spread %.0f%%) and compute times (mean %.3gs)"
            % (w, prefetch, len(m.load), float(np.mean(m.load)), 100 * spread, m.compute_mean))
    if mean_need != w:
        text += "; the means alone say %d" % mean_need
    cap = m.loader_cores
    if floor and (floor > m.compute_mean * (1 - TARGET) or wait > TARGET):
        needed_cpu_limit(m)
        text += ("; the CPU quota (%.2g cores for the workers) lets them deliver one batch per "
                 "%.3gs at most (%.3g CPU-s a batch): more workers share the same CPU" % (
                     cap, floor, m.cpu_per_batch))
        return cpu_limit(m, basis=text, capped_workers=w)
    if wait > TARGET and w >= MAX_WORKERS:
        return None
    if w == m.workers:
        return None  # the queue keeps up with these workers: not a worker problem
    more = {}
    if per_worker and cap and w * per_worker > cap:
        more["cpu_note"] = "%d workers use ~%.2g cores, over the quota's %.2g" % (w, w * per_worker, cap)
    return _result("raise num_workers from %d to %d" % (m.workers, w), {"num_workers": w},
                   wait, step, m, basis + text, "high" if len(m.load) >= 50 else "medium", **more)


def needed_cpu_limit(m: Measured) -> float | None:
    c = m.cpu_per_batch
    if not c or m.compute_mean <= 0:
        return None
    cores = CPU_MARGIN * c / m.compute_mean
    if m.quota_ranks:
        cores = m.quota_ranks * (cores + MAIN_CORE)
    return math.ceil(cores * 10) / 10


def cpu_limit(m: Measured, basis: str = "", capped_workers: int | None = None) -> dict[str, Any] | None:
    """The CPU limit at which the loader stops being throttled, from its measured demand."""
    limit = needed_cpu_limit(m)
    if limit is None:
        return None
    c = m.cpu_per_batch
    loader = limit / m.quota_ranks - MAIN_CORE if m.quota_ranks else limit
    floor = c / loader
    w = m.workers or 1
    if m.load is not None and len(m.load) and m.workers:
        # unthrottled, a worker's batch takes its CPU work plus what it waited on besides
        # throttling: the measured time shrunk to the CPU share it did not get
        got = (m.workers_cpu_cores or 0) / m.workers
        load = m.load * min(1.0, got) if got > 0 else m.load
        wait, step = replay(load, m.compute, w, m.prefetch or 2, floor)
    else:
        step = max(m.compute_mean, floor)
        wait = 1 - m.compute_mean / step
    text = ("the workers need %.3g CPU-s per batch (%.2g cores at %.3gs of compute a batch); "
            "a limit of %.2g cores leaves %.0f%% margin" % (c, c / m.compute_mean, m.compute_mean,
                                                            limit, 100 * (CPU_MARGIN - 1)))
    more = {"cpu_limit_cores": limit}
    if capped_workers is not None:
        more["workers_alone_useless"] = True
    return _result("raise the CPU limit to %.2g cores%s" % (
        limit, " (more workers alone would not help)" if capped_workers is not None else ""),
        {"cpu_limit_cores": limit}, wait, step, m, (basis + "; " if basis else "") + text, "medium", **more)


def persistent(m: Measured) -> dict[str, Any] | None:
    """persistent_workers=True: each epoch's first-batch wait becomes a steady one."""
    if not m.iterator_starts or m.persistent:
        return None
    removed = m.iterator_start_wait_seconds - m.iterator_starts * m.steady_wait_seconds
    total = m.step_seconds * max(1, m.batches)
    wait_s = m.data_wait_ratio * total - max(0.0, removed)
    step_total = total - max(0.0, removed)
    return _result("set persistent_workers=True", {"persistent_workers": True},
                   wait_s / step_total if step_total > 0 else 0.0,
                   step_total / max(1, m.batches), m,
                   "removes %.3gs of worker start-up at each of %d iterator start(s)" % (
                       removed / m.iterator_starts, m.iterator_starts), "high",
                   first_batch_seconds=round(m.iterator_start_wait_seconds / m.iterator_starts, 6))


def shm(m: Measured) -> dict[str, Any] | None:
    """/dev/shm large enough for workers x prefetch batches in flight (twice the
    measured use at least: it was full, so the use is a lower bound)."""
    if not m.shm_size_bytes or m.shm_used_bytes is None:
        return None
    need = max(2 * m.shm_used_bytes, m.shm_size_bytes * 2)
    mib = int(math.ceil(need / 2**20 / 64) * 64)
    h = headroom(m)
    return _result("give the pod a /dev/shm of %d MiB" % mib, {"shm_mib": mib}, 0.0,
                   h["step_seconds_without_wait"], m,
                   "the workers hold up to %s x %s batches there; %.0f of %.0f MiB were in use "
                   "(batch bytes are not measured, so at least twice the use)" % (
                       m.workers, m.prefetch or 2, m.shm_used_bytes / 2**20, m.shm_size_bytes / 2**20),
                   "low")


def storage(m: Measured) -> dict[str, Any] | None:
    """Little's law: reads in flight = read rate x latency; enough parallel readers
    (workers) to hide the tail, replayed like too_few_workers."""
    found = workers(m, basis="")
    if found is None:
        return None
    if m.shard_read_p99 and m.shard_reads_per_second:
        need_rate = m.shard_reads_per_second * m.step_seconds / max(m.compute_mean, 1e-9)
        found["basis"] += ("; Little's law: %.3g reads/s x p99 %.3gs = %.2g reads in flight" % (
            need_rate, m.shard_read_p99, need_rate * m.shard_read_p99))
    found["change"] += " (or prefetch/cache the shards locally)"
    return found


def in_order_false(m: Measured) -> dict[str, Any] | None:
    """slow_worker's fix: the DataLoader's queue replayed with each worker's own load
    times, in order (as now) and with in_order=False (fast workers take the slow one's
    share, the loop takes whichever batch is ready)."""
    if not m.worker_loads or len(m.worker_loads) < 2 or not len(m.compute):
        return None
    prefetch = m.prefetch or 2
    now = slow_worker.replay(list(m.worker_loads), m.compute, prefetch, True)
    wait = slow_worker.replay(list(m.worker_loads), m.compute, prefetch, False)
    step = m.compute_mean / max(1e-9, 1.0 - wait)
    return _result("in_order=False", {"in_order": False}, wait, step, m,
                   "the DataLoader's queue replayed with each of %d workers' load times: wait %.1f%% "
                   "in order, %.1f%% with in_order=False" % (len(m.worker_loads), 100 * now, 100 * wait),
                   "high" if min(len(x) for x in m.worker_loads) >= 20 else "medium",
                   removed_share=round(max(0.0, 1.0 - wait / now), 4) if now > 0 else 0.0)


NO_CONFIG_FIX = {"fuse_unhealthy": "remount the FUSE daemon and restart the rank",
                 "checkpoint_contention": "move checkpoint writes off the training data's storage",
                 "io_pressure": "move the other I/O off the node's data device",
                 "memory_pressure": "raise the memory limit or cut the loader's footprint",
                 "cpu_contention": "cut per-sample CPU work or the node's other load",
                 "transfer_cost": "pack tensors, collate in the workers, pin_memory=True",
                 "cache_miss": "prewarm or resize the cache",
                 "unexplained": "sample the workers' stacks first"}


def for_cause(cause: str, m: Measured) -> dict[str, Any] | None:
    """The prediction for one cause, or for a cause without a configuration fix what
    to fix and the headroom (what fixing it fully would buy)."""
    found = None
    if cause == "too_few_workers":
        found = workers(m)
    elif cause == "cpu_throttle":
        found = cpu_limit(m)
    elif cause == "storage_latency":
        found = storage(m)
    elif cause == "shm_exhaustion":
        found = shm(m)
    elif cause == "epoch_start":
        found = persistent(m)
    elif cause == "slow_worker":
        found = in_order_false(m)
    if found is not None:
        return dict(found, cause=cause)
    h = headroom(m)
    return {"cause": cause, "change": NO_CONFIG_FIX.get(cause, "no configuration fix modelled"),
            "settings": {}, "predicted_data_wait_ratio": 0.0,
            "predicted_step_seconds": h["step_seconds_without_wait"], "speedup": h["speedup"],
            "basis": "no model for a configuration change: the headroom (every wait gone) is the "
                     "most a fix can buy", "confidence": "upper bound"}
