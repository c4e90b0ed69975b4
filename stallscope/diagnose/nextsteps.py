"""What to do next, from the runbooks (runbooks/<Alert>.md, one per alert of the mixin),
and the exact commands for a deeper look."""
import shlex

from .. import vocabulary
from ..vocabulary import ATTRIBUTE
from . import window

RUNBOOK = "runbooks/%s.md"


def runbook_alert(cause):
    """The alert whose runbook fits a ranked cause: of a cause paged by several alerts,
    the one on the signal that explained most of the wait (evidence is ranked)."""
    c = vocabulary.CAUSE.get(cause["cause"]) or vocabulary.cause("unexplained")
    by_signal = {a.signal: a.name for a in c.alerts}
    for e in cause.get("evidence") or ():
        if e.get("signal") in by_signal:
            return by_signal[e["signal"]]
    return c.runbook_alert


def steps(doc):
    out = []

    def add(alert, text):
        out.append({"step": text, "runbook": RUNBOOK % alert if alert else None})

    verdict = doc["verdict"]
    if verdict == "healthy":
        add(None, "Nothing to do for this pod: its loader keeps up.")
    elif verdict == "not_input_bound":
        s = doc.get("straggler") or {}
        if s.get("pod"):
            add("StallscopeStragglerRank", "Diagnose the straggler: stallscope diagnose %s -n %s "
                "(rank %s on node %s)." % (s["pod"], doc["namespace"], s.get("rank"), s.get("node")))
        else:
            add("StallscopeStragglerRank", "Find the rank this one waits for (it is not input-bound "
                "itself).")
    elif verdict == "input_bound":
        causes = doc.get("causes") or []
        named = [c for c in causes if c["score"] >= ATTRIBUTE] or causes[:1]
        z = doc.get("sizing") or {}
        if z.get("workers_needed") and z.get("num_workers") is not None and \
                z["workers_needed"] > z["num_workers"] and \
                "too_few_workers" not in [c["cause"] for c in named[:2]]:
            named = [{"cause": "too_few_workers", "score": 0.0, "evidence": []}] + named
        for c in named[:2]:
            known = vocabulary.CAUSE.get(c["cause"]) or vocabulary.cause("unexplained")
            alert, text = runbook_alert(c), known.advice
            if c["cause"] == "too_few_workers" and doc.get("sizing", {}).get("workers_needed"):
                text = _more_workers(doc)
            p = c.get("prediction") or {}
            if p.get("settings"):  # the measured change replaces the generic advice's first step
                head = "%s%s: predicted data-wait %.1f%%, step %.3gs." % (
                    p["change"][0].upper(), p["change"][1:], 100 * p["predicted_data_wait_ratio"],
                    p["predicted_step_seconds"])
                if c["cause"] == "too_few_workers":
                    # the replayed worker count stands instead of the sizing rule's, not
                    # beside it (two different counts in one step read as a contradiction)
                    persistent = (doc.get("loader") or {}).get("persistent_workers")
                    text = head + ("" if persistent else " Set persistent_workers=True.")
                else:
                    text = "%s %s" % (head, text)
            add(alert, text)
        add("StallscopeDataWaitHigh", "Compare the worst and the median rank: close means the whole "
            "job starves (shared storage, per-sample cost); far apart means one bad rank or node.")
    else:
        add("StallscopeRankSilent", "Check that the rank is alive and iterating, and that its hook "
            "reaches the node's agent.")
    if any(r["signal"] == "hook_dropped_events" and r["status"] == "over" for r in doc.get("evidence") or []):
        add("StallscopeHookDroppingEvents", "The hook dropped events: the numbers above undercount.")
    return out


def _more_workers(doc):
    z = doc["sizing"]
    text = "Raise num_workers from %s to %s" % (z.get("num_workers"), z["workers_needed"])
    if z.get("quota_limited"):
        # More workers than the CPU quota can run only share the same throttled CPU time.
        keep_up = z.get("workers_to_keep_up")
        text += ("; that is all the pod's CPU quota allows: raise its CPU limit%s" %
                 (" (keeping up needs %s workers)" % keep_up if keep_up else ""))
    if not (doc.get("loader") or {}).get("persistent_workers"):
        text += "; set persistent_workers=True"
    return text + "."


def commands(doc, prometheus_url=None, agent_url=None):
    pod, ns, w = doc["pod"], doc["namespace"], doc["window_seconds"]
    base = "stallscope diagnose %s -n %s --window %s" % (shlex.quote(pod), shlex.quote(ns or "default"),
                                                          window.promql(w))
    out = []
    if agent_url:
        out.append("%s --agent %s --stacks   # on node %s (py-spy needs the node's PIDs)" % (
            base, agent_url, doc.get("node")))
    out.append("%s --plot %s.png" % (base, pod))
    if agent_url:
        q = "pod=%s&seconds=%d" % (pod, w)
        out.append("curl -s '%s/api/v1/diagnosis?%s'" % (agent_url, q))
        if doc.get("rank") is not None:
            out.append("curl -s '%s/api/v1/timeline?rank=%s&pod=%s&seconds=%d'" % (
                agent_url, doc["rank"], pod, w))
    if prometheus_url and doc.get("sli_expr"):
        out.append("curl -sG %s/api/v1/query --data-urlencode %s" % (
            prometheus_url, shlex.quote("query=topk(10, %s)" % doc["sli_expr"])))
    s = doc.get("straggler") or {}
    if doc["verdict"] == "not_input_bound" and s.get("pod") and s.get("pod") != pod:
        out.append("stallscope diagnose %s -n %s" % (shlex.quote(s["pod"]), shlex.quote(ns or "default")))
    return out
