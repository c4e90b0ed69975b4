"""``too_few_workers``: the loader is simply too slow for the compute, with nothing
outside it to blame.

With W workers each taking T_l per batch, the loader delivers one batch every T_l / W;
when that exceeds the compute time per batch T_c the loop waits about T_l / W - T_c per
batch, and, because the workers take batches in turn, the waits come every W batches.
The evidence is therefore (1) the measured T_l (``batch_load_seconds`` from the
workers) predicting the observed wait, (2) a stall period of exactly W, and (3) the
workers being busy on the CPU (``workers_cpu_ratio``): slow per-sample work, not waiting
on storage or a throttled quota. Whatever the other causes explain is taken off, since
a throttled or I/O-starved worker is slow too, and there the fix is elsewhere.
"""
import numpy as np

BUSY_LOW, BUSY_HIGH = 0.3, 0.7   # workers' CPU share: idle-ish .. clearly busy
NO_CPU_SIGNAL = 0.75             # factor when the workers' CPU use is unknown
PERIOD_WEIGHT = 0.9              # a matching period alone is slightly weaker evidence


def _time_mean(series, span):
    s = series.clip(*span)
    if not len(s):
        return None
    dt = s.dt().astype(np.float64)
    return float((s.v * dt).sum() / dt.sum())


def score(trace, period, others_best=0.0):
    """{cause, score, summary, evidence} or None when nothing bears on it."""
    loader = trace.loader or {}
    workers = loader.get("num_workers")
    span = trace.span()
    if span is None or not trace.n:
        return None
    compute = float(np.median(np.maximum(trace.interval - trace.wait, 0))) / 1e9
    mean_wait = float(trace.wait.mean()) / 1e9
    evidence, reasons = [], []
    throughput = 0.0
    if workers == 0:
        throughput = 1.0
        reasons.append("num_workers=0 loads every batch inside the training loop")
        evidence.append({"signal": "num_workers", "during_stalls": 0, "outside_stalls": None,
                         "threshold": 1, "direction": "below"})
    else:
        scope, load = trace.signal("batch_load_seconds", ("rank",))
        t_load = _time_mean(load, span) if load is not None else None
        if t_load is not None and workers:
            per_batch = t_load / workers
            predicted = max(0.0, per_batch - compute)
            throughput = min(1.0, predicted / mean_wait) if mean_wait > 0 else 0.0
            evidence.append({"signal": "batch_load_seconds / num_workers", "scope": scope,
                             "during_stalls": round(per_batch, 6), "outside_stalls": None,
                             "threshold": round(compute, 6), "direction": "above",
                             "explained_wait_share": round(throughput, 4)})
            if predicted > 0:
                reasons.append("each of the %d workers takes %.3gs per batch, one batch every "
                               "%.3gs against %.3gs of compute" % (workers, t_load, per_batch, compute))
    period_fit = 0.0
    if workers and workers >= 2 and period.period_steps:
        if period.period_steps == workers:
            period_fit = period.support
            reasons.append("the loop stalls every %d batches, once per worker round" % workers)
        evidence.append({"signal": "stall_period_steps", "during_stalls": period.period_steps,
                         "outside_stalls": None, "threshold": workers, "direction": "equal"})
    base = max(throughput, PERIOD_WEIGHT * period_fit)
    if not evidence:
        return None
    scope, busy = trace.signal("workers_cpu_ratio", ("rank",))
    busy_mean = _time_mean(busy, span) if busy is not None else None
    if busy_mean is None:
        factor = NO_CPU_SIGNAL
    else:
        factor = float(np.clip((busy_mean - BUSY_LOW) / (BUSY_HIGH - BUSY_LOW), 0.0, 1.0))
        evidence.append({"signal": "workers_cpu_ratio", "scope": scope,
                         "during_stalls": round(busy_mean, 4), "outside_stalls": None,
                         "threshold": BUSY_HIGH, "direction": "above"})
        if busy_mean >= BUSY_HIGH:
            reasons.append("the workers are busy on the CPU (%.0f%%)" % (100 * busy_mean))
        elif base:
            reasons.append("but the workers are mostly off the CPU (%.0f%%), waiting on "
                           "something else" % (100 * busy_mean))
    value = base * factor * (1.0 - 0.5 * others_best)
    if reasons:
        text = "The loader is too slow for the compute: %s." % "; ".join(reasons)
        if value >= 0.5:
            text += " More workers or cheaper per-sample work would close the gap."
    else:
        text = "No sign that the workers are too few: the stall period and load times do not fit."
    return {"cause": "too_few_workers", "score": round(value, 4), "summary": text[0].upper() + text[1:],
            "evidence": evidence}
