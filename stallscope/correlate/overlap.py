"""Is the rank input-bound? Data-wait share of the step time, GPU-idle share, and how
much of the GPU's idle time overlaps the loop's data-wait.

GPU samples (NVML utilisation, DCGM SM-active or the lab's simulated GPU) are averages
over their sample interval, coarser than one batch, so the overlap inside one sample is
taken as ``min(idle, wait)``: the most of the idle time the waits could cover. Idle time
beyond the waits is "idle without data-wait": a loop blocked elsewhere, typically in a
collective waiting for a slower rank.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .trace import GPU_BUSY_SIGNALS, RankTrace, WaitIndex


@dataclasses.dataclass
class InputBound:
    batches: int
    data_wait_seconds: float
    step_seconds: float          # sum of intervals
    data_wait_ratio: float       # data_wait / step time (as the alert computes it)
    steady_data_wait_ratio: float  # the same without iterators' first batches
    iterator_starts: int         # first batches of an iterator (interval == wait)
    iterator_start_wait_seconds: float  # their wait: worker startup, first shard fetch
    compute_seconds: float       # median per batch of interval - wait
    # the share with the run's first batch left out, when the trace holds it (after_start)
    data_wait_ratio_after_start: float | None = None
    gpu_signal: str | None = None  # gpu_busy_ratio / gpu_sm_active_ratio when samples exist
    gpu_samples: int = 0
    gpu_idle_ratio: float | None = None
    gpu_idle_overlap_ratio: float | None = None  # share of GPU-idle time overlapping data-wait
    gpu_idle_without_wait_ratio: float | None = None  # idle time not covered by waits / time

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in dataclasses.asdict(self).items()}


def data_wait_ratio(trace: RankTrace) -> float:
    """Data-wait share of the step time, every batch counted (the first batch of each
    iterator too), as the alert computes it from the histograms and the verdict uses it."""
    step = float(trace.interval.sum())
    return float(trace.wait.sum()) / step if step > 0 else 0.0


def after_start(trace: RankTrace) -> float | None:
    """The data-wait share with the run's first batch left out (its workers' first start,
    paid once: no steady pace of the loader), or None when the trace does not hold that
    batch (trace.run_start). The verdict waits while only that batch puts the rank over
    the line (rules.RankWait.starting)."""
    i = trace.run_start()
    if i is None:
        return None
    step = float(trace.interval.sum()) - float(trace.interval[i])
    return (float(trace.wait.sum()) - float(trace.wait[i])) / step if step > 0 else None


def iterator_starts(trace: RankTrace) -> np.ndarray:
    """Mask of batches that start an iterator: the hook gives them interval == wait.
    Their wait is startup (workers spawning, a first shard fetched), not the loader's
    steady pace: the cause scores leave them out (the verdict counts them, as the alert does)."""
    starts: np.ndarray = trace.interval == trace.wait
    return starts


def steady_ratio(trace: RankTrace, starts: np.ndarray) -> float:
    """The data-wait share of the steady batches that arrived: an iterator's first batch
    (its workers' start-up) left out, and a call still blocked in next(), whose kind is
    not known until it ends (the agent's counters, which Prometheus reads, count a batch
    as it arrives: stallscope_steady_*_seconds_total)."""
    keep = ~starts & trace.settled()
    step = float(trace.interval[keep].sum())
    return float(trace.wait[keep].sum()) / step if step > 0 else 0.0


def input_bound(trace: RankTrace, wait_index: WaitIndex | None = None,
                starts: np.ndarray | None = None) -> InputBound:
    """``starts``: the iterator-start mask when the caller has it (correlate/context.py)."""
    wait_s = float(trace.wait.sum()) / 1e9
    step_s = float(trace.interval.sum()) / 1e9
    if starts is None:
        starts = iterator_starts(trace)
    start_wait = float(trace.wait[starts].sum()) / 1e9
    compute = np.maximum(trace.interval - trace.wait, 0)
    out = InputBound(batches=trace.n, data_wait_seconds=wait_s, step_seconds=step_s,
                     data_wait_ratio=wait_s / step_s if step_s > 0 else 0.0,
                     steady_data_wait_ratio=steady_ratio(trace, starts),
                     iterator_starts=int(starts.sum()), iterator_start_wait_seconds=start_wait,
                     compute_seconds=float(np.median(compute[~starts])) / 1e9
                     if (~starts).any() else 0.0,
                     data_wait_ratio_after_start=after_start(trace))
    name, gpu = trace.gpu(GPU_BUSY_SIGNALS)
    span = trace.span()
    if gpu is None or span is None:
        return out
    gpu = gpu.clip(*span)
    if len(gpu) < 2:
        return out
    wi = wait_index or WaitIndex(trace.t_end, trace.wait)
    dt = gpu.dt().astype(np.float64)
    idle = (1.0 - np.clip(gpu.v, 0.0, 1.0)) * dt
    waited = wi.per_sample(gpu)
    overlap = np.minimum(idle, waited)
    total, idle_sum, overlap_sum = dt.sum(), idle.sum(), overlap.sum()
    out.gpu_signal, out.gpu_samples = name, len(gpu)
    out.gpu_idle_ratio = float(idle_sum / total)
    out.gpu_idle_without_wait_ratio = float((idle_sum - overlap_sum) / total)
    # With (almost) no idle time the share is meaningless: report None, not 0/0 noise.
    out.gpu_idle_overlap_ratio = float(overlap_sum / idle_sum) if idle_sum > 0.01 * total else None
    return out
