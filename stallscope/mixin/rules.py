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
        {"record": n["job_max"], "expr": "max by (namespace, job) (%s)" % n["rank_ratio"]},
        {"record": n["job_median"], "expr": "quantile by (namespace, job) (0.5, %s)" % n["rank_ratio"]},
    ]


def recording_groups(cfg):
    return [{"name": "stallscope.sli", "rules": recording_rules(cfg)}]


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
