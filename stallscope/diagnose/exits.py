"""Loader workers that died, as Prometheus has them: the pod's
``stallscope_loader_worker_exits_total{reason}`` over the window, and the death causes
scored from it the way the agent's correlator scores them (correlate/deaths.py: the
share of the rank's wait from the first death on), so that diagnose ranks them alike
with or without the node's agent.

One range query per series over the window: the counter per reason (its rises are the
deaths, exact, where ``increase()`` would extrapolate) and the rank's cumulative wait,
on the same grid."""
from __future__ import annotations

from collections.abc import Iterable

from ..correlate import deaths
from ..correlate.model import Cause
from .document import JobRank
from .prom import Prometheus, selector

POINTS = 240  # range-query steps over the window (a step of at least a second)


def _rises(points: Iterable[tuple[float, float | None]]) -> list[float]:
    """Deaths per step from a counter's samples: its rises (a reset counts its new value)."""
    out: list[float] = []
    last: float | None = None
    for _t, v in points:
        if v is None:
            out.append(0.0)
            continue
        out.append(0.0 if last is None else (v - last if v >= last else v))
        last = v
    return out


def _at(points: Iterable[tuple[float, float | None]], t: float) -> float | None:
    """The counter's last value at or before ``t`` (None before its first sample)."""
    before = [v for s, v in points if s <= t and v is not None]
    return before[-1] if before else None


def of(prom: Prometheus, who: JobRank, window_s: float) -> tuple[list[tuple[str, int]], list[Cause]]:
    """([(reason, count)], [death causes]) of rank ``who``'s pod in the window; exits
    without a death are left out, causes only where deaths were."""
    end = prom.now
    start = end - window_s
    step = max(1.0, window_s / POINTS)
    pod = selector(pod=who.pod, namespace=who.namespace)
    counters = prom.query_range("sum by (reason) (stallscope_loader_worker_exits_total%s)" % pod,
                                start, end, step)
    exits: list[tuple[str, int]] = []
    causes: list[Cause] = []
    wait: list[tuple[float, float | None]] | None = None
    for labels, points in sorted(counters, key=lambda lp: lp[0].get("reason", "")):
        rises = _rises(points)
        n = int(round(sum(rises)))
        if n <= 0:
            continue
        reason = labels.get("reason", "")
        exits.append((reason, n))
        if reason not in deaths.SIGNALS:
            continue
        if wait is None:
            sel = selector(job=who.job, namespace=who.namespace, pod=who.pod, rank=str(who.rank))
            rows = prom.query_range("sum(stallscope_data_wait_seconds_sum%s)" % sel, start, end, step)
            wait = rows[0][1] if rows else []
        t = [p[0] for p in points]
        since = deaths.since(t, rises, start)
        assert since is not None  # n > 0: a step rose
        first, last, then = _at(wait, start) or 0.0, _at(wait, end), _at(wait, since)
        share = None
        if last is not None and last > first:
            share = (last - (then if then is not None else first)) / (last - first)
        causes.append(deaths.judge(reason, n, share))
    return exits, causes
