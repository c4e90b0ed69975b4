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
  more workers buy nothing: the change is a CPU limit. Which limit: the same replay,
  searched over Q, with each batch's load time less the share of it the quota held
  the worker back (the cgroup's throttled seconds per worker); what the node's other
  tasks took from the workers (their run-queue wait beyond the throttling) stays in
  the load times, since a larger limit does not give that back. So the margin over
  C / T_c is what the measured spread and crowding need, not a fixed factor; where no
  limit reaches the target with these workers, the workers are raised too, and where
  nothing does (a crowded node), the prediction says what wait remains.
- persistent_workers: each iterator's first batch waits for its workers to start; with
  persistent workers that wait becomes one ordinary steady-state wait.
- /dev/shm: the workers hold up to workers x prefetch_factor batches there.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import slow_worker
from .queue import CROWDED, MAIN_CORE, REPLAY_BATCHES, TARGET, Measured, replay

__all__ = ["MAIN_CORE", "REPLAY_BATCHES", "TARGET", "Measured", "for_cause", "headroom", "replay"]
CPU_MARGIN = 1.25                # over the mean CPU demand, only without per-batch load times
LIMIT_STEP = 0.05                # cores: a CPU limit is named to this step
LIMIT_SPAN = 4.0                 # a limit is searched up to this many times the mean demand
HELD_BACK_MIN = 0.02             # a quota that holds the workers back less is not what slows them
MAX_WORKERS = 64


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


def fewest_workers(m: Measured, prefetch: int, floor: float) -> tuple[int, float, float]:
    """(W, wait, step): the fewest workers from the current count whose replay waits no
    more than TARGET, or MAX_WORKERS' figures. The wait does not rise with W, so a
    search: doubling from the current count until one keeps up, then a bisection below
    it (the answer is mostly within 2x: 8 workers take 5 replays; from MAX_WORKERS down
    it took 8, and the replays were most of a stall's analysis, issue 15). Under a
    floor above the compute no count can keep up: the current count's figures, at once."""
    def at(w):
        return replay(m.load, m.compute, w, prefetch, floor, times=m.load_times)
    if floor > m.compute_mean * (1 - TARGET):
        return (m.workers,) + at(m.workers)
    lo = hi = m.workers
    found = {}
    while True:
        hi = min(MAX_WORKERS, 2 * hi)
        found[hi] = at(hi)
        if found[hi][0] <= TARGET:
            break
        if hi >= MAX_WORKERS:
            return (hi,) + found[hi]
        lo = hi + 1
    while lo < hi:
        mid = (lo + hi) // 2
        found[mid] = at(mid)
        if found[mid][0] <= TARGET:
            hi = mid
        else:
            lo = mid + 1
    return (lo,) + (found.get(lo) or at(lo))


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
    w, wait, step = fewest_workers(m, prefetch, floor)
    spread = float(np.std(m.load) / np.mean(m.load)) if np.mean(m.load) > 0 else 0.0
    text = ("replayed the DataLoader queue (%d workers, prefetch %d, in-order delivery) with the "
            "%d measured load times (mean %.3gs, spread %.0f%%) and compute times (mean %.3gs)"
            % (w, prefetch, len(m.load), float(np.mean(m.load)), 100 * spread, m.compute_mean))
    if mean_need != w:
        text += "; the means alone say %d" % mean_need
    cap = m.loader_cores
    if floor and (floor > m.compute_mean * (1 - TARGET) or wait > TARGET):
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


def unthrottled_load(m: Measured) -> np.ndarray | None:
    """The per-batch load times without the quota's hold: less the held-back share when
    measured; otherwise (no throttling figures) the CPU work alone, each worker at the
    CPU share it did not get, an upper bound on the gain."""
    if m.load is None or not len(m.load) or not m.workers:
        return None
    if m.held_back is not None:
        return m.load * (1.0 - m.held_back)
    got = (m.workers_cpu_cores or 0) / m.workers
    return m.load * min(1.0, got) if got > 0 else m.load


def _loader_limit(cores: float, m: Measured) -> float:
    """The pod's CPU limit for ``cores`` of loader CPU (a shared quota keeps a core per rank)."""
    if m.quota_ranks:
        cores = m.quota_ranks * (cores + MAIN_CORE)
    return math.ceil(round(cores / LIMIT_STEP, 6)) * LIMIT_STEP


def limit_search(m: Measured, load: np.ndarray, workers: int) -> tuple[float, float, float]:
    """(loader cores, wait, step): the smallest loader CPU (in LIMIT_STEP) whose replay
    with ``workers`` waits no more than TARGET, or, if none up to LIMIT_SPAN x the mean
    demand does, the smallest within TARGET of the best reachable wait."""
    c, prefetch = m.cpu_per_batch, m.prefetch or 2
    lo = max(1, math.ceil(c / m.compute_mean / LIMIT_STEP - 1e-9))  # the mean demand: no less
    hi = max(lo + 1, math.ceil(LIMIT_SPAN * c / m.compute_mean / LIMIT_STEP))
    # the node's share caps only workers beyond the current ones: theirs is in their load times
    node = (m.node_cores or math.inf) if workers > (m.workers or 1) else math.inf

    def at(k):
        return replay(load, m.compute, workers, prefetch, c / min(k * LIMIT_STEP, node), times=m.load_times)
    top_wait, _ = at(hi)
    # none reaches the target: the smallest within a target of the best (the wait is flat
    # there; a tighter goal chased noise: 1.05 cores, 3x the demand, for 39 % remaining)
    goal = TARGET if top_wait <= TARGET else top_wait + TARGET
    while lo < hi:  # the wait falls as the limit rises: bisect the grid
        mid = (lo + hi) // 2
        if at(mid)[0] <= goal:
            hi = mid
        else:
            lo = mid + 1
    wait, step = at(lo)
    return lo * LIMIT_STEP, wait, step


def needed_cpu_limit(m: Measured) -> float | None:
    c = m.cpu_per_batch
    if not c or m.compute_mean <= 0:
        return None
    load = unthrottled_load(m)
    if load is None:
        return _loader_limit(CPU_MARGIN * c / m.compute_mean, m)
    return _loader_limit(limit_search(m, load, m.workers)[0], m)


def cpu_limit(m: Measured, basis: str = "", capped_workers: int | None = None) -> dict[str, Any] | None:
    """The CPU limit at which the loader stops being throttled: the replay searched over
    the limit, with the load times the quota did not stretch (module docstring)."""
    c = m.cpu_per_batch
    if not c or m.compute_mean <= 0:
        return None
    if m.held_back is not None and m.held_back < HELD_BACK_MIN:
        return None  # the quota does not hold the workers back now: a limit buys nothing
    load = unthrottled_load(m)
    w = m.workers or 1
    settings: dict[str, Any] = {}
    if load is None:
        cores = CPU_MARGIN * c / m.compute_mean
        step = max(m.compute_mean, c / cores)
        wait = 1 - m.compute_mean / step
        how = "a %.0f%% margin over the mean demand (no per-batch load times)" % (100 * (CPU_MARGIN - 1))
    else:
        cores, wait, step = limit_search(m, load, w)
        node_bound = m.node_cores is not None and c / m.node_cores > m.compute_mean * (1 - TARGET)
        if wait > TARGET and not node_bound:  # these workers cannot keep up unthrottled: more too
            for more in range(w + 1, min(MAX_WORKERS, 4 * w) + 1):
                k, wt, st = limit_search(m, load, more)
                if wt <= TARGET:
                    cores, wait, step, w = k, wt, st, more
                    settings["num_workers"] = more
                    break
        how = ("the replay of the queue (%d workers, the measured spread) under the limit, with "
               "the load times less the %.0f%% the quota held each worker back" % (
                   w, 100 * (m.held_back or 0.0)))
    limit = _loader_limit(cores, m)
    settings = dict({"cpu_limit_cores": limit}, **settings)
    text = ("the workers need %.3g CPU-s per batch (%.2g cores at %.3gs of compute a batch); "
            "a limit of %.3g cores (%.2g for the loader, %.0f%% over the mean demand) from %s" % (
                c, c / m.compute_mean, m.compute_mean, limit, cores,
                100 * (cores * m.compute_mean / c - 1), how))
    if m.quota_ranks:
        text += "; %d rank(s) share the quota, each keeping %.3g core for its training process" % (
            m.quota_ranks, MAIN_CORE)
    more: dict[str, Any] = {"cpu_limit_cores": limit}
    if m.crowded >= CROWDED:
        text += ("; the node's other tasks kept the workers waiting for a core %.0f%% of the time "
                 "besides the quota, which no limit gives back" % (100 * m.crowded))
        more["crowded_ratio"] = round(m.crowded, 4)
        if m.node_cores is not None:
            text += " (they would get %.2g cores from it: a batch per %.3gs at best)" % (
                m.node_cores, c / m.node_cores)
    if wait > TARGET:
        text += "; no limit brings the wait under the line: %.1f%% remains" % (100 * wait)
    if capped_workers is not None:
        more["workers_alone_useless"] = True
    change = "raise the CPU limit to %.3g cores" % limit
    if "num_workers" in settings:
        change += " and num_workers from %d to %d" % (m.workers, settings["num_workers"])
    if capped_workers is not None:
        change += " (more workers alone would not help)"
    return _result(change, settings, wait, step, m, (basis + "; " if basis else "") + text,
                   "medium", **more)


def persistent(m: Measured) -> dict[str, Any] | None:
    """persistent_workers=True: each epoch's first-batch wait becomes a steady one.
    ``step_seconds`` is the steady batches' mean (measured.py); an iterator's first batch
    has an interval of its wait alone (the compute before it ended the previous
    iterator), so afterwards each such batch is one steady step: compute + steady wait."""
    if not m.iterator_starts or m.persistent:
        return None
    starts, steady_n = m.iterator_starts, max(0, m.batches - m.iterator_starts)
    removed = m.iterator_start_wait_seconds - starts * m.steady_wait_seconds
    wall = m.step_seconds * steady_n + starts * (m.compute_mean + m.steady_wait_seconds)
    wait_s = m.steady_wait_seconds * (steady_n + starts)
    return _result("set persistent_workers=True", {"persistent_workers": True},
                   wait_s / wall if wall > 0 else 0.0, wall / max(1, m.batches), m,
                   "removes %.3gs of worker start-up at each of %d iterator start(s)" % (
                       removed / starts, starts), "high",
                   first_batch_seconds=round(m.iterator_start_wait_seconds / starts, 6))


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


NO_CONFIG_FIX = {"too_few_workers": "cut the per-sample work: on the CPU the workers get, neither "
                                    "more of them nor a larger CPU limit is predicted to keep up",
                 "fuse_unhealthy": "remount the FUSE daemon and restart the rank",
                 "checkpoint_contention": "move checkpoint writes off the training data's storage",
                 "io_pressure": "move the other I/O off the node's data device",
                 "memory_pressure": "raise the memory limit or cut the loader's footprint",
                 "cpu_contention": "cut per-sample CPU work or the node's other load",
                 "transfer_cost": "pack tensors, collate in the workers, pin_memory=True",
                 "cache_miss": "prewarm or resize the cache",
                 "unexplained": "sample the workers' stacks first"}


# cause -> its configuration fix's model (the others: what to fix and the headroom)
MODELS = {"too_few_workers": workers, "cpu_throttle": cpu_limit, "storage_latency": storage,
          "shm_exhaustion": shm, "epoch_start": persistent, "slow_worker": in_order_false}


def for_cause(cause: str, m: Measured) -> dict[str, Any] | None:
    """The prediction for one cause, or for a cause without a configuration fix what
    to fix and the headroom (what fixing it fully would buy)."""
    model = MODELS.get(cause)
    found = model(m) if model is not None else None
    if found is not None:
        return dict(found, cause=cause)
    h = headroom(m)
    return {"cause": cause, "change": NO_CONFIG_FIX.get(cause, "no configuration fix modelled"),
            "settings": {}, "predicted_data_wait_ratio": 0.0,
            "predicted_step_seconds": h["step_seconds_without_wait"], "speedup": h["speedup"],
            "basis": "no model for a configuration change: the headroom (every wait gone) is the "
                     "most a fix can buy", "confidence": "upper bound"}
