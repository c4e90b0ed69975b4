"""What stallscope found in a lab run, compared with the scenario's known answer.

The lab uses the product's own parts, each as far as this build has it: the agent's
per-rank data-wait (always), the correlator's ``/api/v1/diagnosis`` and ``stallscope
diagnose`` when present, and Prometheus evaluating the generated alert rules (a lab
config of the mixin with short windows, so alerts fire within a short run).
"""
import datetime
import json
import os
import platform
import time
import urllib.error
import urllib.parse

from .. import vocabulary

NAMESPACE = "stallscope-lab"
SLI_LINE = vocabulary.DATA_WAIT_LINE  # the headline alert's line
# The mixin config the lab's Prometheus evaluates: same rules, windows short enough for a
# 20-30 s run (scrape and evaluation every second).
LAB_MIXIN = {"rate_window": "10s", "data_wait_for": "5s", "straggler_for": "5s",
             "cause_for": "5s", "health_for": "10s", "silent_lookback": "5m"}
# Alerts that may fire along with a stall scenario's expected ones without counting as a
# mismatch: they restate the stall (worse, or relative to the other ranks).
ALONGSIDE_STALLS = ("StallscopeDataWaitCritical", "StallscopeStragglerRank")
HEADLINE = "StallscopeDataWaitHigh"


def agent_args(duration):
    # No real GPU is read in the lab: simulated, and labelled so.
    return ["--node", "lab-node", "--exporter.interval", "1", "--gpu.simulated", "--no-gpu.nvml",
            "--correlate.interval", "2", "--correlate.window", str(max(10, int(duration + 30)))]


def rule_files(directory):
    """Write the generated rules with the lab's short windows."""
    from ..mixin import config, generate

    cfg = config.load(**LAB_MIXIN)
    return generate.write(generate.alert_files(cfg), directory)


# -- the measured window ---------------------------------------------------------------
def rank_rows(lab, base, now):
    rows = []
    for rank in range(lab.world):
        b, n = base.get(rank), now.get(rank)
        if not n:
            rows.append({"rank": rank, "pod": lab.pod(rank), "batches": 0, "data_wait_ratio": None})
            continue
        steps = n["step_seconds_total"] - (b["step_seconds_total"] if b else 0)
        wait = n["data_wait_seconds_total"] - (b["data_wait_seconds_total"] if b else 0)
        rows.append({"rank": rank, "pod": n["pod"], "batches": n["batches"] - (b["batches"] if b else 0),
                     "data_wait_seconds": round(wait, 4), "step_seconds": round(steps, 4),
                     "data_wait_ratio": round(wait / steps, 4) if steps > 0 else None,
                     "worker_pids": n.get("worker_pids", [])})
    return rows


def _worst(rows):
    scored = [r for r in rows if r["data_wait_ratio"] is not None]
    return max(scored, key=lambda r: r["data_wait_ratio"]) if scored else None


# -- diagnosis ---------------------------------------------------------------------------
def agent_diagnoses(lab):
    """{rank: the agent's /api/v1/diagnosis for it}, or None when the build has none."""
    out = {}
    for rank in range(lab.world):
        q = urllib.parse.urlencode({"pod": lab.pod(rank), "seconds": int(lab.duration)})
        try:
            out[rank] = lab.agent.api("/api/v1/diagnosis?" + q)
        except urllib.error.HTTPError as e:
            if e.code == 404 and b"no such endpoint" in e.read():
                return None
            out[rank] = {"verdict": "unknown", "causes": [], "error": "HTTP %d" % e.code}
    return out


def via_diagnose(lab):
    """As on-call would: ``stallscope diagnose`` on a pod of the job (rank 0's); when it
    names a straggler elsewhere, ``diagnose`` that straggler's pod. Returns (found,
    details) or None when this build has no diagnose, or it could not answer."""
    try:
        from .. import diagnose as dg
    except ImportError:
        return None
    kw = {"namespace": NAMESPACE, "agent_url": lab.agent.url, "window": "%ds" % int(lab.duration),
          "prometheus_url": lab.prom.url if lab.prom is not None else None}
    try:
        first = doc = dg.run(lab.pod(0), **kw)
        s = first.get("straggler") or {}
        if first["verdict"] == "not_input_bound" and s.get("pod") and s["pod"] != first["pod"]:
            doc = dg.run(s["pod"], **kw)
    except dg.DiagnoseError as e:
        lab.say("lab: stallscope diagnose could not answer: %s" % e)
        return None
    bound = doc["verdict"] == "input_bound"
    causes = doc.get("causes") or []
    found = {"cause": causes[0]["cause"] if bound and causes else None,
             "rank": doc["rank"] if bound else None, "verdict": doc["verdict"],
             "source": "stallscope diagnose %s%s" % (lab.pod(0), "" if doc is first else
                                                      " -> straggler " + doc["pod"]),
             "correlator": doc.get("agent_verdict") is not None}
    return found, {"first": first if doc is not first else None, "report": doc,
                   "text": dg.render_text(doc)}


def diagnose(lab, rows):
    """(found, details): found = {cause, rank, verdict, source}."""
    answer = via_diagnose(lab)
    if answer is not None:
        return answer
    per_rank = agent_diagnoses(lab)
    if per_rank is None:
        worst = _worst(rows)
        if worst and worst["data_wait_ratio"] > SLI_LINE:
            return {"cause": None, "rank": worst["rank"], "verdict": "input_bound", "correlator": False,
                    "source": "data-wait only (this build has no correlator)"}, None
        return {"cause": None, "rank": None, "verdict": "healthy", "correlator": False,
                "source": "data-wait only (this build has no correlator)"}, None
    bound = [(rank, d) for rank, d in per_rank.items() if d.get("verdict") == "input_bound"]
    if not bound:
        return {"cause": None, "rank": None, "verdict": per_rank[lab.target].get("verdict"),
                "source": "agent /api/v1/diagnosis", "correlator": True}, per_rank
    ratio = {r["rank"]: r["data_wait_ratio"] or 0 for r in rows}
    rank, d = max(bound, key=lambda rd: ratio.get(rd[0], 0))
    causes = d.get("causes") or [{}]
    return {"cause": causes[0].get("cause"), "rank": rank, "verdict": "input_bound",
            "source": "agent /api/v1/diagnosis", "correlator": True}, per_rank


# -- alerts ------------------------------------------------------------------------------
def firing(prom):
    """Names of the alerts firing now (pending ones are not yet alerts)."""
    try:
        return {a["labels"]["alertname"] for a in prom.alerts() if a.get("state") == "firing"}
    except Exception:
        return set()


def headline(prom):
    """The firing StallscopeDataWaitHigh alerts as Prometheus renders them, for the report."""
    try:
        return [{"alert": a["labels"]["alertname"], "job": a["labels"].get("job"),
                 "active_at": a.get("activeAt"), "summary": a["annotations"].get("summary", "").strip(),
                 "description": a["annotations"].get("description", "").strip(),
                 "runbook_url": a["annotations"].get("runbook_url")}
                for a in prom.alerts()
                if a.get("state") == "firing" and a["labels"]["alertname"] == HEADLINE]
    except Exception:
        return []


def judge_alerts(scenario, fired, rules_loaded):
    if not rules_loaded:
        return {"expected": list(scenario.alerts), "fired": sorted(fired), "matched": None,
                "note": "no alert rules in this build"}
    expected = set(scenario.alerts)
    allowed = expected | set(scenario.may_fire) | (set(ALONGSIDE_STALLS) if scenario.stalls else set())
    missing, unexpected = expected - fired, fired - allowed
    return {"expected": sorted(expected), "fired": sorted(fired), "missing": sorted(missing),
            "unexpected": sorted(unexpected), "matched": not missing and not unexpected}


def collect(lab, base, now, fired=None):
    rows = rank_rows(lab, base, now)
    found, details = diagnose(lab, rows)
    s = lab.scenario
    expected = {"cause": s.cause, "verdict": s.verdict, "rank": lab.target if s.stalls else None,
                "alerts": list(s.alerts)}
    alerts = None
    if lab.prom is not None:
        alerts = judge_alerts(s, set(fired or ()) | firing(lab.prom), bool(lab.rules))
        alerts["headline"] = headline(lab.prom)
    ok = found["cause"] == expected["cause"] and found["rank"] == expected["rank"]
    if alerts and alerts["matched"] is False:
        ok = False
    return {"scenario": s.name, "title": s.title, "duration_s": lab.duration, "world_size": lab.world,
            "job": lab.job, "target_rank": lab.target, "simulated_gpu": True,
            "ranks": rows, "expected": expected, "found": found, "diagnosis": details,
            "report": (details or {}).get("text"), "alerts": alerts, "ok": ok}


# -- recorded traces for the correlator's evaluation set -----------------------------------
def record(lab, result, directory):
    """Save the agent's timelines (target rank + peers) with the scenario's labels in the
    correlator's trace format (stallscope-trace/1); returns the file written."""
    os.makedirs(directory, exist_ok=True)
    bodies = {}
    for rank in range(lab.world):
        q = urllib.parse.urlencode({"rank": rank, "job": lab.job, "seconds": int(lab.duration + 5)})
        bodies[rank] = lab.agent.api("/api/v1/timeline?" + q)
    s = lab.scenario
    target = lab.target
    doc = {"format": "stallscope-trace/1",
           "labels": {"scenario": "lab-" + s.name, "expected_verdict": s.verdict,
                      "expected_cause": s.cause, "expected_rank": target if s.stalls else None,
                      "source": "recorded", "note": s.title},
           "recorded": {"at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "kernel": platform.release(), "seconds": int(lab.duration),
                        "command": "stallscope lab run %s --ranks %d --duration %g --record DIR" % (
                            s.name, lab.world, lab.duration),
                        "agent_verdict": result["found"]["verdict"],
                        "agent_top_cause": result["found"]["cause"]},
           "timeline": bodies[target],
           "peers": [b for r, b in sorted(bodies.items()) if r != target]}
    path = os.path.join(directory, "lab-%s-%s.json" % (s.name, time.strftime("%Y%m%d-%H%M%S")))
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    return path
