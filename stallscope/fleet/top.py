"""``stallscope top``: the cluster's jobs ranked by the accelerator-hours they lost to input
wait over a period, from Prometheus alone (issue 36, item 3).

The hours are lost.py's, the computation ``report --job`` reads too (issue 52): per job,
the accelerator-hours its ranks ran and those they idled on input wait (its ranks x its
worst rank's waiting share from the hook's counters, at each point of the period's
grid), split by the job's best-scored cause; its worst rank the one with the highest
mean waiting share, with its pod and node; its cost the hours lost at the mixin
config's price per accelerator-hour.

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
from . import lost as lost_mod


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
    """The grid's resolution for a period (lost.py)."""
    return lost_mod.step_of(seconds)


def top(prom: Prometheus, cfg: Any, since: float, namespace: str | None = None) -> list[JobLoss]:
    """The jobs that reported in the ``since`` seconds before ``prom.now``, most
    accelerator-hours lost first."""
    n = promql.names(cfg)
    start, end = prom.now - since, prom.now
    first, last, step = lost_mod.grid(start, end)
    match = "{namespace=%s}" % label(namespace) if namespace else ""
    try:
        jobs = lost_mod.hours(prom, cfg, start, end, namespace=namespace)
        # the worst rank: the highest mean waiting share at the same points
        at_last = Prometheus(prom.url, timeout=prom.timeout, now=last)
        worst = at_last.query("topk by (namespace, job) (1, avg_over_time(%s%s[%ds:%ds]))" % (
            n["rank_ratio"], match, last - first + step, step)) if jobs else []
    except lost_mod.LostError as e:
        raise TopError(str(e)) from None
    except fetch.Unreachable as e:
        raise TopError("Prometheus at %s did not answer: %s" % (prom.url, e.message)) from None
    except fetch.HttpError as e:
        raise TopError("Prometheus at %s: %s" % (prom.url, e.reason)) from None
    worst_of = {(r.get("namespace", ""), r.get("job", "")): (r, v) for r, v in worst}
    out = []
    for key, h in jobs.items():
        w = worst_of.get(key)
        lost_h = h.lost_accelerator_hours
        by_cause = h.cause_hours
        out.append(JobLoss(
            key[0], key[1], h.accelerator_hours, lost_h,
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
