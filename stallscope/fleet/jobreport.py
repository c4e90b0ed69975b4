"""``stallscope report --job``: the life of one job over a period, from Prometheus alone
(issue 36, item 2).

Range queries at one resolution (``lost.grid``: 720 points a series at most) over the
period, read the same records the alerts and ``top`` read:

- the ranks reporting (the per-rank SLI record): wall time (first to last sample), the
  most ranks at once, accelerator-hours (ranks x time);
- accelerator-hours lost to input wait, and by cause: lost.py's, the one computation
  ``top`` reads too (issue 52), on the same grid of points;
- per rank, its mean waiting share and how often it was the job's worst rank over the
  line (a straggler that recurs, and its node);
- the worst periods: the job's worst rank over the warning line, contiguous, ranked by
  the accelerator-hours they lost (counted as the job's are: none loses more than it),
  each with the cause most of them went to;
- the loader settings each rank ran with (``stallscope_loader_info``), and where they
  changed, before -> after.

Typed (``JobReport``); text and JSON are made at the CLI's edge, the HTML page in
jobhtml.py.
"""
from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

from ..diagnose import fetch
from ..diagnose import window as durations
from ..diagnose.prom import Prometheus, label, selector
from ..mixin import promql
from . import lost as lost_mod
from .top import TopError

IDENTITY = ("__name__", "job", "rank", "pod", "namespace", "node", "instance")
STRAGGLER_RECURS = 0.2  # a rank the job's worst over the line this share of the time recurs
WORST_PERIODS = 3


@dataclasses.dataclass(frozen=True)
class RankLife:
    rank: str
    pod: str
    node: str
    mean_data_wait_ratio: float
    straggler_share: float   # of the job's time over the line, the share this rank was its worst


@dataclasses.dataclass(frozen=True)
class Period:
    start: float
    end: float
    lost_accelerator_hours: float
    max_data_wait_ratio: float
    cause: str | None


@dataclasses.dataclass(frozen=True)
class SettingsChange:
    rank: str
    at: float
    before: dict[str, str]
    after: dict[str, str]


@dataclasses.dataclass(frozen=True)
class JobReport:
    namespace: str | None
    job: str
    start: float
    end: float
    wall_seconds: float
    ranks: int
    accelerator_hours: float
    lost_accelerator_hours: float
    lost_by_cause: dict[str, float]
    ranks_life: tuple[RankLife, ...]
    worst_periods: tuple[Period, ...]
    settings: tuple[dict[str, str], ...]      # each distinct loader setting the ranks ran with
    changes: tuple[SettingsChange, ...]
    cost: float | None
    # (time, the job's worst rank's waiting share, accelerators idle) at each step: the
    # HTML report's timeline
    timeline: tuple[tuple[float, float, float], ...] = ()

    @property
    def lost_share(self) -> float | None:
        return self.lost_accelerator_hours / self.accelerator_hours if self.accelerator_hours > 0 else None

    @property
    def recurring_stragglers(self) -> tuple[RankLife, ...]:
        return tuple(r for r in self.ranks_life if r.straggler_share >= STRAGGLER_RECURS)


def report(prom: Prometheus, cfg: Any, job: str, start: float, end: float,
           namespace: str | None = None) -> JobReport:
    if end <= start:
        raise TopError("the period is empty: --from must be before --to")
    if end > prom.now + 60:
        raise TopError("the period ends in the future")
    n = promql.names(cfg)
    first, last, step = lost_mod.grid(start, end)
    sel = selector(job=job, namespace=namespace)
    try:
        found = lost_mod.hours(prom, cfg, start, end, job=job, namespace=namespace)
        ratio = prom.query_range("%s%s" % (n["rank_ratio"], sel), first, last, step)
        info = prom.query_range("stallscope_loader_info%s" % sel, first, last, step)
    except lost_mod.LostError as e:
        raise TopError(str(e)) from None
    except fetch.Unreachable as e:
        raise TopError("Prometheus at %s did not answer: %s" % (prom.url, e.message)) from None
    except fetch.HttpError as e:
        raise TopError("Prometheus at %s: %s" % (prom.url, e.reason)) from None
    if not found or not ratio:
        raise TopError("no rank of job %s%s reported between %s and %s" % (
            job, " in namespace %s" % namespace if namespace else "", when(start), when(end)))
    if len(found) > 1:
        raise TopError("job %s is in namespaces %s: give -n NAMESPACE" % (
            job, ", ".join(sorted(k[0] for k in found))))
    hours = next(iter(found.values()))
    # the job's worst rank at each point
    worst: dict[float, tuple[float, int]] = {}
    for i, (_, values) in enumerate(ratio):
        for t, v in values:
            if v is not None and (t not in worst or v > worst[t][0]):
                worst[t] = (v, i)
    times = hours.times
    over = [t for t in times if t in worst and worst[t][0] >= cfg.data_wait_warning]
    led = collections.Counter(worst[t][1] for t in over)
    life = []
    for i, (labels, values) in enumerate(ratio):
        got = [v for _, v in values if v is not None]
        life.append(RankLife(labels.get("rank", ""), labels.get("pod", ""), labels.get("node", ""),
                             round(sum(got) / len(got), 6) if got else 0.0,
                             round(led[i] / len(over), 4) if over else 0.0))
    life.sort(key=lambda r: (-r.straggler_share, -r.mean_data_wait_ratio))
    by_cause = []
    try:
        by_cause = prom.query_range("sum by (cause) (%s%s)" % (n["job_idle_cause"], sel), first, last, step)
    except fetch.SourceError as e:
        raise TopError("Prometheus at %s: %s" % (prom.url, e.message)) from None
    causes_at = {labels.get("cause", ""): dict((t, v) for t, v in values if v is not None)
                 for labels, values in by_cause}
    # the worst periods: the job's worst rank over the line, contiguous; each one's hours
    # lost counted as the job's are (lost.py), so no period loses more than the job
    periods = []
    run: list[float] = []
    for t in times + [float("inf")]:
        if t in worst and worst[t][0] >= cfg.data_wait_warning and (not run or t - run[-1] <= step * 1.5):
            run.append(t)
            continue
        if run:
            cause_h = {c: sum(p.get(x, 0.0) for x in run) for c, p in causes_at.items() if c}
            periods.append(Period(run[0], run[-1] + step, round(hours.lost_between(run), 6),
                                  round(max(worst[x][0] for x in run), 6),
                                  max(cause_h, key=lambda c: cause_h[c]) if any(cause_h.values()) else None))
        run = [t] if t in worst and worst[t][0] >= cfg.data_wait_warning else []
    periods.sort(key=lambda p: -p.lost_accelerator_hours)
    settings, changes = _settings(info)
    lost = hours.lost_accelerator_hours
    return JobReport(namespace, job, times[0], times[-1] + step, hours.wall_seconds,
                     max(hours.ranks_at.values()), hours.accelerator_hours, lost, dict(hours.cause_hours),
                     tuple(life),
                     tuple(periods[:WORST_PERIODS]), settings, changes,
                     round(lost * cfg.gpu_hour_price, 2) if cfg.gpu_hour_price else None,
                     tuple((t, round(worst[t][0], 6) if t in worst else 0.0,
                            round(hours.idle_at.get(t, 0.0), 6)) for t in times))


def _matchers(job: str, namespace: str | None) -> list[str]:
    out = ["job=%s" % label(job)]
    if namespace is not None:
        out.append("namespace=%s" % label(namespace))
    return out


def _settings(info: list[tuple[dict[str, str], list[tuple[float, float | None]]]]
              ) -> tuple[tuple[dict[str, str], ...], tuple[SettingsChange, ...]]:
    """Each distinct loader setting, and per rank where it changed (by first sample)."""
    by_rank: dict[str, list[tuple[float, dict[str, str]]]] = collections.defaultdict(list)
    distinct: list[dict[str, str]] = []
    for labels, values in info:
        seen = [t for t, v in values if v is not None]
        if not seen:
            continue
        s = {k: v for k, v in sorted(labels.items()) if k not in IDENTITY}
        if s not in distinct:
            distinct.append(s)
        by_rank[labels.get("rank", "")].append((min(seen), s))
    changes = []
    for rank, runs in sorted(by_rank.items()):
        runs.sort(key=lambda x: x[0])
        for (_, before), (at, after) in zip(runs, runs[1:]):
            if before != after:
                changes.append(SettingsChange(rank, at, before, after))
    return tuple(distinct), tuple(changes)


def when(t: float) -> str:
    import time as _time
    return _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(t))


def render_json(r: JobReport) -> str:
    doc = dataclasses.asdict(r)
    doc.update(lost_share=r.lost_share,
               recurring_stragglers=[dataclasses.asdict(x) for x in r.recurring_stragglers])
    return json.dumps(doc, indent=1) + "\n"


def render_text(r: JobReport) -> str:
    share = "%.1f%%" % (100 * r.lost_share) if r.lost_share is not None else "-"
    out = ["Job %s%s, %s to %s (%s, %d ranks at most)" % (
        "%s/" % r.namespace if r.namespace else "", r.job, when(r.start), when(r.end),
        durations.human(r.wall_seconds), r.ranks),
        "  accelerator-hours %.3f, lost to input wait %.3f (%s)%s" % (
            r.accelerator_hours, r.lost_accelerator_hours, share,
            ", cost %.2f" % r.cost if r.cost is not None else "")]
    if r.lost_by_cause:
        out.append("  lost by cause: " + ", ".join("%s %.3f h" % (c, v) for c, v in
                                                   sorted(r.lost_by_cause.items(), key=lambda x: -x[1])))
    if r.worst_periods:
        out.append("Worst periods")
        for p in r.worst_periods:
            out.append("  %s to %s  lost %.3f h, worst rank at %.1f%%, %s" % (
                when(p.start), when(p.end), p.lost_accelerator_hours, 100 * p.max_data_wait_ratio,
                p.cause or "no cause scored"))
    if r.recurring_stragglers:
        out.append("Stragglers that recurred")
        for s in r.recurring_stragglers:
            out.append("  rank %s (pod %s, node %s): the job's worst rank %.0f%% of its time over the "
                       "line, waiting %.1f%% on average" % (s.rank, s.pod, s.node, 100 * s.straggler_share,
                                                            100 * s.mean_data_wait_ratio))
    if r.settings:
        out.append("Loader settings")
        for s in r.settings:
            out.append("  " + ", ".join("%s=%s" % kv for kv in s.items()))
    for c in r.changes:
        diff = {k: (c.before.get(k), c.after.get(k)) for k in set(c.before) | set(c.after)
                if c.before.get(k) != c.after.get(k)}
        out.append("  rank %s at %s: %s" % (c.rank, when(c.at), ", ".join(
            "%s %s -> %s" % (k, a, b) for k, (a, b) in sorted(diff.items()))))
    return "\n".join(out) + "\n"
