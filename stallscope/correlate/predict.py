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
- the CPU cap (cpu_throttle): cpulimit.py.
- persistent_workers: each iterator's first batch waits for its workers to start; with
  persistent workers that wait becomes one ordinary steady-state wait.
- /dev/shm: the workers hold up to workers x prefetch_factor batches there.
- the link (bandwidth_bound, issue 31): the link at capacity gives the rank R bytes a
  second of the B a batch it reads, so no batch comes faster than B / R, however many
  workers read; more workers are replayed under that floor, as under a CPU quota's. A
  faster link: the capacity at which the rank's share of it carries B / T_c (the pace of
  its compute), with a margin; each worker's load time loses its link time at the old
  rate (W x B / R: the W workers share R) and gains it at the new, and the queue is
  replayed with those.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from . import capacity, slow_worker
from .cpulimit import cpu_limit
from .model import NO_SETTINGS, Headroom, Prediction, ProposedSettings
from .queue import MAIN_CORE, MAX_WORKERS, REPLAY_BATCHES, TARGET, Measured, Memory, prediction, replay

__all__ = ["MAIN_CORE", "REPLAY_BATCHES", "TARGET", "Measured", "Memory", "for_cause", "headroom", "replay"]


def headroom(m: Measured) -> Headroom:
    """The most any input-side fix can give this rank: the step with no wait."""
    step = m.compute_mean
    return Headroom(round(m.step_seconds, 6), round(step, 6), round(m.data_wait_ratio, 4),
                    round(m.step_seconds / step, 3) if step > 0 else None)


def cpu_floor(m: Measured, cores: float | None) -> float:
    c = m.cpu_per_batch
    return c / cores if c and cores else 0.0


def link_floor(m: Measured) -> float:
    """The shortest batch time a saturated link allows (0: no link at capacity)."""
    return m.link.floor() if m.link is not None and m.link.saturated else 0.0


def floor_of(m: Measured) -> float:
    """The shortest batch time the loader's CPU quota and its link allow together."""
    return max(cpu_floor(m, m.loader_cores), link_floor(m))


def service_times(m: Measured) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(per-batch load times, when each was measured) that more workers would share: the
    workers' own, or, with num_workers=0, the loop's steady waits, since the training
    process then loads each batch itself while the loop waits (issue 29: a rank with no
    workers got no prediction at all)."""
    if m.workers:
        return m.load, m.load_times
    return m.waits, None


def fewest_workers(m: Measured, prefetch: int, floor: float) -> tuple[int, float, float]:
    """(W, wait, step): the fewest workers from the current count whose replay waits no
    more than TARGET, or MAX_WORKERS' figures. The wait does not rise with W, so a
    search: doubling from the current count until one keeps up, then a bisection below
    it (the answer is mostly within 2x: 8 workers take 5 replays; from MAX_WORKERS down
    it took 8, and the replays were most of a stall's analysis, issue 15). Under a
    floor above the compute no count can keep up: the current count's figures, at once."""
    load, times = service_times(m)
    assert load is not None  # workers() models only measured load times
    now = max(1, m.workers or 0)

    def at(w: int) -> tuple[float, float]:
        return replay(load, m.compute, w, prefetch, floor, times=times)
    if floor > m.compute_mean * (1 - TARGET):
        return (now,) + at(now)
    lo = hi = now
    found: dict[int, tuple[float, float]] = {}
    if not m.workers:  # one worker may be enough where there were none
        found[1] = at(1)
        if found[1][0] <= TARGET:
            return (1,) + found[1]
        lo = 2
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


def mib(n: float) -> str:
    return "%.0f MiB" % (n / (1 << 20))


def memory_note(m: Measured, needed: int, fit: int) -> str:
    """Why the worker count stops at ``fit``: the memory limit, with its numbers."""
    mem = m.memory
    assert mem is not None and mem.limit_bytes and mem.worker_rss_bytes and mem.used_bytes is not None
    return ("%d workers would keep up, but the pod's memory limit (%s, %s in use) holds %d at ~%s RSS "
            "a worker; an off-CPU wait (a fetch, a sleep) is also hidden by threads or async I/O inside "
            "each worker, or a larger prefetch_factor, at no worker's memory" % (
                needed, mib(mem.limit_bytes), mib(mem.used_bytes), fit, mib(mem.worker_rss_bytes)))


def why_not_more_workers(m: Measured) -> str | None:
    """Why workers() modelled no change, when it measured that more workers will not
    help (None: it could not model them, e.g. no per-batch load times)."""
    load, _ = service_times(m)
    if load is None or not len(load) or not len(m.compute) or m.workers is None:
        return None
    caps = capacity.of(m)
    bound, by = capacity.floor(caps)
    w, wait, _ = fewest_workers(m, m.prefetch or 2, bound)
    fit = m.memory_workers
    if fit is not None and w > m.workers >= fit:
        return memory_note(m, w, fit)
    most, count = capacity.most_workers(caps)
    if count is not None and count.name == "shards" and most is not None and m.workers >= most:
        return ("the dataset has %d shards and an iterable dataset feeds at most one worker a "
                "shard: workers past %d get no data" % (most, most))
    if wait > TARGET and w >= MAX_WORKERS:
        return "even %d workers are replayed to wait %.1f%%" % (w, 100 * wait)
    if by is not None and by.name != "cpu_quota" and bound > m.compute_mean * (1 - TARGET):
        return ("%s gives the loader one batch every %.3gs at most, against %.3gs of compute: "
                "more workers share the same %s" % (by.words, bound, m.compute_mean, by.short))
    if w == m.workers:
        return "the DataLoader's queue replayed with these %d workers keeps up" % w
    return None


def workers(m: Measured, basis: str = "") -> Prediction | None:
    """The worker count that keeps up (replayed with the measured spread), under every
    capacity it touches (capacity.py): the CPU quota, else the cores, the link, the
    device's read limit set floors on the batch time; the dataset's shards and the
    memory limit cap the count. When the quota binds, the CPU limit that would be
    needed; when another capacity binds, which one."""
    load, times = service_times(m)
    if load is None or not len(load) or not len(m.compute) or m.workers is None:
        return None
    prefetch = m.prefetch or 2
    caps = capacity.of(m)
    floor, bound_by = capacity.floor(caps)
    if bound_by is not None and bound_by.name != "cpu_quota" and floor > m.compute_mean * (1 - TARGET):
        return None  # a capacity more workers share caps the loader: why_not_more_workers says so
    mean_need = max(1, math.ceil(float(np.mean(load)) / max(m.compute_mean, 1e-9)))
    # a worker uses its share of the workers' CPU; W workers can use no more cores than the quota
    per_worker = (m.workers_cpu_cores / m.workers) if m.workers_cpu_cores and m.workers else None
    w, wait, step = fewest_workers(m, prefetch, floor)
    spread = float(np.std(load) / np.mean(load)) if np.mean(load) > 0 else 0.0
    text = ("replayed the DataLoader queue (%d workers, prefetch %d, in-order delivery) with the "
            "%d measured load times (mean %.3gs, spread %.0f%%) and compute times (mean %.3gs)"
            % (w, prefetch, len(load), float(np.mean(load)), 100 * spread, m.compute_mean))
    if not m.workers:
        text += "; with num_workers=0 the loop loads each batch itself: its steady waits are the load times"
    if mean_need != w:
        text += "; the means alone say %d" % mean_need
    cap = m.loader_cores
    if bound_by is not None and bound_by.name == "cpu_quota" and (
            floor > m.compute_mean * (1 - TARGET) or wait > TARGET):
        text += ("; the CPU quota (%.2g cores for the workers) lets them deliver one batch per "
                 "%.3gs at most (%.3g CPU-s a batch): more workers share the same CPU" % (
                     cap or 0.0, floor, m.cpu_per_batch or 0.0))
        return cpu_limit(m, basis=text, capped_workers=w)
    more: dict[str, Any] = {}
    most, count = capacity.most_workers(caps)
    fit = m.memory_workers
    if fit is not None and w > fit:
        # issue 30: a count the pod cannot hold is no fix (a newcomer's script was told "1 to
        # 41 workers" on a 2-core machine); the most that fit, and what else hides the wait
        more["memory_note"] = memory_note(m, w, fit)
        if fit <= m.workers:
            return None  # why_not_more_workers says so
        w = fit
        wait, step = replay(load, m.compute, w, prefetch, floor, times=times)
        text += "; " + more["memory_note"]
        bound_by = count if count is not None and count.name == "memory" else bound_by
    elif wait > TARGET and w >= MAX_WORKERS:
        return None
    if count is not None and count.name == "shards" and most is not None and w > most:
        if most <= m.workers:
            return None  # why_not_more_workers says so
        w, bound_by = most, count
        wait, step = replay(load, m.compute, w, prefetch, floor, times=times)
        text += "; the dataset's %d shards feed at most %d workers" % (most, most)
    if w == m.workers:
        return None  # the queue keeps up with these workers: not a worker problem
    if per_worker and cap and w * per_worker > cap:
        more["cpu_note"] = "%d workers use ~%.2g cores, over the quota's %.2g" % (w, w * per_worker, cap)
    if bound_by is not None and wait > TARGET:
        text += "; %s binds: the queue replayed under it still waits %.1f%%" % (bound_by.words, 100 * wait)
        more["bound_by"] = bound_by.name
    confidence = "high" if len(load) >= 50 else "medium"
    assumes = capacity.assumed(m, caps, w, m.step_seconds / step if step > 0 else None)
    if assumes:
        # no "high" across a capacity that was not measured (issue 49)
        confidence = "medium"
        text += "; assumes " + " and ".join(assumes)
    change = "raise num_workers from %d to %d" % (m.workers, w)
    if "memory_note" in more:
        change += " (the most the pod's memory limit holds)"
    elif bound_by is not None and bound_by.name == "shards":
        change += " (one a shard)"
    return prediction(change, ProposedSettings(num_workers=w), wait, step, m, basis + text, confidence,
                      **more)


def persistent(m: Measured) -> Prediction | None:
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
    return prediction("set persistent_workers=True", ProposedSettings(persistent_workers=True),
                   wait_s / wall if wall > 0 else 0.0, wall / max(1, m.batches), m,
                   "removes %.3gs of worker start-up at each of %d iterator start(s)" % (
                       removed / starts, starts), "high",
                   first_batch_seconds=round(m.iterator_start_wait_seconds / starts, 6))


def shm(m: Measured) -> Prediction | None:
    """/dev/shm large enough for workers x prefetch batches in flight (twice the
    measured use at least: it was full, so the use is a lower bound)."""
    if not m.shm_size_bytes or m.shm_used_bytes is None:
        return None
    need = max(2 * m.shm_used_bytes, m.shm_size_bytes * 2)
    mib = int(math.ceil(need / 2**20 / 64) * 64)
    h = headroom(m)
    return prediction("give the pod a /dev/shm of %d MiB" % mib, ProposedSettings(shm_mib=mib), 0.0,
                   h.step_seconds_without_wait, m,
                   "the workers hold up to %s x %s batches there; %.0f of %.0f MiB were in use "
                   "(batch bytes are not measured, so at least twice the use)" % (
                       m.workers, m.prefetch or 2, m.shm_used_bytes / 2**20, m.shm_size_bytes / 2**20),
                   "low")


def storage(m: Measured) -> Prediction | None:
    """Little's law: reads in flight = read rate x latency; enough parallel readers
    (workers) to hide the tail, replayed like too_few_workers."""
    found = workers(m, basis="")
    if found is None:
        return None
    basis = found.basis
    if m.shard_read_p99 and m.shard_reads_per_second:
        need_rate = m.shard_reads_per_second * m.step_seconds / max(m.compute_mean, 1e-9)
        basis += ("; Little's law: %.3g reads/s x p99 %.3gs = %.2g reads in flight" % (
            need_rate, m.shard_read_p99, need_rate * m.shard_read_p99))
    return dataclasses.replace(found, basis=basis,
                               change=found.change + " (or prefetch/cache the shards locally)")


def in_order_false(m: Measured) -> Prediction | None:
    """slow_worker's fix: the DataLoader's queue replayed with each worker's own load
    times, in order (as now) and with in_order=False (fast workers take the slow one's
    share, the loop takes whichever batch is ready)."""
    if not m.worker_loads or len(m.worker_loads) < 2 or not len(m.compute):
        return None
    prefetch = m.prefetch or 2
    now = slow_worker.replay(list(m.worker_loads), m.compute, prefetch, True)
    wait = slow_worker.replay(list(m.worker_loads), m.compute, prefetch, False)
    step = m.compute_mean / max(1e-9, 1.0 - wait)
    return prediction("in_order=False", ProposedSettings(in_order=False), wait, step, m,
                   "the DataLoader's queue replayed with each of %d workers' load times: wait %.1f%% "
                   "in order, %.1f%% with in_order=False" % (len(m.worker_loads), 100 * now, 100 * wait),
                   "high" if min(len(x) for x in m.worker_loads) >= 20 else "medium",
                   removed_share=round(max(0.0, 1.0 - wait / now), 4) if now > 0 else 0.0)


LINK_MARGIN = 1.2  # the capacity asked for is the demand's plus a fifth: a link near full queues


def bandwidth(m: Measured) -> Prediction | None:
    """A faster link: the capacity at which the rank's share carries a batch per compute
    time, and the step the queue then makes (see the module's note)."""
    link = m.link
    if link is None or not link.saturated or not link.capacity or m.compute_mean <= 0:
        return None
    demand = link.bytes_per_batch / m.compute_mean  # bytes/s at the compute's pace
    capacity = demand / link.share * LINK_MARGIN
    capacity = math.ceil(capacity / 1e6) * 1e6 if capacity >= 1e6 else math.ceil(capacity)
    if capacity <= link.capacity:
        return None
    new_rate = link.rank_bytes_per_second * capacity / link.capacity
    workers_n = max(1, m.workers or 1)
    load, times = service_times(m)
    text = ("the loader reads %.3g MB a batch and got %.3g MB/s (%.0f%% of the link's %.3g MB/s at "
            "%.0f%% of capacity); at the compute's pace (%.3gs) it needs %.3g MB/s" % (
                link.bytes_per_batch / 1e6, link.rank_bytes_per_second / 1e6, 100 * link.share,
                link.capacity / 1e6, 100 * link.ratio, m.compute_mean, demand / 1e6))
    floor = cpu_floor(m, m.loader_cores)
    if load is not None and len(load) and len(m.compute):
        # each worker's batch: its link time at the old rate out (the W workers share R),
        # at the new in; what is left is its own work (decode, latency, handing over)
        link_time = workers_n * link.bytes_per_batch
        scaled = np.maximum(load - link_time / link.rank_bytes_per_second, 0.0) + link_time / new_rate
        wait, step = replay(scaled, m.compute, workers_n, m.prefetch or 2, floor, times=times)
        text += ("; replayed the DataLoader queue (%d workers) with each load time's link share "
                 "at the new rate" % workers_n)
        confidence = "medium"
    else:
        step = max(m.compute_mean, link.bytes_per_batch / new_rate, floor)
        wait = max(0.0, 1.0 - m.compute_mean / step)
        text += "; without the workers' load times, the step is the link's pace or the compute's"
        confidence = "low"
    return prediction("raise the link's capacity from %.3g to %.3g MB/s (or read fewer bytes a "
                      "batch, or cache them nearer the GPU)" % (link.capacity / 1e6, capacity / 1e6),
                      ProposedSettings(link_capacity_bytes_per_second=capacity), wait, step, m, text,
                      confidence,
                      rules_out=("num_workers",))


NO_CONFIG_FIX = {"too_few_workers": "cut the per-sample work",
                 "fuse_unhealthy": "remount the FUSE daemon and restart the rank",
                 "checkpoint_contention": "move checkpoint writes off the training data's storage",
                 "io_pressure": "move the other I/O off the node's data device",
                 "memory_pressure": "raise the memory limit or cut the loader's footprint",
                 "cpu_contention": "cut per-sample CPU work or the node's other load; more workers "
                                   "would share the same busy CPUs",
                 "transfer_cost": "pack each sample's tensors into one, or share them by file_system",
                 "cache_miss": "prewarm or resize the cache",
                 "storage_errors": "spread the keys over more prefixes or lower the request rate",
                 "unexplained": "sample the workers' stacks first"}


# cause -> its configuration fix's model (the others: what to fix and the headroom)
MODELS: dict[str, Callable[[Measured], Prediction | None]] = {
    "too_few_workers": workers, "cpu_throttle": cpu_limit, "storage_latency": storage,
    "shm_exhaustion": shm, "epoch_start": persistent, "slow_worker": in_order_false,
    "bandwidth_bound": bandwidth}
# causes whose fix is not more workers: a cpu_contention rank's CPUs are all busy, so more
# workers crowd them further (issue 29: its report led with "Raise num_workers")
NOT_WORKERS = frozenset({"cpu_contention", "transfer_cost"})


def for_cause(cause: str, m: Measured) -> Prediction:
    """The prediction for one cause, or for a cause without a configuration fix what
    to fix and the headroom (what fixing it fully would buy)."""
    model = MODELS.get(cause)
    found = model(m) if model is not None else None
    if found is not None:
        return dataclasses.replace(found, cause=cause)
    h = headroom(m)
    change = NO_CONFIG_FIX.get(cause, "no configuration fix modelled")
    basis = ("no model for a configuration change: the headroom (every wait gone) is the most a "
             "fix can buy")
    rules_out: tuple[str, ...] = ("num_workers",) if cause in NOT_WORKERS else ()
    if cause in ("too_few_workers", "storage_latency"):
        why = why_not_more_workers(m)
        if why is not None:  # measured: more workers will not keep up, or do not fit
            fit = m.memory_workers
            change += (": the pod's memory limit holds no more workers" if fit is not None and
                       m.workers is not None and m.workers >= fit else
                       ": on the CPU the workers get, more of them are not predicted to keep up")
            basis = why + "; " + basis
            rules_out = ("num_workers",)
    return Prediction(cause, change, NO_SETTINGS, 0.0, h.step_seconds_without_wait, h.speedup, basis,
                      "upper bound", rules_out=rules_out)
