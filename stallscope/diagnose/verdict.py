"""One verdict from two views: the cluster's (Prometheus: this rank against its whole
job) and the node's (the agent's correlator: timelines, GPU, causes with evidence).

Both paths apply the one rule set (stallscope/correlate/rules.py, which the agent's
/api/v1/diagnosis applies too) to the best numbers at hand: the rank's data-wait share
and the job's straggler from Prometheus when it answered (the numbers the headline
alert reads), else from the agent (the job's ranks on its node); the GPU's idle shares
from the agent. So the page, this verdict and its evidence rows never contradict one
another; the agent's own verdict is kept in the report as ``agent_verdict``.
- A rank whose batches stopped coming is stuck (stuck()): ``input_bound`` when the hook
  says it is blocked in next() (or its stacks show the main thread in the DataLoader),
  ``not_input_bound`` when its hook still reports and it is not in next() (or its
  stacks put it outside the loader), else ``unknown``. No data at all: ``unknown``.
Causes come from the agent; without it, from the correlator's scores that Prometheus
has (``stallscope_stall_cause_score``) and the pod's signals over their thresholds,
which are level-only evidence (their timing against the stalls is unknown there),
except for a computed cause measured by the hook (``transfer_cost``): its signal's
value is its score.
"""
from .. import vocabulary
from ..correlate import codec, deaths, rules
from .cluster import CFG, THRESHOLD
from .window import human

LEVEL_ONLY_SCORE = 0.5  # a signal over its line, timing unknown: a candidate, not a finding
STUCK_MIN_S = 30.0      # no batch for this long, and for STUCK_STEPS typical steps: stuck
STUCK_STEPS = 20
BLOCKED_MIN_S = 5.0     # in next() for this long (and STUCK_STEPS steps): blocked on the loader
BLOCKED_RATIO = 0.9     # no batch in the window, yet waiting in next() for most of it
HOOK_FRESH_S = 15.0     # the hook reports at least every 5 s (its heartbeat)
LOADER_CLASSES = ("ipc_wait", "fetch", "decode", "collate")  # main thread inside the DataLoader


def pct(x):
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def _over(value, threshold, direction="above"):
    if value is None or threshold is None:
        return None
    if direction == "equal":
        return value == threshold
    return value > threshold if direction == "above" else value < threshold


def stuck(me, window_s):
    """(where, why) when the rank's batches stopped, else None; where is ``next`` (the hook
    says the loop is blocked in next() right now), ``elsewhere`` (batches stopped, the
    hook still reports, and the loop is not in next()) or ``unknown``.

    The hook reports a next() call still in progress (blocked_since_ns): the agent
    shows it as ``blocked_in_next_seconds`` and adds it to the data-wait and step sums,
    so in Prometheus a blocked rank waits ~100 % of a window with no batch in it."""
    info = me.get("rank_info") or {}
    prog = me.get("progress") or {}
    med = prog.get("median_interval_seconds") or 0.0
    if info.get("exited"):
        return "unknown", "has exited (its process is gone)"
    blocked = info.get("blocked_in_next_seconds") or 0.0
    if blocked >= max(BLOCKED_MIN_S, STUCK_STEPS * med):
        return "next", "has been blocked in next() for %s" % human(blocked)
    halted = None
    if prog.get("batches") == 0:
        halted = "completed no batch in the last %s" % human(window_s)
    elif prog.get("last_batch_age_seconds") is not None and \
            prog["last_batch_age_seconds"] > max(STUCK_MIN_S, STUCK_STEPS * med):
        halted = "completed no batch for %s (its steps took %.3gs)" % (
            human(prog["last_batch_age_seconds"]), med)
    elif not prog and me.get("batches") == 0:  # the cluster view alone
        if (me.get("data_wait_ratio") or 0.0) >= BLOCKED_RATIO:
            return "next", "completed no batch in the last %s and waited in next() all along" % (
                human(window_s))
        halted = "completed no batch in the last %s" % human(window_s)
    elif not prog and me.get("job_scope") == "cluster" and me.get("data_wait_ratio") is None:
        halted = "completed no batch in the last %s" % human(window_s)
    if halted is None:
        return None
    fresh = info and (info.get("last_seen_seconds_ago") or 0.0) <= HOOK_FRESH_S
    # in next() for a moment only (a new epoch's first batch): not placed either way
    return ("elsewhere" if fresh and not blocked else "unknown"), halted


def decide(me, cluster, diag, stacks=None, window_s=900.0, finished=False):
    """(verdict, reason) for rank ``me`` = {rank, pod, node, data_wait_ratio, progress,
    rank_info (the agent's /api/v1/ranks entry), batches (in the window, Prometheus)}.
    ``finished``: the run has ended (``stallscope run``), so its ranks stopped and exited
    on purpose; the verdict is the one on the batches it made."""
    halt = None if finished else stuck(me, window_s)
    st = stacks or {}
    if halt:
        where, why = halt
        text = "Rank %s %s" % (me.get("rank"), why)
        if where == "next" or st.get("main") in LOADER_CLASSES:
            text += ": the loop waits on its loader right now (a hung mount, stuck or dead workers)."
            if st.get("reading"):
                text += " Stacks: " + st["reading"]
            return "input_bound", text
        if where == "elsewhere" or st.get("main") == "outside_loader":
            at = (st.get("processes") or [{}])[0].get("where") if st.get("main") else None
            return "not_input_bound", (
                "%s while not waiting in next(): the loop is stuck outside the loader (%s)." % (
                    text, "at " + at if at else "a collective waiting for another rank, or the step"))
        return "unknown", ("%s: stuck in next() (a hung mount, dead workers) or elsewhere (a "
                           "collective, the step), or no longer reporting; --stacks on node %s "
                           "shows where." % (text, me.get("node")))
    whole = cluster is not None or me.get("job_scope") == "agents"
    j = rules.judge(_rank_wait(me, me.get("data_wait_ratio")), _job(me, cluster, diag), _gpu(diag),
                    scope="job" if whole else "node")
    return j.verdict, j.reason


def starting(row):
    """A row of the job over the line only by its process's first batch (rules.py)."""
    return _rank_wait(row, row.get("data_wait_ratio")).starting


def _rank_wait(r, ratio):
    # the share without the process's first batch: only the agent's numbers have it
    return rules.RankWait(r.get("rank"), r.get("pod"), r.get("node"), ratio,
                          r.get("data_wait_ratio_after_start"))


def _job(me, cluster, diag):
    """The job's worst rank as the source sees it: the cluster's (every rank of the job,
    from Prometheus) or, without it, the agents' (the job's ranks on the nodes of the
    agents asked; with one agent, on this node)."""
    if cluster is not None:
        s = cluster.get("straggler")
        return [_rank_wait(s, s.get("data_wait_ratio"))] if s else []
    if me.get("job_rows") is not None:
        return [_rank_wait(r, r.get("data_wait_ratio")) for r in me["job_rows"]]
    return [_rank_wait(dict(p, node=me.get("node")), p.get("data_wait_ratio"))
            for p in (diag or {}).get("job_ranks_on_node") or []]


def _gpu(diag):
    g = (diag or {}).get("gpu") or {}
    if g.get("idle_ratio") is None:
        return None
    return rules.Gpu(g.get("idle_ratio"), g.get("idle_without_wait_ratio"),
                     (diag or {}).get("gpu_idle_overlap_ratio"))


def too_few(sizing):
    n, need = (sizing or {}).get("num_workers"), (sizing or {}).get("workers_needed")
    return n is not None and need is not None and need > n


def _pod_evidence(signal, value, threshold, direction):
    return {"signal": signal, "value": value, "during_stalls": None, "outside_stalls": None,
            "threshold": threshold, "direction": direction, "scope": "pod"}


def causes_without_agent(cluster):
    """Ranked causes from what Prometheus holds, honestly scored: the correlator's
    published scores (top three of an input-bound rank) with the pod's signals as their
    evidence; signals over their alert line and the loader sizing as level-only
    candidates (their timing against the stalls is unknown without the timelines); a
    computed cause's signal over its line (the transfer's share of the wait) at its
    value, which is what the correlator scores too."""
    evidence = {}
    for s in cluster.get("signals") or []:
        if s["cause"]:
            evidence.setdefault(s["cause"], []).append(
                _pod_evidence(s["signal"], s["value"], s["threshold"], s["direction"]))
    z = cluster.get("sizing") or {}
    if too_few(z):
        evidence.setdefault("too_few_workers", []).append(
            _pod_evidence("workers_needed", z["workers_needed"], z["num_workers"], "above"))
    out = [{"cause": c["cause"], "score": round(c["score"], 4),
            "summary": "The node's correlator scored %s at %.2f (from Prometheus; its timing "
                       "evidence is in the agent, which did not answer)." % (c["cause"], c["score"]),
            "evidence": evidence.get(c["cause"], [])}
           for c in cluster.get("cause_scores") or []]
    seen = {c["cause"] for c in out}
    # Starved workers stretch the handover too (correlate/transfer.py): the transfer's
    # share counts for as much as the CPU shortage leaves to it.
    starved = max([c["score"] for c in out if c["cause"] == "cpu_throttle"] +
                  [LEVEL_ONLY_SCORE for e in evidence.get("cpu_throttle", ())
                   if _over(e["value"], e["threshold"], e["direction"])], default=0.0)
    for cause, rows in sorted(evidence.items()):
        over = [e for e in rows if _over(e["value"], e["threshold"], e["direction"])]
        if cause in seen or not over:
            continue
        e = over[0]
        score = LEVEL_ONLY_SCORE
        known = vocabulary.CAUSE.get(cause)
        if e["signal"] == "workers_needed":
            text = ("The agent's sizing says %d workers keep up, the loader has %d; without the "
                    "node's timelines the stall period is unknown." % (e["value"], e["threshold"]))
        elif known is not None and known.computed:
            score = round(min(1.0, float(e["value"])) * (1.0 - starved), 4)
            text = ("%s was %s over the window (line %s): measured by the hook, that share of the "
                    "rank's data-wait went to getting batches from the workers into the loop, not "
                    "to waiting for them." % (e["signal"], pct(e["value"]), pct(e["threshold"])))
            if starved:
                text += (" But the workers may have been short of CPU (cpu_throttle %.2f), which "
                         "stretches the handover too." % starved)
        else:
            text = ("%s was %s its line (%g) in the window; without the node's timelines its "
                    "timing against the stalls is unknown." % (e["signal"], e["direction"], e["threshold"]))
        out.append({"cause": cause, "score": score, "summary": text, "evidence": over})
    # loader workers killed in the window: scored as the agent's correlator scores them
    # (correlate/deaths.py), from the pod's exit counter and the rank's wait
    out = [codec.cause(c) for c in deaths.merge([codec.decode_cause(c) for c in out],
                                                 cluster.get("death_causes") or [])]
    # The remainder, once: the correlator's own (its published unexplained score, from the
    # timelines) where it gave one, else what the candidates here leave.
    if not any(c["cause"] == "unexplained" for c in out):
        best = max((c["score"] for c in out), default=0.0)
        out.append({"cause": "unexplained", "score": round(1.0 - best, 4),
                    "summary": "What the candidates above do not account for (no correlator "
                               "diagnosis from the node's agent).", "evidence": []})
    return sorted(out, key=lambda c: -c["score"])


def evidence(me, cluster, diag, rank_info, causes):
    """The evidence table: [{signal, value, threshold, status, source, ...}]."""
    rows = []

    def add(signal, value, threshold=None, direction="above", source="", **more):
        over = _over(value, threshold, direction)
        status = "n/a" if value is None else ("info" if over is None else ("over" if over else "ok"))
        rows.append(dict(signal=signal, value=value, threshold=threshold, direction=direction,
                         status=status, source=source, **more))

    src = "prometheus" if cluster is not None else "agent"
    # the job's numbers through agents alone: from every agent asked (agents.py)
    job_src = "agents" if cluster is None and me.get("job_scope") == "agents" else src
    add("data_wait_ratio", me.get("data_wait_ratio"), THRESHOLD, source=src, rank=me.get("rank"))
    jm, jmed = me.get("job_max"), me.get("job_median")
    add("job_max_data_wait_ratio", jm, THRESHOLD, source=job_src)
    add("job_median_data_wait_ratio", jmed, THRESHOLD, source=job_src)
    if jm is not None and jmed and me.get("job_scope") in ("cluster", "agents") and jm >= THRESHOLD:
        # the StallscopeStragglerRank line: one rank far above the job's median
        add("straggler_factor", jm / jmed, CFG.straggler_factor, source=job_src)
    if diag:
        if diag.get("gpu_idle_overlap_ratio") is not None:
            add("gpu_idle_overlap_ratio", diag["gpu_idle_overlap_ratio"], source="agent")
        if diag.get("stall_period_steps"):
            workers = (diag.get("loader") or {}).get("num_workers")
            rows.append({"signal": "stall_period_steps", "value": diag["stall_period_steps"],
                         "threshold": workers, "direction": "equal", "source": "agent",
                         "status": "over" if workers and diag["stall_period_steps"] == workers else "info"})
    sizing = (rank_info or {}).get("sizing") or (cluster or {}).get("sizing")
    if sizing and sizing.get("num_workers") is not None and sizing.get("workers_needed") is not None:
        needed = sizing.get("workers_needed")
        rows.append({"signal": "workers_needed", "value": needed, "threshold": sizing["num_workers"],
                     "direction": "above", "source": "agent" if rank_info else "prometheus",
                     "status": "over" if needed and needed > sizing["num_workers"] else "ok"})
    seen = set()
    seen.update(("workers_needed", "stall_period_steps"))
    for c in causes[:3]:
        for e in c.get("evidence") or []:
            value = e.get("during_stalls")
            value = e.get("value") if value is None else value
            if e.get("signal") in seen or not isinstance(value, (int, float)):
                continue
            seen.add(e["signal"])
            add(e["signal"], value, e.get("threshold"), e.get("direction", "above"),
                source="agent" if diag else "prometheus", outside_stalls=e.get("outside_stalls"),
                cause=c["cause"])
    for s in (cluster or {}).get("signals") or []:
        if s["signal"] not in seen:
            seen.add(s["signal"])
            add(s["signal"], s["value"], s["threshold"], s["direction"], source="prometheus",
                cause=s["cause"])
    return rows
