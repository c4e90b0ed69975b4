"""What the rig measures on a running path: series, ingest rate, memory, rule-group
evaluation time, the time from an injected straggler to the headline alert, diagnose."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse

from servers import ROOT, VMALERT_PORT, get, nice_15

HEADLINE = "StallscopeDataWaitHigh"


def query(url, expr):
    body = json.loads(get("%s/api/v1/query?%s" % (url, urllib.parse.urlencode({"query": expr})), timeout=120))
    return body["data"]["result"]


def scalar(url, expr):
    rows = query(url, expr)
    return float(rows[0]["value"][1]) if rows else None


def server_metric(url, name, labels=""):
    """Sum of one metric family's samples on a server's own /metrics (``labels``: a substring)."""
    total, found = 0.0, False
    for line in get(url + "/metrics", timeout=30).decode().splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def wait_for(check, seconds, every=3.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = check()
        if v:
            return v
        time.sleep(every)
    return None


def ranks_recorded(url, ranks):
    """True once the recording rule has a value for every rank."""
    try:
        return scalar(url, "count(rank:stallscope_data_wait_ratio:rate5m)") == ranks
    except (OSError, RuntimeError, KeyError, ValueError):  # RuntimeError: a 5xx while busy
        return False


def series_counts(url, node):
    """Series in storage, and rank-labelled series per rank on ``node`` (the straggler's:
    every node has the same shape, and the straggler carries the most): as the agents
    expose them (the budget) and with the recording rules' and alerts' per-rank outputs.
    (Over every node at once this regex query passes VictoriaMetrics' 30 s limit here.)"""
    per_rank = 'count by (namespace, job, rank) ({__name__=~"stallscope_.+", node="%s", rank=~".+"})' % node
    stored = 'count by (namespace, job, rank) ({node="%s", rank=~".+"})' % node
    return {"series_total": stored_series(url),
            "series_per_rank_max": scalar(url, "max(%s)" % per_rank),
            "series_per_rank_mean": scalar(url, "avg(%s)" % per_rank),
            "stored_per_rank_max": scalar(url, "max(%s)" % stored)}


def stored_series(url):
    """Series in the head (Prometheus) or in storage (VictoriaMetrics), from the TSDB status API."""
    data = json.loads(get(url + "/api/v1/status/tsdb", timeout=120))["data"]
    return data["headStats"]["numSeries"] if "headStats" in data else data.get("totalSeries")


def prometheus_groups(url):
    """{group: evaluation seconds} of the last evaluation of each rule group."""
    body = json.loads(get(url + "/api/v1/rules", timeout=30))
    return {g["name"]: g["evaluationTime"] for g in body["data"]["groups"]}


def vmalert_groups():
    """{group: mean evaluation seconds} over vmalert's iterations so far."""
    text = get("http://127.0.0.1:%d/metrics" % VMALERT_PORT, timeout=30).decode()
    sums = dict(re.findall(r'vmalert_iteration_duration_seconds_sum\{group="([^"]+)"[^}]*\} (\S+)', text))
    counts = dict(re.findall(r'vmalert_iteration_duration_seconds_count\{group="([^"]+)"[^}]*\} (\S+)', text))
    return {g: float(sums[g]) / float(counts[g]) for g in sums if float(counts.get(g, 0))}


def alerts(path, url):
    """[(alertname, state, labels)] from the evaluator's alerts API."""
    if path == "vm":
        body = json.loads(get("http://127.0.0.1:%d/api/v1/alerts" % VMALERT_PORT, timeout=30))
        return [(a["name"], a["state"], a.get("labels", {})) for a in body["data"]["alerts"] or []]
    body = json.loads(get(url + "/api/v1/alerts", timeout=30))
    return [(a["labels"]["alertname"], a["state"], a["labels"]) for a in body["data"]["alerts"] or []]


def straggler_to_alert(path, url, control, node, rank, limit_s):
    """Inject the straggler now; seconds until the headline alert is pending and firing."""
    onset = time.time()
    tmp = control + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"node": node, "rank": rank, "onset": onset}, f)
    os.replace(tmp, control)
    out = {"pending_s": None, "firing_s": None, "onset": onset}
    while time.time() - onset < limit_s and out["firing_s"] is None:
        try:
            states = {s for name, s, _ in alerts(path, url) if name == HEADLINE}
        except OSError:
            states = set()
        for key, state in (("pending_s", "pending"), ("firing_s", "firing")):
            if state in states and out[key] is None:
                out[key] = round(time.time() - onset, 1)
        if "firing" in states and out["pending_s"] is None:
            out["pending_s"] = out["firing_s"]
        time.sleep(1.0)
    return out


def first_over(url, expr, start, line=0.02, step=5):
    """Seconds after ``start`` of the first point of ``expr`` over ``line`` (query_range)."""
    q = urllib.parse.urlencode({"query": expr, "start": start - step, "end": time.time(), "step": step})
    body = json.loads(get("%s/api/v1/query_range?%s" % (url, q), timeout=120))
    points = [(float(t), float(v)) for r in body["data"]["result"] for t, v in r["values"]]
    crossed = [t for t, v in sorted(points) if t >= start and v > line]
    return round(crossed[0] - start, 1) if crossed else None


def alert_stages(url, onset, rank):
    """Where the time to the alert goes: when the straggler's data (the raw 5m ratio, as
    the server evaluates it) crossed the line, and when the recording rule's series did."""
    sel = '{rank="%d"}' % rank
    raw = ("sum(rate(stallscope_data_wait_seconds_sum%s[5m])) / sum(rate(stallscope_step_seconds_sum%s[5m]))"
           % (sel, sel))
    return {"raw_over_line_s": first_over(url, raw, onset),
            "record_over_line_s": first_over(url, "rank:stallscope_data_wait_ratio:rate5m" + sel, onset)}


def diagnose(url, pod, namespace):
    """(wall seconds, exit code, report) of `stallscope diagnose POD --prometheus URL --json`."""
    return _command(["diagnose", pod, "-n", namespace, "--prometheus", url])


def _command(args):
    """(wall seconds, exit code, JSON document or {"error": ...}) of `stallscope ARGS --json`,
    run with `python -m` from the checkout: this tree's stallscope, not whichever the
    venv's console script was installed from."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "stallscope"] + args + ["--json"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, preexec_fn=nice_15)
    took = time.perf_counter() - t
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = {"error": (r.stderr or r.stdout).strip()[-300:]}
    return took, r.returncode, doc


def after_the_fact(url, pod, namespace, job):
    """Issue 36's commands over a 7-day range (the rig's minutes of data in it): `top` (and
    over an hour), the job's `report` and `diagnose --at` 20 s back (inside the injected
    straggler's stall), each's wall time and what it found."""
    out = {}
    for key, since in (("top", "7d"), ("top_1h", "1h")):  # 1h: a subquery step the rig's data fills
        took, code, doc = _command(["top", "--prometheus", url, "--since", since])
        jobs = doc.get("jobs") or []
        out[key] = {"wall_s": round(took, 2), "exit": code, "jobs": len(jobs),
                    "first": (jobs[0].get("job") if jobs else None), "error": doc.get("error")}
    took, code, doc = _command(["report", "--job", job, "-n", namespace, "--prometheus", url,
                                "--since", "7d"])
    out["report"] = {"wall_s": round(took, 2), "exit": code, "ranks": doc.get("ranks"),
                     "lost_accelerator_hours": doc.get("lost_accelerator_hours"), "error": doc.get("error")}
    took, code, doc = _command(["diagnose", pod, "-n", namespace, "--prometheus", url, "--at", "-20s"])
    strag = doc.get("straggler") or {}
    out["diagnose_at"] = {"wall_s": round(took, 2), "exit": code, "verdict": doc.get("verdict"),
                          "named_rank": strag.get("rank"), "error": doc.get("error")}
    return out
