"""The CPU limit that stops a loader's throttling (cpu_throttle's fix; issue 17), for
predict.py.

Workers need C CPU-seconds per batch (their measured CPU rate x the interval between
batches; this holds throttled or not, since throttling stretches the wall time, not the
work). Under a quota of Q cores the loader cannot deliver faster than one batch per C /
Q, whatever W. When that floor is above the compute, more workers buy nothing: the
change is a CPU limit. Which limit: the same replay, searched over Q, with each batch's
load time less the share of it the quota held the worker back (the cgroup's throttled
seconds per worker); what the node's other tasks took from the workers (their run-queue
wait beyond the throttling) stays in the load times, since a larger limit does not give
that back. So the margin over C / T_c is what the measured spread and crowding need, not
a fixed factor; where no limit reaches the target with these workers, the workers are
raised too, and where nothing does (a crowded node), the prediction says what wait
remains.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .model import Prediction, ProposedSettings
from .queue import CROWDED, MAIN_CORE, MAX_WORKERS, TARGET, Measured, prediction, replay

CPU_MARGIN = 1.25                # over the mean CPU demand, only without per-batch load times
LIMIT_STEP = 0.05                # cores: a CPU limit is named to this step
LIMIT_SPAN = 4.0                 # a limit is searched up to this many times the mean demand
HELD_BACK_MIN = 0.02             # a quota that holds the workers back less is not what slows them


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


def limit_search(m: Measured, load: np.ndarray, workers: int,
                 only_target: bool = False) -> tuple[float, float, float]:
    """(loader cores, wait, step): the smallest loader CPU (in LIMIT_STEP) whose replay
    with ``workers`` waits no more than TARGET, or, if none up to LIMIT_SPAN x the mean
    demand does, the smallest within TARGET of the best reachable wait. ``only_target``:
    a caller that wants only a limit reaching TARGET gets the top of the grid's figures
    at once where even that does not (one replay, not a bisection: the search over more
    workers for cpu_throttle was most of the correlator benchmark's time)."""
    c, prefetch = m.cpu_per_batch, m.prefetch or 2
    assert c is not None  # the callers return first when the workers' CPU was not measured
    lo = max(1, math.ceil(c / m.compute_mean / LIMIT_STEP - 1e-9))  # the mean demand: no less
    hi = max(lo + 1, math.ceil(LIMIT_SPAN * c / m.compute_mean / LIMIT_STEP))
    # the node's share caps only workers beyond the current ones: theirs is in their load times
    node = (m.node_cores or math.inf) if workers > (m.workers or 1) else math.inf

    def at(k: int) -> tuple[float, float]:
        return replay(load, m.compute, workers, prefetch, c / min(k * LIMIT_STEP, node), times=m.load_times)
    top_wait, top_step = at(hi)
    if only_target and top_wait > TARGET:
        return hi * LIMIT_STEP, top_wait, top_step
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
    return _loader_limit(limit_search(m, load, m.workers or 1)[0], m)  # workers > 0: load is not None


def cpu_limit(m: Measured, basis: str = "", capped_workers: int | None = None) -> Prediction | None:
    """The CPU limit at which the loader stops being throttled: the replay searched over
    the limit, with the load times the quota did not stretch (module docstring)."""
    c = m.cpu_per_batch
    if not c or m.compute_mean <= 0:
        return None
    if m.held_back is not None and m.held_back < HELD_BACK_MIN:
        return None  # the quota does not hold the workers back now: a limit buys nothing
    load = unthrottled_load(m)
    w = m.workers or 1
    more_workers_too: int | None = None  # these workers cannot keep up unthrottled: more too
    if load is None:
        cores = CPU_MARGIN * c / m.compute_mean
        step = max(m.compute_mean, c / cores)
        wait = 1 - m.compute_mean / step
        how = "a %.0f%% margin over the mean demand (no per-batch load times)" % (100 * (CPU_MARGIN - 1))
    else:
        cores, wait, step = limit_search(m, load, w)
        node_bound = m.node_cores is not None and c / m.node_cores > m.compute_mean * (1 - TARGET)
        if wait > TARGET and not node_bound:  # these workers cannot keep up unthrottled: more too
            for more_workers in range(w + 1, min(MAX_WORKERS, 4 * w) + 1):
                k, wt, st = limit_search(m, load, more_workers, only_target=True)
                if wt <= TARGET:
                    cores, wait, step, w = k, wt, st, more_workers
                    more_workers_too = more_workers
                    break
        how = ("the replay of the queue (%d workers, the measured spread) under the limit, with "
               "the load times less the %.0f%% the quota held each worker back" % (
                   w, 100 * (m.held_back or 0.0)))
    limit = _loader_limit(cores, m)
    settings = ProposedSettings(cpu_limit_cores=limit, num_workers=more_workers_too)
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
        more["rules_out"] = ("num_workers",)  # more workers share the same capped CPU
    change = "raise the CPU limit to %.3g cores" % limit
    if settings.num_workers is not None:
        change += " and num_workers from %d to %d" % (m.workers or 1, settings.num_workers)
    if capped_workers is not None:
        change += " (more workers alone would not help)"
    return prediction(change, settings, wait, step, m, (basis + "; " if basis else "") + text,
                   "medium", **more)
