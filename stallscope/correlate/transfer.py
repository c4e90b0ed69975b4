"""``transfer_cost``: the loop waits, but not for its workers.

The hook splits each wait in ``next()`` (hook/transfer.py) into the time spent waiting for
a worker's batch to be ready (``ready_wait``: the loader's queue was empty) and the rest,
the *transfer*: receiving the batch's bytes, unpickling it (for every tensor a shared
memory file descriptor taken over from the worker), pinning it, and the loader's own
bookkeeping in the loop. Slow workers, a throttled quota or slow storage make the loop
wait for ready batches; a per-batch transfer cost remains however fast the workers are.

The score is the transfer's share of the steady wait (iterator starts left out), over the
batches whose wait was split: measured, not inferred, so it needs no co-occurrence. The
evidence: that share, the transfer's and the ready wait's shares of the step time, and
the transfer per batch.

Handing a batch over takes the workers' CPU too: the training process takes each
tensor's file descriptor from the worker's resource-sharer thread, and a worker's
feeder thread sends the batch's bytes. Workers starved of CPU (a CFS quota, crowded
CPUs) stretch the transfer as well: the lab's cpu-throttle run measured 91 % of its wait
as transfer, 0.1 s a batch, against a few ms unthrottled. So the score is discounted by the
``cpu_throttle`` score (after the workers' own CPU share contradicted it, or not): there,
more CPU quota is the fix.
"""
from __future__ import annotations

import numpy as np

from ..vocabulary import DATA_WAIT_LINE, line_of
from .causes import make
from .model import Cause, Evidence
from .trace import RankTrace

NAME = "transfer_cost"
SHARE = line_of(NAME, "transfer_wait_ratio")   # most of the wait


def split(trace: RankTrace, steady: np.ndarray) -> tuple[int, float, float, float, float] | None:
    """(batches, wait, ready wait, transfer, step) in ns over the steady batches whose
    wait was split, or None when there are none."""
    known = steady & (trace.ready >= 0)
    if not known.any():
        return None
    wait = trace.wait[known]
    ready = np.minimum(trace.ready[known], wait)
    return (int(known.sum()), float(wait.sum()), float(ready.sum()),
            float((wait - ready).sum()), float(trace.interval[known].sum()))


def handoff_ratio(trace: RankTrace) -> float | None:
    """The share of the step time the loop spent handing batches over (each split wait
    less its ready wait), over every batch as the data-wait share counts them and as
    Prometheus has it (rate of stallscope_data_transfer_seconds_total over the step's);
    None when the hook split no wait."""
    known = trace.ready >= 0
    step = float(trace.interval.sum())
    if not known.any() or step <= 0:
        return None
    wait = trace.wait[known]
    return float((wait - np.minimum(trace.ready[known], wait)).sum()) / step


def score(trace: RankTrace, steady: np.ndarray, starved: float = 0.0, consumer: bool = False,
          found: tuple[int, float, float, float, float] | None = None) -> Cause | None:
    """The transfer_cost Cause, or None when the hook did not split the waits
    (a single-process loader, another iterable, an older hook). ``starved``: how sure it
    is that a side of the handoff was short of CPU: the workers (the CPU causes' score)
    or, with ``consumer``, the training process (consumer.held_share). ``found``: the
    split when the caller has it (the Context's)."""
    found = found if found is not None else split(trace, steady)
    if found is None:
        return None
    n, wait, ready, moved, step = found
    if wait <= 0 or step <= 0:
        return None
    share = moved / wait
    ratio, ready_ratio = moved / step, ready / step
    per_batch = moved / n / 1e9
    evidence = [
        Evidence(SHARE.signal, round(share, 4), SHARE.threshold, "above", None, "rank",
                 round(share, 4), samples=n, judged_by="measured"),
        Evidence("transfer_ratio", round(ratio, 6), DATA_WAIT_LINE, "above", None, "rank"),
        Evidence("ready_wait_ratio", round(ready_ratio, 6), DATA_WAIT_LINE, "above", None, "rank"),
        Evidence("transfer_seconds_per_batch", round(per_batch, 6), None, "above", None, "rank"),
    ]
    text = ("%.0f%% of the data-wait (%.3gs a batch, %.1f%% of the step time) went to getting each "
            "batch from the workers into the loop (receive, unpickle, pin, the loader's "
            "bookkeeping); %.1f%% of the step time was spent waiting for a worker's batch to be "
            "ready." % (100 * share, per_batch, 100 * ratio, 100 * ready_ratio))
    if share >= SHARE.threshold and starved < 0.5:
        text += (" More workers or faster storage would not remove it: fewer tensors per batch "
                 "or fewer, larger transfers would.")
    if ratio >= DATA_WAIT_LINE:
        text += " The transfer alone is over the %.0f%% data-wait line." % (100 * DATA_WAIT_LINE)
    value = share
    if starved > 0 and consumer:
        value = share * (1.0 - starved)
        text += (" But the training process was short of CPU (its main thread waited for one, its "
                 "workers did not): %.0f%% of this waited on its CPU, not on the handoff itself."
                 % (100 * starved))
    elif starved > 0:
        value = share * (1.0 - starved)
        text += (" But the workers were short of CPU (the CPU cause scored %.2f), and handing a "
                 "batch's tensors over takes their CPU too: part of this waited on them." % starved)
        evidence.append(Evidence("cpu_throttle_score", round(starved, 4), None, "below", None, "rank"))
    return make(NAME, value, text, evidence)
