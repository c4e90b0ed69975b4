"""``too_few_workers``: the loader is simply too slow for the compute, with nothing
outside it to blame.

With W workers each taking T_l per batch, the loader delivers one batch every T_l / W;
when that exceeds the compute time per batch T_c the loop waits about T_l / W - T_c per
batch, and, because the workers take batches in turn, the waits come every W batches.
The evidence:
1. the measured T_l (``batch_load_seconds`` from the workers) predicts the observed wait:
   on the means, T_l / W - T_c, or, when the load times vary, the in-order queue replayed
   with their spread (predict.replay; a costly batch holds up every later one, which the
   means hide: the ``variable-cost`` lab scenario); or, without it, the stalls come
   every W batches (any loader slower than the compute does that, so this alone is
   weaker evidence);
2. the stalls persist through the window: a structural shortfall does not come and go,
   while stalls in episodes mean something changed (a fault, recorded or not);
3. what the workers do while the loop stalls (``workers_cpu_ratio``, the CPU seconds
   per second of all workers together, divided here by their number): busy on the CPU is
   slow per-sample work, the clearest case; off the CPU they wait (a sleep, a network
   fetch), which more workers also overlap, unless a signal shows what they wait on.
Whatever the other causes explain is taken off: a throttled or I/O-starved worker is
slow too, and there the fix is elsewhere.
"""
from __future__ import annotations

import numpy as np

from ..report import UNREPORTED
from ..vocabulary import signal
from .causes import make
from .model import Cause, Evidence
from .period import StallPeriod
from .queue import replay
from .trace import RankTrace, Series, WaitIndex

WORKERS_CPU = signal("workers_cpu_ratio").name
BATCH_LOAD = signal("batch_load_seconds").name
WORKERS_ON_CPU = signal("loader_workers_on_cpu_ratio").name
WORKERS_CPU_WAIT = signal("loader_workers_cpu_wait_ratio").name
# CPU-bound workers short of CPU: runnable (on a CPU or waiting for one) at least half of
# their time, and waiting for one at least a fifth of that (a sleeping loader is neither:
# 1 % on a CPU and 0.4 % waiting read as short, the Lightning run of make test-frameworks)
RUNNABLE_LINE = 0.5
STARVED_LINE = 0.2


def starved(split: tuple[float, float] | None) -> bool:
    return split is not None and sum(split) >= RUNNABLE_LINE and split[1] >= STARVED_LINE * sum(split)
# What the loader-state sampler measured the workers doing (exporters/loaderstate.py)
OFF_CPU_STATES = (("storage", "blocked reading storage"), ("network", "blocked on the network"),
                  ("idle", "idle, waiting for work"))

BUSY_LOW, BUSY_HIGH = 0.3, 0.7   # workers' CPU share: idle-ish .. clearly busy
FED_LOW, FED_HIGH = 0.5, 0.8     # workers' CPU share that starts/ends contradicting a shortage
OFF_CPU = 0.75                   # factor for workers off the CPU, or CPU use unknown
PERIOD_WEIGHT = 0.9              # a matching period alone is slightly weaker evidence
REPLAY_MIN = 8                   # load samples below which the queue is judged on the means
ROUNDS_PER_SEGMENT = 4           # persistence: segments of ~4 worker rounds, 5..40 of them


def _mean(series: Series, span: tuple[int, int], wait_index: WaitIndex | None = None) -> float | None:
    """Time-weighted mean over the span, or wait-weighted ("during stalls") when a
    wait index is given and there was any waiting."""
    s = series.clip(*span)
    if not len(s):
        return None
    dt = s.dt()
    weight = dt.astype(np.float64)
    if wait_index is not None:
        waited = wait_index.per_sample(s)
        if waited.sum() > 0:
            weight = waited
    return float((s.v * weight).sum() / weight.sum())


def persistence(trace: RankTrace, workers: int | None = 1) -> float:
    """Share of the window's segments whose data-wait share is at least half the
    window's: ~1 for a steady shortfall, the episodes' share for intermittent stalls."""
    segments = int(np.clip(trace.n // (ROUNDS_PER_SEGMENT * max(workers or 1, 1)), 5, 40))
    edges = np.linspace(trace.t_end[0], trace.t_end[-1] + 1, segments + 1).astype(np.int64)
    k = np.searchsorted(trace.t_end, edges)
    wait = np.add.reduceat(trace.wait, k[:-1]) if len(trace.wait) else np.zeros(segments)
    step = np.add.reduceat(trace.interval, k[:-1]) if len(trace.wait) else np.zeros(segments)
    empty = k[:-1] >= k[1:]
    ratio = np.where(empty | (step <= 0), 0.0, wait / np.maximum(step, 1))
    overall = trace.wait.sum() / max(trace.interval.sum(), 1)
    return float(np.mean(ratio >= 0.5 * overall)) if overall > 0 else 0.0


def _queued_wait(trace: RankTrace, load: np.ndarray, steady: np.ndarray, workers: int) -> float:
    """Mean wait a batch of the DataLoader's queue replayed with the measured load and
    compute samples (predict.replay): unlike T_l / W - T_c on the means, it counts the
    head-of-line blocking of in-order delivery when load times vary. 0 with too few samples."""
    if len(load) < REPLAY_MIN or steady.sum() < REPLAY_MIN:
        return 0.0
    compute = np.maximum(trace.interval[steady] - trace.wait[steady], 0) / 1e9
    prefetch = (trace.loader or UNREPORTED).prefetch_factor or 2
    share, step = replay(np.asarray(load, float), compute, workers, prefetch)
    return share * step


def busy_share(trace: RankTrace, wait_index: WaitIndex) -> tuple[str | None, float | None]:
    """(scope, each worker's CPU share during the stalls) or (None, None)."""
    workers = (trace.loader or UNREPORTED).num_workers
    scope, busy = trace.signal(WORKERS_CPU, ("rank",))
    span = trace.span()
    if busy is None or not workers or span is None:
        return None, None
    mean = _mean(busy, span, wait_index)
    return (scope, mean / workers) if mean is not None else (None, None)  # summed over workers


def busy_factor(share: float) -> float:
    """0 for workers mostly off the CPU .. 1 for workers busy on it."""
    return float(np.clip((share - BUSY_LOW) / (BUSY_HIGH - BUSY_LOW), 0.0, 1.0))


def runnable_split(trace: RankTrace, wait_index: WaitIndex) -> tuple[float, float] | None:
    """(on a CPU, waiting for one): the loader-state sampler's shares of the workers' time
    during the stalls, or None where it did not run."""
    span = trace.span()
    _, on = trace.signal(WORKERS_ON_CPU, ("rank",))
    _, waiting = trace.signal(WORKERS_CPU_WAIT, ("rank",))
    if span is None or on is None or waiting is None:
        return None
    a, b = _mean(on, span, wait_index), _mean(waiting, span, wait_index)
    return None if a is None or b is None else (a, b)


def contradict_cpu_shortage(cause: Cause, share: float | None,
                            split: tuple[float, float] | None = None) -> Cause:
    """Workers that ran on their cores during the stalls were not starved of CPU: take
    that share off a cpu_throttle score (the pressure or throttling hit other tasks).
    With the sampler's ``split`` the share is of the time they could run: 4 workers on 2
    busy cores each run half the time and wait the other half, starved, not fed (issue
    30: their CPU share alone, 47 %, took the node's crowding off the list)."""
    if cause.cause not in ("cpu_throttle", "cpu_contention"):
        return cause
    if split is not None and split[0] + split[1] > 0:
        fed = split[0] / (split[0] + split[1])
        note = (" But the loader workers ran %.0f%% of the time they could run during the stalls, "
                "so they were not starved." % (100 * fed))
        row = Evidence("loader_workers_on_cpu_ratio / runnable", round(fed, 4), FED_LOW, "below")
    elif share is not None:
        fed = share
        note = (" But the loader workers ran %.0f%% of the time on a core during the stalls, so they "
                "were not starved." % (100 * share))
        row = Evidence("workers_cpu_ratio / num_workers", round(share, 4), FED_LOW, "below")
    else:
        return cause
    f = float(np.clip((fed - FED_LOW) / (FED_HIGH - FED_LOW), 0.0, 1.0))
    if f <= 0:
        return cause
    return cause.with_score(cause.score * (1.0 - f), note, row)


def cpu_short(trace: RankTrace, wait_index: WaitIndex, compute_s: float,
              runnable: tuple[float, float] | None = None) -> tuple[float, str] | None:
    """How much of the loader's lateness its workers' CPU shortage explains, with the
    sentence that says so (issue 30: a CPU-bound loader on a node without spare CPU was
    told to add workers). The sampler measured them running ``on`` and waiting for a CPU
    ``wait`` of their time during the stalls; had they run whenever they could, each
    would have taken on / (on + wait) of its measured batch load time. The wait left at
    that pace against the compute is what the shortage does not explain. None: no
    sampler, no load times, or workers not short of CPU."""
    # ``runnable``: runnable_split's answer when the caller has it (the Context's)
    split = runnable if runnable is not None else runnable_split(trace, wait_index)
    workers = (trace.loader or UNREPORTED).num_workers
    span = trace.span()
    _, load = trace.signal(BATCH_LOAD, ("rank",))
    if split is None or not workers or span is None or load is None:
        return None
    if not starved(split):
        return None
    on, waiting = split
    recent = load.clip(*span)
    if not len(recent):
        return None
    per_batch = float(recent.v.mean()) / workers
    late = per_batch - compute_s
    if late <= 0:
        return None
    fed = per_batch * on / (on + waiting)
    explained = 1.0 - max(0.0, fed - compute_s) / late
    text = ("The loader's %d workers waited for a CPU %.0f%% of their time during the stalls and ran "
            "%.0f%%: they deliver a batch every %.3gs against %.3gs of compute, and would every "
            "%.3gs had they run whenever they could" % (
                workers, 100 * waiting, 100 * on, per_batch, compute_s, fed))
    return explained, text


def _off_cpu_split(trace: RankTrace, span: tuple[int, int], wait_index: WaitIndex) -> str:
    """What the workers were measured doing during the stalls, in words: each off-CPU
    state's share of their time ("" when the sampler did not run)."""
    shares = []
    for state, words in OFF_CPU_STATES:
        _, series = trace.signal(signal("loader_workers_%s_ratio" % state).name, ("rank",))
        value = _mean(series, span, wait_index) if series is not None else None
        if value is not None:
            shares.append((value, words))
    if not shares:
        return ""
    told = ", ".join("%s %.0f%%" % (w, 100 * v) for v, w in sorted(shares, reverse=True) if v >= 0.05)
    return "%s of their time during the stalls (the rest in sleeps, handing batches over or other " \
        "calls)" % (told or "in none of storage, network or idle for 5%")


def score(trace: RankTrace, period: StallPeriod, others_best: float = 0.0,
          wait_index: WaitIndex | None = None, steady: np.ndarray | None = None,
          measured: tuple[tuple[str | None, float | None], tuple[float, float] | None] | None = None
          ) -> Cause | None:
    """The too_few_workers Cause, or None when nothing bears on it. ``steady``: the mask
    of batches that start no iterator, when the caller has it (correlate/context.py)."""
    workers = (trace.loader or UNREPORTED).num_workers
    span = trace.span()
    if span is None or trace.n < 2:
        return None
    wi = wait_index or WaitIndex(trace.t_end, trace.wait)
    compute = trace.compute_ns() / 1e9
    # the steady batches' mean wait: an iterator's first batch waits for its workers to
    # start (epoch_start's share), not for a loader too slow for the compute
    if steady is None:
        steady = trace.interval != trace.wait
    mean_wait = float(trace.wait[steady].mean() if steady.any() else trace.wait.mean()) / 1e9
    evidence: list[Evidence] = []
    reasons: list[str] = []
    base = 0.0
    if workers == 0:
        base = 1.0
        reasons.append("num_workers=0 loads every batch inside the training loop")
        evidence.append(Evidence("num_workers", 0, 1, "below"))
    elif workers:
        scope, load = trace.signal(BATCH_LOAD, ("rank",))
        # one sample per batch a worker produced (stallscope/agent/parts/loader.py): a plain mean
        recent = load.clip(*span) if load is not None else None
        t_load = float(recent.v.mean()) if recent is not None and len(recent) else None
        if recent is not None and t_load is not None:
            per_batch = t_load / workers
            predicted = max(0.0, per_batch - compute)
            queued = _queued_wait(trace, recent.v, steady, workers)
            if queued > predicted:
                predicted = queued
                reasons.append("replayed in order with the measured spread of load times (%.0f%%), "
                               "the queue waits %.3gs a batch: a slow batch holds up those behind it"
                               % (100 * float(np.std(recent.v) / max(t_load, 1e-12)), queued))
            base = min(1.0, predicted / mean_wait) if mean_wait > 0 else 0.0
            evidence.append(Evidence("batch_load_seconds / num_workers", round(per_batch, 6),
                                     round(compute, 6), "above", None, scope, round(base, 4)))
            if predicted > 0:
                reasons.append("%s takes %.3gs per batch, one batch every %.3gs against %.3gs of "
                               "compute" % ("its one worker" if workers == 1 else
                                            "each of the %d workers" % workers, t_load, per_batch, compute))
        if workers >= 2 and period.period_steps:
            if period.period_steps == workers:
                base = max(base, PERIOD_WEIGHT * period.support)
                reasons.append("the loop stalls every %d batches, once per worker round of %.3gs "
                               "against %.3gs of compute per round" % (
                                   workers, period.period_seconds, workers * compute))
            evidence.append(Evidence("stall_period_steps", period.period_steps, workers, "equal"))
    if not evidence:
        return None
    lasting = persistence(trace, workers)
    evidence.append(Evidence("stall_persistence", round(lasting, 3), 0.7, "above"))
    if lasting < 0.7:
        reasons.append("but the stalls come and go (in %.0f%% of the window), so something "
                       "changed over time" % (100 * lasting))
    # ``measured``: (busy_share, runnable_split) when the caller has them (the Context's)
    (scope, busy_mean), split = measured if measured is not None else (
        busy_share(trace, wi), runnable_split(trace, wi))
    if busy_mean is None:
        factor = OFF_CPU
    else:
        factor = OFF_CPU + (1.0 - OFF_CPU) * busy_factor(busy_mean)
        evidence.append(Evidence("workers_cpu_ratio / num_workers", round(busy_mean, 4),
                                 BUSY_HIGH, "above", None, scope))
        if split is not None and starved(split):
            # runnable, not off the CPU: the sampler saw them wait for one (cpu_short)
            reasons.append("the workers ran on a CPU %.0f%% and waited for one %.0f%% of their "
                           "time: short of CPU, which more of them would share" % (
                               100 * split[0], 100 * split[1]))
        elif busy_mean >= BUSY_HIGH:
            reasons.append("the workers are busy on the CPU (%.0f%%): slow per-sample work"
                           % (100 * busy_mean))
        elif base:
            found = _off_cpu_split(trace, span, wi)
            if found:
                reasons.append("the workers are mostly off the CPU (%.0f%%); the loader-state "
                               "sampler found them %s" % (100 * busy_mean, found))
            else:
                reasons.append("the workers are mostly off the CPU (%.0f%%): they wait on "
                               "something no signal shows (a sleep, a network fetch)" % (100 * busy_mean))
    value = base * factor * min(1.0, lasting / 0.7) * (1.0 - 0.5 * others_best)
    if reasons:
        text = "The loader is too slow for the compute: %s." % "; ".join(reasons)
        if value >= 0.5:
            text += " More workers or cheaper per-sample work would close the gap."
    else:
        text = "No sign that the workers are too few: the stall period and load times do not fit."
    return make("too_few_workers", value, text, evidence)
