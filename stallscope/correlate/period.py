"""Which batches stall, and how regularly: the dominant stall period in batches and seconds.

Periods are found in batch-index space, not time: a loader with W workers that are each
slower than W x compute stalls on every W-th batch whatever the timing jitter (each
worker's batch comes round in turn), and a checkpoint every N steps stalls every N
batches. Time jitter therefore does not matter; index jitter (a stall landing one batch
early or late) is absorbed by a tolerance, a missed stall by counting double gaps at
half weight, and random stalls find no candidate with enough support (period 0).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .trace import RankTrace

STALL_FLOOR_S = 0.002        # waits below this are prefetch noise, never a stall
STALL_COMPUTE_SHARE = 0.1    # ... or below 10% of the median compute time per batch
CONTINUOUS_SHARE = 0.8       # this share of batches stalling = every batch stalls
MIN_CLUSTERS = 4             # at least three full periods
MIN_SUPPORT = 0.6            # share of gaps that must fit the period
MAX_CANDIDATES = 24
ACF_BATCHES = 4096            # the latest batches are enough for an alternation
MAX_ACF_LAG = 64              # alternations longer than this are not a worker round
PRINCIPAL_SHARE = 0.3         # spikes above 30% of the typical large stall


@dataclasses.dataclass
class StallPeriod:
    stall_batches: int
    threshold_seconds: float
    period_steps: int = 0          # 0: no period; 1: every batch stalls
    period_seconds: float = 0.0
    support: float = 0.0           # share of inter-stall gaps that fit the period

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in dataclasses.asdict(self).items()}


def stall_threshold_ns(trace: RankTrace) -> int:
    return int(max(STALL_FLOOR_S * 1e9, STALL_COMPUTE_SHARE * trace.compute_ns()))


def stall_mask(trace: RankTrace) -> np.ndarray:
    return trace.wait > stall_threshold_ns(trace)


def _tolerance(p: int) -> int:
    return 0 if p <= 4 else (1 if p <= 12 else int(round(0.1 * p)))


def period_of(indices: ArrayLike) -> tuple[int, float]:
    """(period, support) of stall batch indices, or (0, best support) when none fits."""
    idx = np.asarray(indices, np.int64)
    if len(idx) < 2:
        return 0, 0.0
    # A stall spanning adjacent batches is one event: keep the first batch of each run.
    starts = idx[np.concatenate(([True], np.diff(idx) > 1))]
    if len(starts) < MIN_CLUSTERS:
        return 0, 0.0
    gaps = np.diff(starts)
    values, counts = np.unique(gaps, return_counts=True)
    cand = values[np.argsort(-counts, kind="stable")[:MAX_CANDIDATES]]
    cand = np.unique(np.concatenate((cand, [int(np.median(gaps))])))
    tol = np.array([_tolerance(int(p)) for p in cand])[:, None]
    g = gaps[None, :]
    one = np.abs(g - cand[:, None]) <= tol
    two = np.abs(g - 2 * cand[:, None]) <= 2 * tol
    support = (one.sum(1) + 0.5 * (two & ~one).sum(1)) / len(gaps)
    best = int(np.argmax(support))  # ties: the smallest period (cand is sorted)
    if support[best] < MIN_SUPPORT:
        return 0, float(support[best])
    # The window of a larger candidate can cover the true period (5 +- 1 covers 4):
    # the period is the median of the gaps inside the winning window.
    return int(round(float(np.median(gaps[one[best]])))), float(support[best])


def stall_period(trace: RankTrace, mask: np.ndarray | None = None,
                 steady: np.ndarray | None = None) -> StallPeriod:
    """``steady``: the mask of batches that start no iterator, when the caller has it."""
    thr = stall_threshold_ns(trace)
    if mask is None:  # an iterator's first batch waits for worker startup: not a stall
        mask = (trace.wait > thr) & (steady if steady is not None else trace.interval != trace.wait)
    n_stall = int(mask.sum())
    out = StallPeriod(stall_batches=n_stall, threshold_seconds=thr / 1e9)
    if trace.n < 2 * MIN_CLUSTERS or n_stall < MIN_CLUSTERS:
        return out
    if n_stall >= CONTINUOUS_SHARE * trace.n:
        # Every batch waits; a period can still show as spikes above the common level.
        w = trace.wait.astype(np.float64)
        med = np.median(w)
        mad = 1.4826 * np.median(np.abs(w - med))
        spikes = np.flatnonzero(w > med + max(4 * mad, 0.5 * med))
        p, support = period_of(spikes)
        if p:
            return _with_seconds(out, trace, spikes, p, support)
        # ... or as a regular alternation of long and short waits (workers out of step).
        recent = w[-ACF_BATCHES:]
        recent = np.minimum(recent, np.percentile(recent, 99))
        p = dominant_period(recent, max_lag=MAX_ACF_LAG)
        if p:
            out.period_steps, out.support = p, _acf_at(recent, p)
            out.period_seconds = float(np.median(trace.interval)) * p / 1e9
            return out
        out.period_steps, out.support = 1, n_stall / trace.n
        out.period_seconds = float(np.median(trace.interval)) / 1e9
        return out
    # The period is carried by the principal spikes; a small wait on the batch after a
    # spike (the next worker was nearly done) is a stall but not a new event.
    principal = mask & (trace.wait > PRINCIPAL_SHARE * np.percentile(trace.wait[mask], 90))
    idx = np.flatnonzero(principal)
    p, support = period_of(idx)
    out.support = support
    if p:
        return _with_seconds(out, trace, idx, p, support)
    return out


def _with_seconds(out: StallPeriod, trace: RankTrace, idx: np.ndarray, p: int, support: float) -> StallPeriod:
    starts = idx[np.concatenate(([True], np.diff(idx) > 1))]
    gaps = np.diff(starts)
    fit = np.abs(gaps - p) <= _tolerance(p)
    dt = np.diff(trace.t_end[starts])[fit]
    out.period_steps, out.support = p, support
    out.period_seconds = float(np.median(dt)) / 1e9 if len(dt) else 0.0
    return out


def _acf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64) - np.mean(x)
    n = len(x)
    size = 1 << int(2 * n - 1).bit_length()  # zero-padded to a power of two: no wrap-around
    f = np.fft.rfft(x, size)
    acf = np.fft.irfft(f * np.conj(f), size)[: n // 2]
    return acf / acf[0] if acf[0] > 0 else acf


def _acf_at(x: np.ndarray, lag: int) -> float:
    acf = _acf(x)
    return float(acf[lag]) if lag < len(acf) else 0.0


def dominant_period(x: np.ndarray, min_lag: int = 2, min_r: float = 0.3, max_lag: int | None = None) -> int:
    """Smallest lag whose autocorrelation is a local peak near the highest one; 0 if none."""
    x = np.asarray(x, np.float64) - np.mean(x)
    n = len(x)
    if n < 4 * min_lag or not np.any(x):
        return 0
    acf = _acf(x)
    if max_lag:
        acf = acf[: max_lag + 2]
    if len(acf) < min_lag + 2:
        return 0
    inner = acf[min_lag:-1]
    peaks = np.flatnonzero((inner >= acf[min_lag - 1:-2]) & (inner >= acf[min_lag + 1:]) & (inner >= min_r))
    if not len(peaks):
        return 0
    top = inner[peaks].max()
    return int(peaks[inner[peaks] >= 0.8 * top][0] + min_lag)
