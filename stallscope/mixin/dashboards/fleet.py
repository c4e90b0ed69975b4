"""Fleet: the cluster's jobs ranked by the accelerator-hours they lost to input wait over
the dashboard's time range (issue 36), the face of `stallscope top`. It reads the
idle-accelerator records the alerting rules already keep (rules.cost_rules: per job,
world size x the straggler's waiting share, and the same by the job's best-scored
cause): no recording rule of its own, and no per-rank series."""
from .. import promql
from . import overview
from .panels import TABLE, Board, drill_down_url, field_link, q, single, tabular, ts

UID = "fleet"


def build(cfg):
    n = promql.names(cfg)
    ns = ('namespace=~"$namespace"',)

    def hours(record, by):
        """Accelerator-hours of ``record`` over the range, per ``by``: a sample every
        $__interval (Grafana's, from the range and the panel's width), each standing for
        that long."""
        return "sum by (%s) (sum_over_time(%s[$__range:$__interval])) * $__interval_ms / 3600000" % (
            by, promql.sel(cfg, record, *ns))

    lost = hours(n["job_idle"], "namespace, job")
    b = Board(cfg, UID, "stallscope / Fleet",
              "Which jobs burned accelerator-hours waiting on input over the time range, and why "
              "(`stallscope top` from the command line).")
    b.link("Job overview", overview.UID)
    b.row("Accelerator-hours lost to input wait")
    panels = [
        single("Accelerator-hours lost", "Accelerator-hours the selected namespaces' jobs idled on "
               "input wait over the time range: per job, world size x its straggler's waiting share "
               "(every rank of a synchronous job idles while the straggler waits).",
               q("sum(%s)" % lost)),
        single("Jobs that lost any", "Jobs with accelerator-hours lost to input wait in the range.",
               q("count(%s > 0)" % lost)),
    ]
    if cfg.gpu_hour_price:
        panels.append(single("Cost of the lost hours", "Accelerator-hours lost x the mixin config's "
                             "gpu_hour_price (%g)." % cfg.gpu_hour_price,
                             q("sum(%s) * %g" % (lost, cfg.gpu_hour_price))))
    b.add(*panels)
    b.add(
        field_link(tabular(
            "Jobs by accelerator-hours lost", "Each job's accelerator-hours idled on input wait over "
            "the range, most first: a job links its overview; `stallscope diagnose` its worst rank.",
            [q("sort_desc(%s)" % lost, instant=True, fmt=TABLE)], w=24),
            "job", "Job overview", drill_down_url(cfg, overview.UID, ("namespace", "job"))),
        tabular("Lost by cause", "The same hours by the cause the correlator scored best for the job "
                "at each moment (the diagnosis's first cause).",
                [q("sort_desc(%s)" % hours(n["job_idle_cause"], "cause"), instant=True, fmt=TABLE)]),
        field_link(tabular(
            "Jobs by error budget spent", "Each job's input-goodput error budget spent over the range, "
            "most first: its mean badput (the slowest rank's wait share) over the range / its budget "
            "(1 - its SLO target); 1 is its whole budget for the time it ran. A job links its overview, "
            "whose SLO row says over which windows and on what cause.",
            [q("sort_desc(%s)" % overview.budget_spent(cfg, ns), instant=True, fmt=TABLE)], "percentunit",
            w=24), "job", "Job overview", drill_down_url(cfg, overview.UID, ("namespace", "job"))),
        ts("Idle accelerators on input wait, per namespace", "Accelerators idle on input wait now, "
           "summed over each namespace's jobs.",
           [q("sum by (namespace) (%s)" % promql.sel(cfg, n["job_idle"], *ns), "{{namespace}}")],
           "short", min_val=0),
    )
    return b.model()
