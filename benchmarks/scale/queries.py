"""Every query a user's Grafana and rule evaluator send: each dashboard panel's target
(dashboards/*.json, variables filled as a user looking at one job would: the overview
with every node, pod and rank of the job, "All"; the node dashboard with one node) and
each alert and recording rule expression (alerts/*.yaml), timed against the server."""
import glob
import json
import os
import time
import urllib.parse

import servers
import yaml
from servers import ROOT, get


def rate_interval():
    """Grafana's $__rate_interval: four scrape intervals, at least a minute."""
    return "%ds" % max(4 * servers.SCRAPE_INTERVAL, 60)


def _targets(panels):
    """(panel title, expr) of every target, rows' panels included."""
    for p in panels:
        yield from _targets(p.get("panels", []))
        for t in p.get("targets", []):
            if t.get("expr"):
                yield p.get("title"), t["expr"]


def panel_queries(namespace, job, node, range_s=600, step_s=None):
    """[(dashboard/panel, expr)] with the template variables filled (the fleet dashboard's
    $__range and $__interval as Grafana fills them for a ``range_s`` view)."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "dashboards", "*.json"))):
        name = os.path.basename(path)[:-5].replace("stallscope-", "")
        values = {"$namespace": namespace, "$job": job, "$__rate_interval": rate_interval(),
                  "$node": node if name == "node" else ".*", "$pod": ".*", "$rank": ".*",
                  "$__range": "%ds" % range_s, "$__interval": "%ds" % (step_s or servers.SCRAPE_INTERVAL),
                  "$__interval_ms": "%d" % (1000 * (step_s or servers.SCRAPE_INTERVAL))}
        with open(path) as f:
            dash = json.load(f)
        seen = {}
        for title, expr in _targets(dash.get("panels", [])):
            for k in sorted(values, key=len, reverse=True):
                expr = expr.replace(k, values[k])
            title = "%s/%s" % (name, title)
            seen[title] = seen.get(title, 0) + 1
            out.append((title + ("" if seen[title] == 1 else " #%d" % seen[title]), expr))
    return out


def rule_queries():
    """[(group/name, expr)] of every recording and alerting rule."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "alerts", "*.yaml"))):
        with open(path) as f:
            doc = yaml.safe_load(f)
        for g in doc["groups"]:
            for r in g["rules"]:
                out.append(("%s/%s" % (g["name"], r.get("alert") or r.get("record")), r["expr"]))
    return out


def timed(url, path, params, tries=2):
    """(seconds, series returned) of a query, uncached, the faster of ``tries`` runs (the
    machine is shared: the faster run is the one less disturbed by the neighbours)."""
    q = urllib.parse.urlencode(dict(params, nocache="1"))  # VictoriaMetrics: skip its rollup cache
    best = None
    for _ in range(tries):
        t = time.perf_counter()
        try:
            body = json.loads(get("%s%s?%s" % (url, path, q), timeout=120))
        except RuntimeError as e:  # the server refused it: that is a result too
            return None, "error: %s" % str(e)[-300:]
        took = time.perf_counter() - t
        best = took if best is None else min(best, took)
    return best, len(body["data"]["result"])


def time_panels(url, namespace, job, node, range_s=600, step=None):
    """Each panel as Grafana asks for it: a range query over the last ``range_s``."""
    end, step = time.time(), step or servers.SCRAPE_INTERVAL
    return [(title, *timed(url, "/api/v1/query_range",
                           {"query": expr, "start": end - range_s, "end": end, "step": step}))
            for title, expr in panel_queries(namespace, job, node, range_s, step)]


def time_rules(url):
    """Each rule expression as the evaluator asks for it: an instant query."""
    now = time.time()
    return [(name, *timed(url, "/api/v1/query", {"query": expr, "time": now}))
            for name, expr in rule_queries()]
