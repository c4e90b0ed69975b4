"""epoch_start: the wait before each iterator's first batch (issue 18, item 3).

A DataLoader without ``persistent_workers`` forks its workers again at every epoch, and
each worker then rebuilds its state before the first batch: that wait comes back every
epoch and is averaged away in a steady-state view. The hook marks an iterator's first
batch (its interval is its wait, overlap.iterator_starts); this cause is the share of
the rank's whole wait that those batches account for, so a rank that keeps up in the
steady state but loses most of its wait at epoch starts is named for it."""
from __future__ import annotations

import dataclasses
from typing import Any

from .causes import make
from .model import Cause, Evidence

STEADY_EXACT = 0.1  # share of the wait at iterator starts below which steady scores stand


def score(ib: Any, restarts: Any = None, trace: Any = None, run_start: Any = None) -> Cause | None:
    """The epoch_start Cause from input_bound()'s numbers, or None when no
    iterator started in the window. ``restarts``: the mask of the ``trace``'s batches that
    restarted the loader after a worker died (deaths.restarts): the death's wait, left
    out here. ``run_start``: the mask of the run's own first batch (run_start()), left
    out too: its workers start once, whatever the epochs do, so it is no epoch's start
    (issue 49: a stall that began with the run was published as epoch_start, 0.69 of a
    drawn CFS-quota stall's wait and three other drawn stalls' top cause through
    Prometheus, while the window still held the run's start)."""
    starts, start_wait = ib.iterator_starts, ib.iterator_start_wait_seconds
    dropped = int(restarts.sum()) if restarts is not None else 0
    if dropped:
        starts -= dropped
        start_wait = max(0.0, start_wait - float(trace.wait[restarts].sum()) / 1e9)
    if run_start is not None and run_start.any():
        starts -= int(run_start.sum())
        start_wait = max(0.0, start_wait - float(trace.wait[run_start].sum()) / 1e9)
    if starts <= 0 or ib.data_wait_seconds <= 0:
        return None
    share = min(1.0, start_wait / ib.data_wait_seconds)
    per_start = start_wait / starts
    text = ("%.0f%% of the wait came before the first batch of %d iterator(s): %.3gs each, while "
            "the workers started" % (100 * share, starts, per_start))
    if starts == 1:
        text += " (once in the window: the run's start, or one epoch's)"
    if dropped:
        text += " (%d more restarted the loader after a worker died)" % dropped
    text += "; the steady state waited %.1f%% of its step time." % (100 * ib.steady_data_wait_ratio)
    return make("epoch_start", share, text, [Evidence(
        "iterator_start_wait_seconds", round(per_start, 6), None, "above", None, "rank",
        round(share, 6), starts=starts)])


def run_start(trace: Any, starts: Any) -> Any:
    """Mask of the run's own first batch among the iterator starts ``starts``: the one at
    the first batch the agent saw from the rank's process (RankTrace.first_batch_ns); none
    where that is not known or not an iterator's start (an agent started after the job)."""
    first = trace.first_batch_ns
    if first is None:
        return None
    mask = starts & (trace.t_end == first)
    return mask if mask.any() else None


def steady_part(scored: list[Cause], elsewhere: float) -> list[Cause]:
    """The other causes are judged on the steady batches; they explain at most the steady
    share of the rank's whole wait, the base epoch_start's score and the deaths' are on.
    ``elsewhere``: the share of the whole wait that iterator starts held for a cause of
    their own, the epochs' (epoch_start's score) and the restarts after a worker died
    (deaths.restarts). Without this a steady cause that explains all of a small steady
    wait outranked the starts that held most of the wait: the lab's epoch-start run at
    load 38 named transfer_cost (0.88, 99 % of a steady wait of 3.5 % of the step) over
    epoch_start (0.87 of a 22 % wait), and a rank whose workers died of SIGBUS named its
    1 ms handoff (0.95 of the steady wait) over the deaths whose restarts held the rest
    (tests/diagnose/test_deaths.py, CI). Under STEADY_EXACT of the wait elsewhere the
    scores stand: the difference is within their precision."""
    share = 1.0 - elsewhere
    if elsewhere < STEADY_EXACT:
        return scored
    note = (" (Judged on the steady batches, which hold %.0f%% of the wait; the rest came at "
            "iterator starts.)" % (100 * share)) if share < 0.9 else ""
    return [dataclasses.replace(c, score=round(c.score * share, 4), summary=c.summary + note)
            for c in scored]
