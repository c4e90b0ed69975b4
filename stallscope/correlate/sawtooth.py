"""Do the GPU's dips line up with the loader's stalls? A score and the lag that aligns them.

On the GPU's own sample grid, the loop's data-wait share of each sample interval is
correlated (Pearson) with the GPU's idle share (1 - SM active, or 1 - busy) at lags of
up to a few seconds either way; the best lag absorbs the offset between the hook's
clock and the GPU sampler's averaging window. The GPU dips' own period (from their
autocorrelation) is compared with the stall period in seconds.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .period import dominant_period
from .trace import GPU_BUSY_SIGNALS, RankTrace, Series, WaitIndex

MIN_SAMPLES = 16
MAX_SAMPLES = 4096   # the latest ~7 min at 10 Hz: alignment needs no more, and it bounds cost
MAX_LAG_S = 3.0
PERIOD_MATCH = 0.2   # relative difference at which two periods still "match"


@dataclasses.dataclass
class Sawtooth:
    signal: str | None = None
    samples: int = 0
    score: float | None = None         # best correlation, clipped to [0, 1]
    lag_seconds: float | None = None     # > 0: GPU dips trail the stalls
    gpu_period_seconds: float = 0.0
    stall_period_seconds: float = 0.0
    period_match: bool | None = None
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in dataclasses.asdict(self).items()}


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else 0.0


def sawtooth(trace: RankTrace, stall_period_seconds: float = 0.0, wait_index: WaitIndex | None = None,
             stall_batches: int | None = None) -> Sawtooth:
    out = Sawtooth(stall_period_seconds=stall_period_seconds)
    if stall_batches == 0:
        out.note = "no stalls in the window to line up with"
        return out
    name, gpu = trace.gpu(GPU_BUSY_SIGNALS[::-1])
    span = trace.span()
    if gpu is None or span is None:
        out.note = "no GPU samples for this rank"
        return out
    gpu = gpu.clip(*span)
    if len(gpu) > MAX_SAMPLES:
        gpu = Series(gpu.t[-MAX_SAMPLES:], gpu.v[-MAX_SAMPLES:])
    out.signal, out.samples = name, len(gpu)
    if len(gpu) < MIN_SAMPLES:
        out.note = "too few GPU samples in the window"
        return out
    wi = wait_index or WaitIndex(trace.t_end, trace.wait)
    dt = gpu.dt()
    frac = wi.per_sample(gpu) / dt
    dip = 1.0 - np.clip(gpu.v, 0.0, 1.0)
    step_s = float(np.median(dt)) / 1e9
    if frac.std() < 1e-6 or dip.std() < 1e-6:
        out.note = "no variation in data-wait or GPU activity to align"
        out.score = 0.0
        return out
    max_lag = int(min(len(gpu) // 4, max(1, MAX_LAG_S / step_s)))
    best_r, best_k = -2.0, 0
    for k in sorted(range(-max_lag, max_lag + 1), key=abs):
        a, b = (frac[: len(frac) - k], dip[k:]) if k >= 0 else (frac[-k:], dip[: len(dip) + k])
        r = _corr(a, b)
        if r > best_r + 1e-9:
            best_r, best_k = r, k
    out.score = max(0.0, min(1.0, best_r))
    out.lag_seconds = best_k * step_s
    p = dominant_period(dip)
    out.gpu_period_seconds = p * step_s
    if stall_period_seconds and stall_period_seconds < 2 * step_s:
        out.note = "GPU samples (every %.3gs) are too coarse to resolve a %.3gs stall period" % (
            step_s, stall_period_seconds)
    elif stall_period_seconds and p:
        out.period_match = abs(out.gpu_period_seconds - stall_period_seconds) <= (
            PERIOD_MATCH * stall_period_seconds)
    return out
