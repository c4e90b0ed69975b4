"""What stallscope found in a lab run, compared with the scenario's known answer.

The lab uses the product's own parts: the agent's per-rank data-wait, ``stallscope
diagnose`` as on-call runs it (the agent's ``/api/v1/diagnosis`` per rank when diagnose
cannot answer), and Prometheus evaluating the generated alert rules (a lab config of the
mixin with short windows, so alerts fire within a short run). It also checks that the
two agree: the headline alert firing means diagnose finds no judged rank ``healthy``,
and a silent one means ``healthy``, or a verdict with a reason the alert does not see
(``agreement``, agreement.py).
"""
import dataclasses
import shutil
import time
import urllib.error
import urllib.parse

from .. import diagnose as dg
from ..correlate import codec
from ..diagnose import window as durations
from ..mixin import config, generate
from ..vocabulary import DATA_WAIT_LINE
from .agreement import HEADLINE, agreement, judged_diagnoses, judged_reports
from .agreement import sli_alert as sli_alert_over

NAMESPACE = "stallscope-lab"
# The mixin config the lab's Prometheus evaluates: same rules, windows short enough for a
# 20-30 s run (scrape and evaluation every second).
LAB_MIXIN = {"rate_window": "10s", "data_wait_for": "5s", "straggler_for": "5s",
             "cause_for": "5s", "health_for": "10s", "silent_lookback": "5m"}
# Alerts that may fire along with a stall scenario's expected ones without counting as a
# mismatch: they restate the stall (its burn rate against the SLO, or relative to the
# other ranks). The burn-rate alerts' `for:` (2 m at least) outlasts a lab run as the
# mixin ships them; a longer run may see them.
ALONGSIDE_STALLS = tuple(b.alert for b in config.DEFAULT.slo.burns) + ("StallscopeStragglerRank",)


def agent_args(window):
    """The agent as the lab runs it: exporters every second, the correlator every 2 s
    over the whole run, and a SIMULATED GPU per rank (no real GPU is read, and every GPU
    series says so). A rank blocked in next() 5 s gets its stacks dumped (hangs.py)."""
    return ["--node", "lab-node", "--exporter.interval", "1", "--gpu.simulated", "--no-gpu.nvml",
            "--correlate.interval", "2", "--correlate.window", str(max(10, int(window + 30))),
            "--hangs.threshold", "5"]


def prometheus_installed():
    return shutil.which("prometheus") is not None


def rule_files(directory):
    """Write the generated rules with the lab's short windows."""
    return generate.write(generate.alert_files(config.load(**LAB_MIXIN)), directory)


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
        rows.append({"rank": rank, "pod": n["pod"], "node": n.get("node"),
                     "batches": n["batches"] - (b["batches"] if b else 0),
                     "data_wait_seconds": round(wait, 4), "step_seconds": round(steps, 4),
                     "data_wait_ratio": round(wait / steps, 4) if steps > 0 else None,
                     "worker_pids": n.get("worker_pids", [])})
    return rows


# -- diagnosis ---------------------------------------------------------------------------
def agent_diagnoses(lab, ranks=None):
    """{rank: the agent's /api/v1/diagnosis for it} (every rank's, or ``ranks``')."""
    out = {}
    for rank in range(lab.world) if ranks is None else ranks:
        q = urllib.parse.urlencode({"pod": lab.pod(rank), "seconds": int(lab.judged_s)})
        try:
            out[rank] = lab.agent_of(rank).api("/api/v1/diagnosis?" + q)
        except urllib.error.HTTPError as e:
            out[rank] = {"verdict": "unknown", "causes": [], "error": "HTTP %d" % e.code}
    return out


def via_diagnose(lab):
    """As on-call would: ``stallscope diagnose`` on a pod of the job (rank 0's); when it
    finds a stall (a victim, or input-bound itself; or cannot judge) and names a straggler elsewhere (the
    job's worst rank), ``diagnose`` that straggler's pod: on a busy machine rank 0's own
    wait may cross the line too, within 3x of the straggler's, and on-call still goes to
    the worst rank. Returns (found, details, judged), or None when diagnose could not
    answer."""
    # every node's agent, the target's first (diagnose asks the first that tracks the pod)
    kw = {"namespace": NAMESPACE, "agent_url": [a.url for a in lab.agents()],
          "window": "%ds" % int(lab.judged_s),
          "prometheus_url": lab.prom.url if lab.prom is not None else None}
    try:
        found_first = found_doc = dg.run(lab.pod(0), **kw)
        s = found_first.straggler
        # "unknown" beside a named straggler too: a victim blocked since its first batch
        # behind a rank hung on a full /dev/shm has no batches to judge, and its report
        # names the hung rank, where on-call goes next (drawn shm_exhaustion 448)
        stalled = found_first.verdict in ("not_input_bound", "input_bound", "unknown")
        if stalled and s is not None and s.pod and s.pod != found_first.pod:
            found_doc = dg.run(s.pod, **kw)
        # the lab keeps the reports as diagnose --json has them (run reports, agreement.py)
        first = dg.encode(found_first)
        doc = first if found_doc is found_first else dg.encode(found_doc)
    except dg.DiagnoseError as e:
        lab.say("lab: stallscope diagnose could not answer: %s" % e)
        return None
    # what was found is read off the typed report; the JSON above is what the lab writes
    bound = found_doc.verdict == "input_bound"
    causes = found_doc.causes
    found = {"cause": causes[0].cause if bound and causes else None,
             "rank": found_doc.rank if bound else None, "verdict": found_doc.verdict,
             "worker_pid": _worker_pid(causes[0]) if bound and causes else None,
             "source": "stallscope diagnose %s%s" % (lab.pod(0), "" if found_doc is found_first else
                                                      " -> straggler " + found_doc.pod)}
    if kw["prometheus_url"] and bound and (getattr(lab.fault, "both_paths", False) or lab.placement):
        # the other path: Prometheus alone, as when the node's agent is down (one truth:
        # the same first cause, from the scores and signals the agent exported); always on
        # lab nodes, where the victim's agent never heard from the straggler (issue 35)
        try:
            alone = dg.run(found_doc.pod, **dict(kw, agent_url=False))
            found["prometheus_alone"] = {"verdict": alone.verdict,
                                         "cause": alone.causes[0].cause if alone.causes else None}
        except dg.DiagnoseError as e:
            found["prometheus_alone"] = {"error": str(e)}
        if getattr(lab.fault, "both_paths", False):  # and the agent's own answer, as polled
            rank = found_doc.rank
            own = _decoded(agent_diagnoses(lab, ranks=(rank,))[rank])
            found["agent_api"] = {"verdict": own.verdict if own is not None else "unknown",
                                  "cause": own.causes[0].cause if own is not None and own.causes else None}
    judged = judged_reports([found_first, found_doc] if found_doc is not found_first else [found_doc])
    if not getattr(lab, "kept", False):
        # the report is printed once the lab is gone: its agent and Prometheus with it, so
        # commands against them would fail when pasted (issue 52); the run kept up instead
        import dataclasses
        found_doc = dataclasses.replace(found_doc, commands=(
            "stallscope lab run %s --keep   # the same run, kept up with its agent%s until "
            "Ctrl-C: it prints their addresses" % (lab.scenario.name, " and Prometheus" if kw[
                "prometheus_url"] else ""),))
    return found, {"first": first if doc is not first else None, "report": doc,
                   "text": dg.render_text(found_doc)}, judged


def _worker_pid(cause):
    """The loader worker a cause names (slow_worker: the one holding the batches)."""
    return cause.worker.pid if cause.worker is not None else None


def expected_worker_pid(lab, rows):
    """The PID of the worker the plan slowed (the target's ``slow_worker_id``-th, as the
    rank reported its workers), or None where the scenario slows no single worker."""
    plan = dict(lab.scenario.real.everyone, **lab.scenario.real.target)
    i = plan.get("slow_worker_id")
    pids = next((r.get("worker_pids") or [] for r in rows if r["rank"] == lab.target), [])
    return pids[i] if i is not None and i < len(pids) else None


def _decoded(body):
    try:
        return codec.decode(body)
    except codec.Malformed:  # the agent gave none (an HTTP error): no verdict
        return None


def diagnose(lab, rows):
    """(found, details, judged): found = {cause, rank, verdict, source}; judged: the ranks
    diagnose (or, when it could not answer, the agent) judged, for agreement()."""
    answer = via_diagnose(lab)
    if answer is not None:
        return answer
    per_rank = agent_diagnoses(lab)  # the answers as they came: what the lab writes
    decoded = {rank: _decoded(body) for rank, body in per_rank.items()}
    judged = judged_diagnoses(decoded)
    bound = [(rank, d) for rank, d in decoded.items() if d is not None and d.verdict == "input_bound"]
    if not bound:
        target = decoded[lab.target]
        return {"cause": None, "rank": None, "verdict": target.verdict if target is not None else "unknown",
                "source": "agent /api/v1/diagnosis"}, per_rank, judged
    ratio = {r["rank"]: r["data_wait_ratio"] or 0 for r in rows}
    rank, d = max(bound, key=lambda rd: ratio.get(rd[0], 0))
    top = d.causes[0] if d.causes else None
    return {"cause": top.cause if top is not None else None, "rank": rank, "verdict": "input_bound",
            "worker_pid": _worker_pid(top) if top is not None else None,
            "source": "agent /api/v1/diagnosis"}, per_rank, judged


# -- set-up checks (issue 32) -----------------------------------------------------------
# The exporters (every second) have placed every rank within a few seconds of its first
# batch; a check the agent still cannot judge by then is left unjudged.
FIRST_BATCH_S = 6.0
# Judged from two iterator starts, so never at the first batch: at the end only.
LATER = ("workers_restart_each_epoch",)


def setup_warnings(lab):
    """{"rank": {"warned": [check names], "unknown": [checks not judged]}} from the agent's
    diagnosis of each rank now (keyed as JSON keeps them)."""
    out = {}
    for rank, d in agent_diagnoses(lab).items():
        out[str(rank)] = {"warned": sorted(w.get("check", "?") for w in d.get("warnings") or ()),
                     "unknown": sorted(d.get("checks_unknown") or ())}
    return out


def first_batch_warnings(lab):
    """The set-up warnings at the first batch: polled from when every rank has had it until
    every check but the LATER ones is judged on every rank (or FIRST_BATCH_S), with the
    seconds that took."""
    t0 = time.monotonic()
    while True:
        found = setup_warnings(lab)
        settled = all(set(w["unknown"]) <= set(LATER) for w in found.values())
        if settled or time.monotonic() - t0 >= FIRST_BATCH_S:
            return {"after_s": round(time.monotonic() - t0, 2), "ranks": found}
        time.sleep(0.5)


def judge_setup(lab, first, end):
    """The target fails exactly its scenario's checks (those judged at the first batch by
    then, the LATER ones by the end), every other rank none; nothing judged at the first
    batch is taken back at the end."""
    expected = set(lab.scenario.real.warns)
    problems = []
    for rank in range(lab.world):
        want = expected if rank == lab.target else set()
        at_first = set((first["ranks"].get(str(rank)) or {}).get("warned", ()))
        at_end = set((end.get(str(rank)) or {}).get("warned", ()))
        if at_first != want - set(LATER):
            problems.append("rank %d at the first batch: %s, expected %s" % (
                rank, sorted(at_first) or "none", sorted(want - set(LATER)) or "none"))
        if at_end != want:
            problems.append("rank %d at the end: %s, expected %s" % (
                rank, sorted(at_end) or "none", sorted(want) or "none"))
    return {"expected": sorted(expected), "target": lab.target, "first_batch": first,
            "end": end, "problems": problems, "matched": not problems}


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


def judge_alerts(scenario, fired):
    expected = set(scenario.real.alerts)
    allowed = expected | set(scenario.real.may_fire) | (set(ALONGSIDE_STALLS) if scenario.stalls else set())
    missing, unexpected = expected - fired, fired - allowed
    return {"expected": sorted(expected), "fired": sorted(fired), "missing": sorted(missing),
            "unexpected": sorted(unexpected), "matched": not missing and not unexpected}


def sli_alert(history, rate_window=None, for_s=None, line=DATA_WAIT_LINE):
    """The headline alert from its own SLI (agreement.sli_alert) with the lab's windows
    unless given (seconds)."""
    w = durations.parse(LAB_MIXIN["rate_window"]) if rate_window is None else rate_window
    need = durations.parse(LAB_MIXIN["data_wait_for"]) if for_s is None else for_s
    return sli_alert_over(history, w, need, line)


def judge_beside(job):
    """Each rank of ``job`` (a second job on the same lab nodes) diagnosed through every
    agent with Prometheus, and through Prometheus alone, against its scenario's verdict."""
    kw = {"namespace": NAMESPACE, "agent_url": [a.url for a in job.agents()],
          "window": "%ds" % int(job.duration),
          "prometheus_url": job.prom.url if job.prom is not None else None}
    verdicts = {}
    for rank in range(job.world):
        paths = [kw] + ([dict(kw, agent_url=False)] if kw["prometheus_url"] else [])
        try:
            verdicts[job.pod(rank)] = [dg.run(job.pod(rank), **p).verdict for p in paths]
        except dg.DiagnoseError as e:
            verdicts[job.pod(rank)] = ["error: %s" % e]
    want = job.scenario.verdict
    return {"job": job.job, "scenario": job.scenario.name, "expected_verdict": want,
            "verdicts": verdicts, "matched": all(v == want for vs in verdicts.values() for v in vs)}


def collect(lab, base, now, fired=None, history=None, first_warnings=None, beside=None):
    rows = rank_rows(lab, base, now)
    setup = None
    if first_warnings is not None and lab.scenario.real.warns is not None:
        setup = judge_setup(lab, first_warnings, setup_warnings(lab))
    found, details, judged = diagnose(lab, rows)
    s = lab.scenario
    expected = {"cause": s.cause, "verdict": s.verdict, "rank": lab.target if s.stalls else None,
                "alerts": list(s.real.alerts)}
    alerts = None
    if lab.prom is not None:
        alerts = judge_alerts(s, set(fired or ()) | firing(lab.prom))
        alerts["headline"] = headline(lab.prom)
    sli = sli_alert(history or [(0.0, base), (lab.duration, now)])
    alert = dataclasses.replace(sli, firing=HEADLINE in alerts["fired"], source="prometheus") \
        if alerts else sli
    agree = dataclasses.asdict(agreement(alert, judged))  # the run record's JSON
    agree["verdicts"] = list(agree["verdicts"])
    agree["sli"] = dataclasses.asdict(sli)
    expected["worker_pid"] = expected_worker_pid(lab, rows)
    ok = found["cause"] == expected["cause"] and found["rank"] == expected["rank"]
    if "slow_worker_id" in dict(s.real.everyone, **s.real.target):  # and the worker (issue 18)
        ok = ok and expected["worker_pid"] is not None and found.get("worker_pid") == expected["worker_pid"]
    if alerts and alerts["matched"] is False:
        ok = False
    if agree["state"] == "disagree":
        ok = False
    if setup is not None and not setup["matched"]:
        ok = False
    others = judge_beside(beside) if beside is not None else None
    if others is not None and not others["matched"]:
        ok = False
    try:
        served = lab.fault.served(lab)
    except Exception as e:  # the check is the fault's; the run's findings stand without it
        served = {"error": str(e)}
    return {"scenario": s.name, "title": s.title, "duration_s": lab.duration, "world_size": lab.world,
            "job": lab.job, "target_rank": lab.target, "simulated_gpu": True,
            "ranks": rows, "expected": expected, "found": found, "diagnosis": details,
            "report": (details or {}).get("text"), "alerts": alerts, "agreement": agree, "setup": setup,
            "served": served, "beside": others, "ok": ok}
