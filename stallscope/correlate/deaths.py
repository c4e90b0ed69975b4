"""Causes judged from the loader workers the kernel killed (issue 18): ``memory_limit``
(OOM-killed at the pod's memory limit) and ``shm_exhaustion`` (SIGBUS with /dev/shm
full). The workers exporter judges each death from the kernel's evidence
(exporters/worker_deaths.py) and records, per rank and collection, how many workers died
of each (``workers_oom_killed``, ``workers_shm_killed``); Prometheus has the same deaths
as the pod's ``stallscope_loader_worker_exits_total{reason}``.

A killed worker takes its batches with it: the DataLoader raises, the job restarts its
iterator (or the whole rank), and new workers start, grow and may die again. So the wait
from the first kill on is the kills': the score is that share of the window's wait.
Waits before it had another cause. A kill is seen at the sample after it, so the wait
from the sample before on is counted (the loader raises as soon as the worker is gone).

One scoring for both sources: the agent's correlator passes the rank's batch waits
(``score``), diagnose's Prometheus path the rank's cumulative wait at each step of a
range query (``judge``), with the kills on the same grid.

The iterator starts that follow a death are restarts, not epochs: ``restarts`` marks
them so epoch_start (epochs.py) leaves them to the death's cause."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..vocabulary import signal
from .causes import make
from .model import Cause, Evidence
from .trace import RankTrace

# cause -> the per-rank signal counting the deaths judged to be it (the worker-death
# reasons are named after the causes: exporters/worker_deaths.py)
SIGNALS = {"memory_limit": signal("workers_oom_killed").name,
           "shm_exhaustion": signal("workers_shm_killed").name}
CAUSES = tuple(SIGNALS)
WHAT = {"memory_limit": "OOM-killed at the pod's memory limit",
        "shm_exhaustion": "killed by SIGBUS with /dev/shm full"}


def since(t: Any, kills: Any, start: float) -> float | None:
    """From when the wait is the kills': the sample before the first that counts a kill
    (``start`` when that is the first sample); None without a kill. ``t``, ``kills``:
    sample times and the deaths each counts (arrays or lists)."""
    t = np.asarray(t)
    hit = np.flatnonzero(np.asarray(kills) > 0)
    if not len(hit):
        return None
    return float(t[hit[0] - 1]) if hit[0] > 0 else float(start)


def judge(cause: str, n: int, share: float | None) -> Cause:
    """The death Cause from ``n`` workers killed in the window and the share of the
    window's wait from the first kill on (None: no wait to share)."""
    if n <= 0 or share is None:
        return make(cause, 0.0, "No loader worker of the rank was %s in the window." % WHAT[cause],
                    [_row(cause, 0, 0.0)])
    share = min(1.0, max(0.0, share))
    text = ("%d loader worker(s) of the rank were %s in the window; %.0f%% of the wait came from "
            "the first death on (the loader raised, its workers started again)." % (
                n, WHAT[cause], 100 * share))
    return make(cause, share, text, [_row(cause, n, share)])


def score(trace: RankTrace) -> list[Cause]:
    """A Cause for each death cause whose signal the rank has in the window (with its
    batch waits); the others are not evaluated."""
    span = trace.span()
    out: list[Cause] = []
    if span is None:
        return out
    total = float(trace.wait.sum())
    for cause, name in SIGNALS.items():
        _, kills = trace.signal(name, ("rank",))
        if kills is None:
            continue
        kills = kills.clip(*span)
        if not len(kills):
            continue
        n = int(kills.v.sum())
        t0 = since(kills.t, kills.v, span[0])
        share = float(trace.wait[trace.t_end > t0].sum()) / total if t0 is not None and total > 0 else None
        out.append(judge(cause, n, share))
    return out


def restarts(trace: RankTrace, starts: np.ndarray | None = None) -> np.ndarray:
    """Mask of the iterator starts (``starts``: overlap.iterator_starts, given when the
    caller has it) that are the loader's restart after a death: the first start after
    each sample window that counts a kill began (one restart for the workers killed
    together)."""
    if starts is None:
        starts = trace.interval == trace.wait
    out = np.zeros(trace.n, dtype=bool)
    span = trace.span()
    if span is None:
        return out
    for name in SIGNALS.values():
        _, kills = trace.signal(name, ("rank",))
        if kills is None:
            continue
        kills = kills.clip(*span)
        for i in np.flatnonzero(kills.v > 0):
            begun = kills.t[i - 1] if i > 0 else span[0]
            later = np.flatnonzero(starts & ~out & (trace.t_end > begun))
            if len(later):
                out[later[0]] = True
    return out


def merge(scored: list[Cause], found: list[Cause]) -> list[Cause]:
    """Add the death causes to the scored ones: where a cause is scored from its signals
    too (shm_exhaustion's /dev/shm line), the higher score stands with both evidences."""
    by = {c.cause: i for i, c in enumerate(scored)}
    out = list(scored)
    for d in found:
        i = by.get(d.cause)
        if i is None:
            out.append(d)
            continue
        old = out[i]
        best, other = (d, old) if d.score > old.score else (old, d)
        out[i] = dataclasses.replace(best, evidence=best.evidence + other.evidence)
    return out


def _row(cause: str, n: int, share: float) -> Evidence:
    return Evidence(SIGNALS[cause], n, 0, "above", None, "rank", round(share, 6))
