"""Prometheus rule groups: the SLI recording rules and the alerts, as plain data ready
for yamlout (rule files) and for the PrometheusRule manifest."""
from . import alerts as _alerts
from . import promql

GROUP_ORDER = ("stallscope.slo", "stallscope.causes", "stallscope.health")


def recording_rules(cfg):
    n = promql.names(cfg)
    return [
        {"record": n["rank_ratio"], "expr": promql.data_wait_ratio(cfg)},
        {"record": n["rank_steps"], "expr": promql.steps_rate(cfg)},
        {"record": n["job_max"], "expr": promql.job_max(cfg)},
        {"record": n["job_median"], "expr": promql.job_median(cfg)},
    ] + cost_rules(cfg)


def cost_rules(cfg):
    """Accelerators idle on input wait, per job (issue 17): every rank of a synchronous
    job idles while its straggler waits, so world size (the ranks reporting) x the
    straggler's waiting share; an accelerator-second lost per second of wall time. Per
    rank the cost is its own share, already recorded (rank_ratio): no new per-rank
    series. Attributed to the job's best-scored cause, and priced when the config
    names a price per GPU-hour."""
    n = promql.names(cfg)
    rules = [
        {"record": n["job_idle"], "expr": "count by (namespace, job) (%s)\n* on (namespace, job)\n%s" % (
            n["rank_ratio"], n["job_max"])},
        {"record": n["job_idle_cause"], "expr": (
            "%s\n* on (namespace, job) group_left (cause)\n"
            "(0 * topk by (namespace, job) (1, max by (namespace, job, cause) (%s)) + 1)" % (
                n["job_idle"], promql.sel(cfg, "stallscope_stall_cause_score")))},
    ]
    if cfg.gpu_hour_price:
        rules.append({"record": n["job_idle_cost"],
                      "expr": "%s * 24 * %g" % (n["job_idle"], cfg.gpu_hour_price)})
    return rules


def slo_rules(cfg):
    """Input goodput as an SLO, per job: the error budget (1 - target, per job where the
    config overrides it), the SLI and the burn rate over each window the burn-rate alerts
    read, and the budget left over the SLO period. From the job_max record of the
    stallscope.sli group, so at most one evaluation behind it (groups are evaluated side
    by side): nothing here is read within seconds."""
    slo, n = cfg.slo, promql.slo_names(cfg)
    job_max = promql.names(cfg)["job_max"]

    def budget_of(matchers, value):
        # every job seen over the period has a budget, also while it has no batch now
        return "group by (namespace, job) (last_over_time(%s[%s])) * %s" % (
            promql.sel(cfg, job_max, *matchers) if matchers else job_max, slo.period, promql.num(value))
    budgets = [budget_of(('namespace="%s"' % key.split("/")[0], 'job="%s"' % key.split("/")[1]),
                         round(1 - target, 12)) for key, target in slo.targets]
    out = [{"record": n["budget"], "expr": "\nor\n".join(budgets + [budget_of((), slo.budget)])}]
    for w in slo.windows():
        out.append({"record": n["sli_" + w], "expr": "1 - %s" % promql.badput(cfg, w)})
    for w in slo.windows():
        out.append({"record": n["burn_" + w], "expr": "%s\n/\n%s" % (promql.badput(cfg, w), n["budget"])})
    out.append({"record": n["budget_left"], "expr": "1 - %s\n/\n%s" % (
        promql.badput(cfg, slo.period), n["budget"])})
    return out


def distribution_rules(cfg):
    """The overview's data-wait distribution over a whole job: summed from every rank's
    buckets at view time it took 4.5 s at 2,048 ranks on one Prometheus, growing with the
    ranks (benchmarks/scale); recorded, the panel reads ~10 series a job. Its own group
    (it reads 10 series a rank, the heaviest rule): groups are evaluated side by side, so
    it does not hold up the SLI records the alerts read. At the global evaluation
    interval, not a slower one of its own: a group evaluated every minute left the panel
    empty for its first minute (the live dashboard test)."""
    n = promql.names(cfg)
    return [{"record": n["job_wait_buckets"], "expr": "sum by (namespace, job, le) (%s)" % promql.rate(
        cfg, "stallscope_data_wait_seconds_bucket")}]


def recording_groups(cfg):
    return [{"name": "stallscope.sli", "rules": recording_rules(cfg)},
            {"name": "stallscope.input_goodput", "rules": slo_rules(cfg)},
            {"name": "stallscope.distribution", "rules": distribution_rules(cfg)}]


def alert_rule(cfg, a):
    return {
        "alert": a.name,
        "expr": a.expr,
        "for": a.for_,
        "labels": {"severity": a.severity},
        "annotations": {
            "summary": a.summary,
            "description": a.description,
            "runbook_url": cfg.runbook_url(a.name),
        },
    }


def inhibit_rules(cfg):
    """Alertmanager's inhibit_rules: a page about a job's input goodput (a burn-rate alert
    of severity critical) mutes its tickets (the burn-rate alerts of severity warning and
    StallscopeDataWaitHigh, the seed's 2 % line at 1x burn) for the same namespace and
    job. Nothing else is inhibited: the cause alerts say why, and another job's ticket
    still notifies."""
    pages = [b.alert for b in cfg.slo.burns if b.severity == "critical"]
    tickets = [b.alert for b in cfg.slo.burns if b.severity == "warning"] + [_alerts.TICKET]
    if not pages:
        return []

    def matcher(names):
        return ('alertname = "%s"' % names[0]) if len(names) == 1 else (
            'alertname =~ "%s"' % "|".join(sorted(names)))
    return [{"source_matchers": [matcher(pages)], "target_matchers": [matcher(tickets)],
             "equal": ["namespace", "job"]}]


def alert_groups(cfg):
    by_group = {}
    for a in _alerts.all_alerts(cfg):
        by_group.setdefault(a.group, []).append(alert_rule(cfg, a))
    return [{"name": g, "rules": by_group[g]} for g in GROUP_ORDER if g in by_group]


def all_groups(cfg):
    return recording_groups(cfg) + alert_groups(cfg)


def prometheus_rule(cfg, name="stallscope", namespace=None):
    """A monitoring.coreos.com/v1 PrometheusRule holding every group."""
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "stallscope",
                                     "app.kubernetes.io/component": "rules"}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": meta, "spec": {"groups": all_groups(cfg)}}
