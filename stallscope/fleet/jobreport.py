"""``stallscope report --job``: the life of one job over a period, from Prometheus alone
(issue 36, item 2).

Range queries at one resolution (``top.step_of``: 720 points a series at most) over the
period, read the same records the alerts and ``top`` read:

- the ranks reporting (the per-rank SLI record): wall time (first to last sample), the
  most ranks at once, accelerator-hours (ranks x time);
- accelerator-hours lost to input wait, from the hook's own counters: each step the job
  reported, its ranks x the waiting share of its worst rank over the window the step
  falls in (windows of COUNTER_WINDOW_S at least, one after another; the share a ratio
  of the wait and step counters' increases), summed. The idle-accelerator record
  (world size x the straggler's waiting share over the rate window) integrated instead
  weighs each moment's ratio over the last 5 minutes alike: a young job's start-up, its
  first batches' long waits, counted for minutes (0.30 against the counters' 0.24 on a
  40 s-old job, issue 36). The hours by the job's best-scored cause are the record's,
  scaled to that total;
- per rank, its mean waiting share and how often it was the job's worst rank over the
  line (a straggler that recurs, and its node);
- the worst periods: the job's worst rank over the warning line, contiguous, ranked by
  the accelerator-hours they lost, each with the cause most of them went to;
- the loader settings each rank ran with (``stallscope_loader_info``), and where they
  changed, before -> after.

Typed (``JobReport``); text and JSON are made at the CLI's edge, the HTML page in
jobhtml.py.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import json
from typing import Any

from ..diagnose import fetch
from ..diagnose import window as durations
from ..diagnose.prom import Prometheus, label, selector
from ..mixin import promql
from .top import TopError, step_of

IDENTITY = ("__name__", "job", "rank", "pod", "namespace", "node", "instance")
STRAGGLER_RECURS = 0.2  # a rank the job's worst over the line this share of the time recurs
# The hours lost are counted from the hook's own counters in windows of at least this
# long (two or more scrapes at the usual 15-30 s), one after another over the period.
COUNTER_WINDOW_S = 60
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


def _points(rows: list[tuple[dict[str, str], list[tuple[float, float | None]]]]) -> dict[float, float]:
    """One series' (or the sum of several) values by time."""
    out: dict[float, float] = collections.defaultdict(float)
    for _, values in rows:
        for t, v in values:
            if v is not None:
                out[t] += v
    return out


def report(prom: Prometheus, cfg: Any, job: str, start: float, end: float,
           namespace: str | None = None) -> JobReport:
    if end <= start:
        raise TopError("the period is empty: --from must be before --to")
    if end > prom.now + 60:
        raise TopError("the period ends in the future")
    n = promql.names(cfg)
    step = float(step_of(end - start))
    sel = selector(job=job, namespace=namespace)
    h = step / 3600

    def rng(expr: str) -> list[tuple[dict[str, str], list[tuple[float, float | None]]]]:
        return prom.query_range(expr, start, end, step)
    try:
        ratio = rng("%s%s" % (n["rank_ratio"], sel))
        idle = _points(rng("sum(%s%s)" % (n["job_idle"], sel)))
        by_cause = rng("sum by (cause) (%s%s)" % (n["job_idle_cause"], sel))
        info = rng("stallscope_loader_info%s" % sel)
    except fetch.Unreachable as e:
        raise TopError("Prometheus at %s did not answer: %s" % (prom.url, e)) from None
    except fetch.HttpError as e:
        raise TopError(str(e)) from None
    if not ratio:
        raise TopError("no rank of job %s%s reported between %s and %s" % (
            job, " in namespace %s" % namespace if namespace else "", when(start), when(end)))
    # the ranks reporting at each step, and the job's worst rank
    count: dict[float, int] = collections.Counter()
    worst: dict[float, tuple[float, int]] = {}
    for i, (_, values) in enumerate(ratio):
        for t, v in values:
            if v is None:
                continue
            count[t] += 1
            if t not in worst or v > worst[t][0]:
                worst[t] = (v, i)
    times = sorted(count)
    # each window's worst rank's waiting share from the hook's counters (a ratio of two
    # increases over the same window, whose extrapolations cancel), the windows from the
    # job's first reported step, as its wall time is
    window = max(int(step), COUNTER_WINDOW_S)
    matchers = _matchers(job, namespace)
    try:
        counted = _points(prom.query_range(
            "max by (namespace, job) (increase(%s[%ds]) / ignoring (__name__) increase(%s[%ds]))" % (
                promql.sel(cfg, "stallscope_data_wait_seconds_sum", *matchers), window,
                promql.sel(cfg, "stallscope_step_seconds_sum", *matchers), window),
            times[0] - step + window, times[-1] + window, window))
    except fetch.Unreachable as e:
        raise TopError("Prometheus at %s did not answer: %s" % (prom.url, e)) from None
    except fetch.HttpError as e:
        raise TopError(str(e)) from None
    over = [t for t in times if worst[t][0] >= cfg.data_wait_warning]
    led = collections.Counter(worst[t][1] for t in over)
    life = []
    for i, (labels, values) in enumerate(ratio):
        got = [v for _, v in values if v is not None]
        life.append(RankLife(labels.get("rank", ""), labels.get("pod", ""), labels.get("node", ""),
                             round(sum(got) / len(got), 6) if got else 0.0,
                             round(led[i] / len(over), 4) if over else 0.0))
    life.sort(key=lambda r: (-r.straggler_share, -r.mean_data_wait_ratio))
    causes_at = {labels.get("cause", ""): dict((t, v) for t, v in values if v is not None)
                 for labels, values in by_cause}
    recorded = sum(idle.values()) * h
    # each step the job reported: its ranks x the share of the window it falls in
    ends = sorted(counted)
    lost = recorded
    if ends:
        lost = 0.0
        for t in times:
            i = bisect.bisect_left(ends, t)
            if i < len(ends) and ends[i] - window < t:
                lost += count[t] * counted[ends[i]] * h
    # the split by cause is the record's; its total the counters'
    scale = lost / recorded if recorded > 0 else 0.0
    lost_by_cause = {c: round(sum(p.values()) * h * scale, 6) for c, p in causes_at.items() if c}
    periods = []
    run: list[float] = []
    for t in times + [float("inf")]:
        if t in worst and worst[t][0] >= cfg.data_wait_warning and (not run or t - run[-1] <= step * 1.5):
            run.append(t)
            continue
        if run:
            cause_h = {c: sum(p.get(x, 0.0) for x in run) for c, p in causes_at.items() if c}
            periods.append(Period(run[0], run[-1] + step, round(sum(idle.get(x, 0.0) for x in run) * h, 6),
                                  round(max(worst[x][0] for x in run), 6),
                                  max(cause_h, key=lambda c: cause_h[c]) if any(cause_h.values()) else None))
        run = [t] if t in worst and worst[t][0] >= cfg.data_wait_warning else []
    periods.sort(key=lambda p: -p.lost_accelerator_hours)
    settings, changes = _settings(info)
    return JobReport(namespace, job, times[0], times[-1] + step, times[-1] + step - times[0],
                     max(count.values()), round(sum(count.values()) * h, 6), round(lost, 6), lost_by_cause,
                     tuple(life),
                     tuple(periods[:WORST_PERIODS]), settings, changes,
                     round(lost * cfg.gpu_hour_price, 2) if cfg.gpu_hour_price else None,
                     tuple((t, round(worst[t][0], 6), round(idle.get(t, 0.0), 6)) for t in times))


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
