"""Proof afterwards (issue 17): when a rank's loader settings (or the CPU quota over it)
change, the agent marks the moment; the diagnosis then shows the rank's data-wait and
step time before -> after it, beside the prediction made before the change.

Before and after are the steady batches on each side of the new settings' first batch
(an iterator's first batch, and the new workers' first round, wait for the workers to
start: that is epoch_start's, not the new settings' steady pace)."""
from __future__ import annotations

import time

import numpy as np

from ..report import LoaderSettings
from ..vocabulary import DATA_WAIT_LINE
from .model import Change, Mark, Prediction, Stats, WatchedSettings
from .overlap import iterator_starts
from .trace import RankTrace

MIN_AFTER = 5   # fewer steady batches after the change: "after" is not measured yet


def settings_of(loader: LoaderSettings | None, quota_cores: float | None) -> WatchedSettings:
    """The watched settings of a rank's loader and the quota over it, as a Mark keeps them."""
    if loader is None:
        return WatchedSettings(cpu_quota_cores=quota_cores)
    return WatchedSettings(loader.num_workers, loader.prefetch_factor, loader.persistent_workers,
                           loader.pin_memory, loader.batch_size, quota_cores)


def mark(old: WatchedSettings, new: WatchedSettings, at_ns: int, prediction: Prediction | None) -> Mark:
    was = dict(old.items())
    what = ", ".join("%s %s -> %s" % (k, was[k], v) for k, v in new.items() if was[k] != v)
    return Mark(int(at_ns), time.strftime("%H:%M:%S"), what, old, new, prediction)


def _stats(trace: RankTrace, keep: np.ndarray) -> Stats | None:
    keep = keep & ~iterator_starts(trace)
    n = int(keep.sum())
    if n < MIN_AFTER:
        return None
    interval, wait = trace.interval[keep], trace.wait[keep]
    return Stats(n, round(float(wait.sum() / interval.sum()), 6), round(float(interval.mean()) / 1e9, 6))


def _split(marked: Mark, trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(before, after) masks. The mark's time is the agent's previous look, up to a
    second before the change: the batches between it and the new settings' first one
    are the old settings', so the split is at the first iterator start after the mark
    (a loader's settings change only with a new iterator). After it, the new workers'
    first round (one batch from each, started together) is their start-up, not the
    steady pace the prediction is about: on a loaded machine forking 8 workers took
    seconds, a fifth of a short "after"."""
    n = len(trace.t_end)
    starts = np.flatnonzero(iterator_starts(trace) & (trace.t_end > marked.at_ns))
    if not len(starts):
        after = trace.t_end > marked.at_ns
        return ~after, after
    first = int(starts[0])
    idx = np.arange(n)
    round_ = int(marked.after_settings.num_workers or 0)
    return idx < first, idx > first + round_ - 1 if round_ else idx >= first


def view(marked: Mark, trace: RankTrace) -> Change:
    """The mark with before/after measured on ``trace``, and how the prediction did."""
    before_mask, after_mask = _split(marked, trace)
    before, after = _stats(trace, before_mask), _stats(trace, after_mask)
    p = marked.predicted
    error = None
    if after is not None and p is not None and p.predicted_step_seconds:
        error = round((p.predicted_step_seconds - after.step_seconds) / after.step_seconds, 4)
    return Change(marked, before, after, after is not None and after.data_wait_ratio < DATA_WAIT_LINE, error)
