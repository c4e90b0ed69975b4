"""Do the headline alert and diagnose agree? The lab's check that one rule set judges
both (a firing StallscopeDataWaitHigh means no judged rank is healthy; a silent one
means healthy, or a verdict with a reason the alert does not see), and the alert's own
SLI computed for a run without Prometheus.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..correlate.model import Diagnosis
from ..vocabulary import DATA_WAIT_LINE

HEADLINE = "StallscopeDataWaitHigh"


@dataclasses.dataclass(frozen=True)
class AlertState:
    """The headline alert over a run: firing or not, from which source, and (from its own
    SLI, sli_alert) the numbers behind an explanation."""
    firing: bool
    source: str
    peak_ratio: float | None = None
    longest_over_s: float | None = None
    rate_window_s: float | None = None
    for_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Judged:
    """A rank diagnose judged, with the numbers the agreement is explained by."""
    rank: Any
    verdict: str
    data_wait_ratio: float | None
    job_max_data_wait_ratio: float | None


@dataclasses.dataclass(frozen=True)
class Agreement:
    state: str          # agree, explained, disagree
    alert: str          # firing, silent
    source: str
    verdicts: tuple[str, ...]
    why: str


def sli_alert(history: Sequence[tuple[float, Mapping[Any, Mapping[str, float]]]], rate_window: float,
              for_s: float, line: float = DATA_WAIT_LINE) -> AlertState:
    """The headline alert computed from its own SLI, as the lab's rules would evaluate it
    (for a run without Prometheus, and for the numbers behind an explanation): at each
    sample, every rank's data-wait seconds over step seconds in the last ``rate_window``
    (the agent's counters, which the alert's histograms count alike), the job's worst
    rank against ``line``; firing once that held for ``for_s``. ``history``: [(seconds
    since the window began, {rank: counters})], the runner's samples every second."""
    w, need = rate_window, for_s
    peak: float | None = None
    longest, since, firing = 0.0, None, False
    for i, (t, now) in enumerate(history):
        past = [h for h in history[:i] if h[0] <= t - w + 0.5]
        if not past:
            continue
        then = past[-1][1]
        ratios = []
        for rank, n in now.items():
            b = then.get(rank)
            if not b:
                continue
            steps = n["step_seconds_total"] - b["step_seconds_total"]
            if steps > 0:
                ratios.append((n["data_wait_seconds_total"] - b["data_wait_seconds_total"]) / steps)
        worst = max(ratios) if ratios else None
        if worst is not None:
            peak = worst if peak is None else max(peak, worst)
        if worst is not None and worst > line:
            since = t if since is None else since
            longest = max(longest, t - since)
            firing = firing or t - since >= need
        else:
            since = None
    return AlertState(firing, "sli", None if peak is None else round(peak, 4), round(longest, 1), w, need)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def agreement(alert: AlertState, judged: Sequence[Judged], line: float = DATA_WAIT_LINE) -> Agreement:
    """Do the headline alert and diagnose's verdicts agree? ``judged``: the ranks diagnose
    judged (rank 0's report, then the straggler's). Firing: every judged rank must be
    input_bound or not_input_bound (a rule set that says healthy, or has no verdict,
    disagrees). Silent: healthy agrees; another verdict is explained when the alert could
    not see it (a rank waiting outside the loader, under the line; a stall over the line
    in diagnose's window that never held over it for the alert's ``for`` in its short
    windows; too few batches for a verdict), and disagrees otherwise."""
    verdicts = tuple("%s:%s" % (j.rank, j.verdict) for j in judged)
    head = dict(alert="firing" if alert.firing else "silent", source=alert.source, verdicts=verdicts)
    if not judged:
        return Agreement("disagree", why="diagnose judged no rank", **head)
    if alert.firing:
        bad = [j for j in judged if j.verdict not in ("input_bound", "not_input_bound")]
        if bad:
            why = "%s fired, yet diagnose found %s" % (HEADLINE, ", ".join(
                "rank %s %s" % (j.rank, "healthy" if j.verdict == "healthy"
                                else "without a verdict (%s)" % j.verdict) for j in bad))
            worst = max((j.job_max_data_wait_ratio or j.data_wait_ratio or 0.0 for j in judged), default=None)
            if alert.peak_ratio is not None:
                why += (" (over %ss windows the job's worst rank peaked at %s and stayed over the "
                        "line %ss; over diagnose's window it waited %s)" % (
                            _num(alert.rate_window_s), _pct(alert.peak_ratio),
                            _num(alert.longest_over_s), _pct(worst)))
            return Agreement("disagree", why=why, **head)
        return Agreement("agree", why="%s fired and no judged rank is healthy" % HEADLINE, **head)
    whys = []
    for j in judged:
        v, mine, job = j.verdict, j.data_wait_ratio, j.job_max_data_wait_ratio
        worst = max((x for x in (mine, job) if x is not None), default=None)
        if v == "healthy":
            continue
        if v == "unknown":
            whys.append("rank %s has no verdict (too few batches)" % j.rank)
        elif worst is not None and worst < line and v == "not_input_bound":
            whys.append("rank %s waits outside its loader (data-wait %s, job's worst %s: under "
                        "the line), which the alert does not page on" % (j.rank, _pct(mine), _pct(worst)))
        elif worst is not None and worst >= line and alert.longest_over_s is not None \
                and alert.longest_over_s < (alert.for_s or 0):
            whys.append("rank %s is %s: the job's worst rank waited %s over diagnose's window, but "
                        "over %ss windows it stayed over the line %ss at most (the alert's for: %ss)"
                        % (j.rank, v, _pct(worst), _num(alert.rate_window_s),
                           _num(alert.longest_over_s), _num(alert.for_s)))
        else:
            return Agreement("disagree", why="%s stayed silent, yet diagnose found rank %s %s "
                             "(data-wait %s, job's worst %s)" % (HEADLINE, j.rank, v, _pct(mine),
                                                                _pct(worst)), **head)
    if not whys:
        return Agreement("agree", why="%s silent and every judged rank healthy" % HEADLINE, **head)
    return Agreement("explained", why="; ".join(whys), **head)


def _num(x: float | None) -> str:
    return "?" if x is None else "%g" % x


def judged_reports(reports: Sequence[Any]) -> list[Judged]:
    """The ranks ``stallscope diagnose`` judged, from its typed reports (diagnose/document.py
    Report: rank 0's, then the straggler's)."""
    return [Judged(r.rank, r.verdict, r.data_wait_ratio, r.job_max_data_wait_ratio) for r in reports]


def judged_diagnoses(per_rank: Mapping[Any, Diagnosis | None]) -> list[Judged]:
    """When diagnose could not answer: every rank's diagnosis by the agent (None: the agent
    gave none), the job's worst over the node's ranks."""
    out = []
    for rank, d in sorted(per_rank.items()):
        if d is None:
            out.append(Judged(rank, "unknown", None, None))
            continue
        known = [r for r in [d.data_wait_ratio] + [p.data_wait_ratio for p in d.job_ranks_on_node]
                 if r is not None]
        out.append(Judged(rank, d.verdict, d.data_wait_ratio, max(known) if known else None))
    return out
