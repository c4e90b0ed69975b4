"""``stallscope top``: the cluster's jobs ranked by the accelerator-hours they lost to input
wait over a period, from Prometheus alone (issue 36, item 3).

The recording rules already say it per job, every evaluation (mixin/rules.py cost_rules):
accelerators idle on input wait (world size x the straggler's waiting share: in
synchronous training every rank idles while the straggler waits), and the same split
by the job's best-scored cause. Integrated over the period they are accelerator-hours:
a subquery samples each record every STEP seconds over the period and sums it (x STEP /
3600). The job's accelerator-hours are its ranks reporting, integrated the same way; its
worst rank the one with the highest mean waiting share, with its pod and node; its cost
the hours lost at the mixin config's price per accelerator-hour.

Typed rows here (``JobLoss``); text and JSON are made at the CLI's edge (render_*).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..diagnose import fetch
from ..diagnose import window as durations
from ..diagnose.prom import Prometheus, label
from ..mixin import promql

MAX_POINTS = 720  # subquery samples per series over the period: a 24 h period every 2 min


class TopError(Exception):
    """What stops ``top``: one line for the user."""


@dataclasses.dataclass(frozen=True)
class JobLoss:
    namespace: str
    job: str
    accelerator_hours: float          # the job's ranks reporting, integrated over the period
    lost_accelerator_hours: float     # idle on input wait
    top_cause: str | None             # the cause the most of the lost hours were attributed to
    cause_hours: dict[str, float]     # lost hours by the job's best-scored cause at each moment
    worst_rank: str | None
    worst_pod: str | None
    worst_node: str | None
    worst_rank_data_wait_ratio: float | None  # that rank's mean waiting share over the period
    cost: float | None                # lost hours x the config's price per accelerator-hour

    @property
    def lost_share(self) -> float | None:
        return self.lost_accelerator_hours / self.accelerator_hours if self.accelerator_hours > 0 else None

    @property
    def unattributed_hours(self) -> float:
        """Lost hours no cause was scored for (before the correlator's first scores of a
        stall, or a rank the agent could not judge)."""
        return max(0.0, round(self.lost_accelerator_hours - sum(self.cause_hours.values()), 6))


def step_of(seconds: float) -> int:
    """The subquery's resolution for a period: MAX_POINTS samples at most, 1 s at least."""
    return max(1, int(-(-seconds // MAX_POINTS)))


def _by_job(rows: list[tuple[dict[str, str], float | None]], *more: str) -> dict[tuple[str, ...], float]:
    return {tuple(r.get(k, "") for k in ("namespace", "job") + more): v or 0.0 for r, v in rows}


def top(prom: Prometheus, cfg: Any, since: float, namespace: str | None = None) -> list[JobLoss]:
    """The jobs that reported in the ``since`` seconds before ``prom.now``, most
    accelerator-hours lost first."""
    n = promql.names(cfg)
    step = step_of(since)
    rng = "[%s:%ds]" % (durations.promql(since), step)
    hours = "%d / 3600" % step
    match = "{namespace=%s}" % label(namespace) if namespace else ""
    try:
        lost = _by_job(prom.query("sum by (namespace, job) (sum_over_time(%s%s%s)) * %s" % (
            n["job_idle"], match, rng, hours)))
        total = _by_job(prom.query("sum by (namespace, job) (sum_over_time((count by (namespace, job) "
                                   "(%s%s))%s)) * %s" % (n["rank_ratio"], match, rng, hours)))
        causes = _by_job(prom.query("sum by (namespace, job, cause) (sum_over_time(%s%s%s)) * %s" % (
            n["job_idle_cause"], match, rng, hours)), "cause")
        worst = prom.query("topk by (namespace, job) (1, avg_over_time(%s%s%s))" % (
            n["rank_ratio"], match, rng))
    except fetch.Unreachable as e:
        raise TopError("Prometheus at %s did not answer: %s" % (prom.url, e)) from None
    except fetch.HttpError as e:
        raise TopError(str(e)) from None
    worst_of = {(r.get("namespace", ""), r.get("job", "")): (r, v) for r, v in worst}
    out = []
    for key in set(total) | set(lost):
        by_cause = {c[2]: round(h, 6) for c, h in causes.items() if c[:2] == key and h > 0}
        w = worst_of.get(key)
        lost_h = lost.get(key, 0.0)
        out.append(JobLoss(
            key[0], key[1], round(total.get(key, 0.0), 6), round(lost_h, 6),
            max(by_cause, key=lambda c: by_cause[c]) if by_cause else None, by_cause,
            w[0].get("rank") if w else None, w[0].get("pod") if w else None,
            w[0].get("node") if w else None, round(w[1], 6) if w and w[1] is not None else None,
            round(lost_h * cfg.gpu_hour_price, 2) if cfg.gpu_hour_price else None))
    out.sort(key=lambda j: (-j.lost_accelerator_hours, j.namespace, j.job))
    return out


def render_json(rows: list[JobLoss], since: float) -> str:
    return json.dumps({"since_seconds": since, "jobs": [
        dict(dataclasses.asdict(r), lost_share=r.lost_share, unattributed_hours=r.unattributed_hours)
        for r in rows]}, indent=1) + "\n"


def render_text(rows: list[JobLoss], since: float) -> str:
    if not rows:
        return "No job reported in the last %s.\n" % durations.human(since)
    lines = ["Jobs by accelerator-hours lost to input wait, last %s:" % durations.human(since),
             "  %-32s %10s %8s %-22s %s" % ("namespace/job", "lost h", "of all", "top cause",
                                              "worst rank (node, its wait)")]
    for r in rows:
        share = "%.1f%%" % (100 * r.lost_share) if r.lost_share is not None else "-"
        worst = "-"
        if r.worst_rank is not None:
            worst = "rank %s %s (%s, %s)" % (r.worst_rank, r.worst_pod or "", r.worst_node or "?",
                                             "%.1f%%" % (100 * r.worst_rank_data_wait_ratio)
                                             if r.worst_rank_data_wait_ratio is not None else "?")
        cost = "  cost %.2f" % r.cost if r.cost is not None else ""
        lines.append("  %-32s %10.3f %8s %-22s %s%s" % (
            "%s/%s" % (r.namespace, r.job), r.lost_accelerator_hours, share, r.top_cause or "-", worst, cost))
    return "\n".join(lines) + "\n"
