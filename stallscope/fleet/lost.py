"""Accelerator-hours lost to input wait: the one computation ``top`` and ``report --job``
share (issue 52: on the same job and period they said 0.023 h / 61.1 % and 0.026 h /
69.2 %, and inside ``report`` the worst single period lost more than the whole job).

On one grid of times, a multiple of the step apart (``top.step_of``: 720 points a series
at most), so two commands asked about the same period a moment apart read the same
points:

- the ranks a job had reporting at each point (the per-rank SLI record);
- the waiting share of its worst rank over the counter window that point falls in, from
  the hook's own counters (windows of COUNTER_WINDOW_S at least, ends on multiples of
  the window; the share a ratio of the wait and step counters' increases over the same
  window, whose extrapolations cancel). The idle-accelerator record (world size x the
  straggler's waiting share over the rate window) integrated instead weighs each
  moment's ratio over the last 5 minutes alike: a young job's start-up, its first
  batches' long waits, counted for minutes (issue 36);
- the hours lost at each point: its ranks x that share x the step. The job's hours lost
  are their sum; a period's, the sum over its points: never more than the job's.

The split by cause is the idle-accelerator record's by the job's best-scored cause,
scaled to the counters' total.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from typing import Any

from ..diagnose import fetch
from ..diagnose.prom import Prometheus, label, selector
from ..mixin import promql

# The hours lost are counted from the hook's own counters in windows of at least this
# long (two or more scrapes at the usual 15-30 s).
COUNTER_WINDOW_S = 60
MAX_POINTS = 720  # points a series over the period: a 24 h period every 2 min

Key = tuple[str, str]  # (namespace, job)
Series = list[tuple[dict[str, str], list[tuple[float, float | None]]]]


class LostError(Exception):
    """Prometheus could not answer: one line for the user."""


def step_of(seconds: float) -> int:
    """The grid's resolution for a period: MAX_POINTS points at most, 1 s at least."""
    return max(1, int(-(-seconds // MAX_POINTS)))


def grid(start: float, end: float) -> tuple[float, float, float]:
    """(first point, last point, step) of the period's grid: multiples of the step."""
    step = float(step_of(end - start))
    first = math.ceil(start / step) * step
    last = math.floor(end / step) * step
    return first, max(first, last), step


@dataclasses.dataclass(frozen=True)
class JobHours:
    namespace: str
    job: str
    step: float
    ranks_at: dict[float, int]        # the ranks reporting at each point of the grid
    idle_at: dict[float, float]       # accelerators idle on input wait there (counters)
    cause_hours: dict[str, float]     # the lost hours by the job's best-scored cause

    @property
    def times(self) -> list[float]:
        return sorted(self.ranks_at)

    def lost_between(self, times: list[float]) -> float:
        """The hours lost at those points of the grid."""
        return sum(self.idle_at.get(t, 0.0) for t in times) * self.step / 3600

    @property
    def lost_accelerator_hours(self) -> float:
        return round(self.lost_between(self.times), 6)

    @property
    def accelerator_hours(self) -> float:
        return round(sum(self.ranks_at.values()) * self.step / 3600, 6)

    @property
    def wall_seconds(self) -> float:
        t = self.times
        return t[-1] + self.step - t[0] if t else 0.0


def _range(prom: Prometheus, expr: str, start: float, end: float, step: float) -> Series:
    try:
        return prom.query_range(expr, start, end, step)
    except fetch.Unreachable as e:
        raise LostError("Prometheus at %s did not answer: %s" % (prom.url, e.message)) from None
    except fetch.HttpError as e:
        raise LostError("Prometheus at %s: %s" % (prom.url, e.reason)) from None


def _key(labels: dict[str, str]) -> Key:
    return labels.get("namespace", ""), labels.get("job", "")


def hours(prom: Prometheus, cfg: Any, start: float, end: float, job: str | None = None,
          namespace: str | None = None) -> dict[Key, JobHours]:
    """Each job that reported between ``start`` and ``end`` (or only ``job``), by
    (namespace, job)."""
    n = promql.names(cfg)
    first, last, step = grid(start, end)
    sel = selector(job=job, namespace=namespace)
    matchers = ["%s=%s" % (k, label(v)) for k, v in (("job", job), ("namespace", namespace)) if v is not None]
    ranks: dict[Key, dict[float, int]] = collections.defaultdict(dict)
    for labels, values in _range(prom, "count by (namespace, job) (%s%s)" % (n["rank_ratio"], sel),
                                 first, last, step):
        for t, v in values:
            if v:
                ranks[_key(labels)][t] = int(v)
    if not ranks:
        return {}
    window = float(max(int(step), COUNTER_WINDOW_S))
    # counter windows (e - window, e], their ends on multiples of the window, covering the grid
    w_first = math.ceil(first / window) * window
    w_last = math.ceil(last / window) * window
    share: dict[Key, dict[float, float]] = collections.defaultdict(dict)
    for labels, values in _range(prom, (
            "max by (namespace, job) (increase(%s[%ds]) / ignoring (__name__) increase(%s[%ds]))" % (
                promql.sel(cfg, "stallscope_data_wait_seconds_sum", *matchers), window,
                promql.sel(cfg, "stallscope_step_seconds_sum", *matchers), window)),
            w_first, w_last, window):
        for t, v in values:
            if v is not None:
                share[_key(labels)][t] = v
    record: dict[Key, dict[str, float]] = collections.defaultdict(dict)
    for labels, values in _range(prom, "sum by (namespace, job, cause) (%s%s)" % (n["job_idle_cause"], sel),
                                 first, last, step):
        c = labels.get("cause", "")
        if c:
            record[_key(labels)][c] = sum(v for _, v in values if v is not None) * step / 3600
    recorded: dict[Key, float] = collections.defaultdict(float)
    for labels, values in _range(prom, "sum by (namespace, job) (%s%s)" % (n["job_idle"], sel),
                                 first, last, step):
        recorded[_key(labels)] += sum(v for _, v in values if v is not None) * step / 3600
    out = {}
    for key, at in ranks.items():
        ends = sorted(share[key])
        idle = {}
        for t in at:
            i = bisect.bisect_left(ends, t)
            if i < len(ends) and ends[i] - window < t:
                idle[t] = at[t] * share[key][ends[i]]
        lost = sum(idle.values()) * step / 3600
        # the record's split, scaled to the counters' total (never above it: a cause
        # series seen through Prometheus's lookback past its last sample adds no hours)
        whole = max(recorded[key], sum(record[key].values()))
        scale = lost / whole if whole > 0 else 0.0
        out[key] = JobHours(key[0], key[1], step, dict(at), idle,
                            {c: round(h * scale, 6) for c, h in record[key].items() if h * scale > 0})
    return out
