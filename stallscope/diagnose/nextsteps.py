"""What to do next, from the runbooks (runbooks/<Alert>.md, one per alert of the mixin),
and the exact commands for a deeper look."""
import shlex

from . import window

RUNBOOK = "runbooks/%s.md"
ACTIONS = {  # cause -> (alert whose runbook covers it, the first thing to do)
    "cpu_throttle": ("StallscopeCPUThrottled",
                     "Raise the pod's CPU limit so num_workers + 1 cores fit the quota, or lower "
                     "num_workers and set torch.set_num_threads(1) in worker_init_fn."),
    "too_few_workers": ("StallscopeDataWaitHigh",
                        "Raise num_workers (up to the CPU quota minus one core), set "
                        "persistent_workers=True, or make per-sample work cheaper (pre-decode, "
                        "decode on the GPU)."),
    "storage_latency": ("StallscopeShardReadSlow",
                        "Check the storage backend's latency for this node; cache or prefetch "
                        "shards locally."),
    "fuse_unhealthy": ("StallscopeFuseMountDown",
                       "Check the FUSE daemon of the mount (alive? stuck?); remount it and "
                       "restart the rank (a dead mount answers ENOTCONN, a stuck one hangs)."),
    "shm_exhaustion": ("StallscopeShmNearlyFull",
                       "Give the pod a larger /dev/shm (emptyDir medium: Memory with a sizeLimit) "
                       "or lower prefetch_factor x num_workers."),
    "io_pressure": ("StallscopeIOPressure",
                    "Find what else does I/O on the node (checkpoints, other pods); move it off "
                    "the training data's device."),
    "memory_pressure": ("StallscopeMemoryPressure",
                        "Raise the pod's memory limit or cut the loader's footprint (fewer "
                        "workers, smaller prefetch); check for reclaim of the page cache."),
    "cache_miss": ("StallscopeCacheHitRateLow",
                   "Prewarm the cache on this node or size it to the working set."),
    "checkpoint_contention": ("StallscopeDataWaitHigh",
                              "Write checkpoints to other storage than the training data, or "
                              "stagger them across ranks."),
    "unexplained": ("StallscopeDataWaitHigh",
                    "Sample the workers' stacks (--stacks) to see where they spend the time."),
}
ATTRIBUTE = 0.5  # causes named as findings (the correlator's line, correlate/causes.py)


def _fuse_alert(cause):
    signals = {e.get("signal") for e in cause.get("evidence") or []}
    return "StallscopeFuseMountStuck" if signals & {"fuse_probe_seconds", "fuse_waiting_requests"} \
        and "fuse_up" not in signals else "StallscopeFuseMountDown"


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
        named = [c for c in doc.get("causes") or [] if c["score"] >= ATTRIBUTE] or (doc.get("causes") or [])[:1]
        z = doc.get("sizing") or {}
        if z.get("workers_needed") and z.get("num_workers") is not None and \
                z["workers_needed"] > z["num_workers"] and "too_few_workers" not in [c["cause"] for c in named[:2]]:
            named = [{"cause": "too_few_workers", "score": 0.0, "evidence": []}] + named
        for c in named[:2]:
            alert, text = ACTIONS.get(c["cause"], ACTIONS["unexplained"])
            if c["cause"] == "fuse_unhealthy":
                alert = _fuse_alert(c)
            if c["cause"] == "too_few_workers" and doc.get("sizing", {}).get("workers_needed"):
                text = _more_workers(doc)
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
