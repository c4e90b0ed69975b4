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
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import vocabulary
from ..correlate import causes as causes_mod
from ..correlate import deaths, rules
from ..correlate.model import Cause, Diagnosis, Evidence
from ..mixin.config import DEFAULT as CFG
from ..report import UNREPORTED
from .cluster import THRESHOLD
from .document import ClusterView, EvidenceRow, JobRank, RankInfo, Report, Sizing, Subject
from .window import human

LEVEL_ONLY_SCORE = 0.5  # a signal over its line, timing unknown: a candidate, not a finding
STUCK_MIN_S = 30.0      # no batch for this long, and for STUCK_STEPS typical steps: stuck
STUCK_STEPS = 20
BLOCKED_MIN_S = 5.0     # in next() for this long (and STUCK_STEPS steps): blocked on the loader
BLOCKED_RATIO = 0.9     # no batch in the window, yet waiting in next() for most of it
HOOK_FRESH_S = 15.0     # the hook reports at least every 5 s (its heartbeat)
LOADER_CLASSES = ("ipc_wait", "fetch", "decode", "collate")  # main thread inside the DataLoader


def pct(x: float | None) -> str:
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def _over(value: float | None, threshold: float | None, direction: str = "above") -> bool | None:
    if value is None or threshold is None:
        return None
    if direction == "equal":
        return value == threshold
    return value > threshold if direction == "above" else value < threshold


def stuck(me: Subject, window_s: float) -> tuple[str, str] | None:
    """(where, why) when the rank's batches stopped, else None; where is ``next`` (the hook
    says the loop is blocked in next() right now), ``elsewhere`` (batches stopped, the
    hook still reports, and the loop is not in next()) or ``unknown``.

    The hook reports a next() call still in progress (blocked_since_ns): the agent
    shows it as ``blocked_in_next_seconds`` and adds it to the data-wait and step sums,
    so in Prometheus a blocked rank waits ~100 % of a window with no batch in it."""
    info, prog = me.rank_info, me.progress
    med = (prog.median_interval_seconds if prog is not None else None) or 0.0
    if info is not None and info.exited:
        return "unknown", "has exited (its process is gone)"
    blocked = (info.blocked_in_next_seconds if info is not None else None) or 0.0
    if blocked >= max(BLOCKED_MIN_S, STUCK_STEPS * med):
        return "next", "has been blocked in next() for %s" % human(blocked)
    halted = None
    if prog is not None and prog.batches == 0:
        halted = "completed no batch in the last %s" % human(window_s)
    elif prog is not None and prog.last_batch_age_seconds is not None and \
            prog.last_batch_age_seconds > max(STUCK_MIN_S, STUCK_STEPS * med):
        halted = "completed no batch for %s (its steps took %.3gs)" % (
            human(prog.last_batch_age_seconds), med)
    elif prog is None and me.batches == 0:  # the cluster view alone
        if (me.data_wait_ratio or 0.0) >= BLOCKED_RATIO:
            return "next", "completed no batch in the last %s and waited in next() all along" % (
                human(window_s))
        halted = "completed no batch in the last %s" % human(window_s)
    elif prog is None and me.job_scope == "cluster" and me.data_wait_ratio is None:
        halted = "completed no batch in the last %s" % human(window_s)
    if halted is None:
        return None
    fresh = info is not None and (info.last_seen_seconds_ago or 0.0) <= HOOK_FRESH_S
    # in next() for a moment only (a new epoch's first batch): not placed either way
    return ("elsewhere" if fresh and not blocked else "unknown"), halted


def decide(me: Subject, cluster: ClusterView | None, diag: Diagnosis | None,
           stacks: Mapping[str, Any] | None = None, window_s: float = 900.0,
           finished: bool = False) -> tuple[str, str]:
    """(verdict, reason) for rank ``me``. ``finished``: the run has ended (``stallscope
    run``), so its ranks stopped and exited on purpose; the verdict is the one on the
    batches it made."""
    halt = None if finished else stuck(me, window_s)
    st = stacks or {}
    if halt:
        where, why = halt
        text = "Rank %s %s" % (me.rank, why)
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
                           "shows where." % (text, me.node))
    whole = cluster is not None or me.job_scope == "agents"
    mine = dataclasses.replace(_rank_wait(me.rank, me.pod, me.node, me.data_wait_ratio,
                                          me.data_wait_ratio_after_start), handoff=handoff(cluster, diag))
    j = rules.judge(mine, _job(me, cluster, diag), _gpu(diag), scope="job" if whole else "node")
    unseen = unseen_ranks(me, cluster)
    if j.verdict == "healthy" and unseen and cluster is not None:
        # issue 35: through Prometheus, ranks whose node's agent is down have no series
        return "unknown", ("Rank %s's own loader keeps up, but %d of the job's %d ranks stopped "
                           "reporting with their node's agent down (%s; not scraped: %s): whether "
                           "it waits for one of them is unknown. Bring that agent back, or look "
                           "at those ranks on their node." % (
                               me.rank, unseen, me.job_ranks + unseen, dark_list(cluster),
                               ", ".join(cluster.dark_agents)))
    if j.verdict == "healthy" and unseen:
        # issue 35: a victim on this node waits in the collective for a straggler the agents
        # asked do not see; "healthy" would be a guess about ranks nobody reported
        return "unknown", ("Rank %s's own loader keeps up, but the agent%s asked see%s %d of the "
                           "job's %d ranks: whether it waits for a straggler on another node is "
                           "unknown. Diagnose through Prometheus, or give --agent for every node "
                           "of the job." % (me.rank, "s" if me.job_scope == "agents" else "",
                                            "" if me.job_scope == "agents" else "s",
                                            me.job_ranks, me.job_ranks + unseen))
    return j.verdict, j.reason


def unseen_ranks(me: Subject, cluster: ClusterView | None) -> int:
    """How many of the job's ranks the report cannot see: through Prometheus, those whose
    node's agent is down (cluster.dark_ranks); through the agents asked, the job's world
    size (as its hook reported it) less the ranks they see."""
    if cluster is not None:
        return len(cluster.dark_ranks)
    world = me.rank_info.world_size if me.rank_info is not None else None
    if not world:
        return 0
    return max(0, world - me.job_ranks)


def dark_list(cluster: ClusterView) -> str:
    """The ranks Prometheus lost with their agents: "rank 2 (pod p on node n), ..."."""
    return ", ".join("rank %s (pod %s on node %s)" % (r.rank, r.pod, r.node) for r in cluster.dark_ranks)


def handoff(cluster: ClusterView | None, diag: Diagnosis | None) -> float | None:
    """The rank's share of the step spent taking batches over: Prometheus's when it answered
    (beside its data-wait share, from the same counters), else the agent's."""
    if cluster is not None:
        return cluster.handoff_ratio
    return diag.loop.handoff_ratio if diag is not None and diag.loop is not None else None


def keeps_up(doc: Report) -> bool:
    """The report's rank is input-bound only by the per-batch handoff (rules.RankWait)."""
    return doc.verdict == "input_bound" and rules.RankWait(
        doc.rank, doc.pod, doc.node, doc.data_wait_ratio, None, doc.handoff_ratio).keeps_up


def starting(row: JobRank) -> bool:
    """A row of the job over the line only by its process's first batch (rules.py)."""
    return _row_wait(row).starting


def _rank_wait(rank: Any, pod: str | None, node: str | None, ratio: float | None,
               after: float | None = None) -> rules.RankWait:
    # the share without the process's first batch: only the agent's numbers have it
    return rules.RankWait(rank, pod, node, ratio, after)


def _row_wait(r: JobRank) -> rules.RankWait:
    return _rank_wait(r.rank, r.pod, r.node, r.data_wait_ratio, r.data_wait_ratio_after_start)


def _job(me: Subject, cluster: ClusterView | None, diag: Diagnosis | None) -> list[rules.RankWait]:
    """The job's worst rank as the source sees it: the cluster's (every rank of the job,
    from Prometheus) or, without it, the agents' (the job's ranks on the nodes of the
    agents asked; with one agent, on this node)."""
    if cluster is not None:
        s = cluster.straggler
        return [_row_wait(s)] if s is not None else []
    if me.job_rows is not None:
        return [_row_wait(r) for r in me.job_rows]
    return [_rank_wait(p.rank, p.pod, me.node, p.data_wait_ratio, p.data_wait_ratio_after_start)
            for p in (diag.job_ranks_on_node if diag is not None else ())]


def _gpu(diag: Diagnosis | None) -> rules.Gpu | None:
    g = diag.gpu if diag is not None else None
    if g is None or g.idle_ratio is None:
        return None
    return rules.Gpu(g.idle_ratio, g.idle_without_wait_ratio, diag.gpu_idle_overlap_ratio if diag else None)


def _pod_evidence(signal: str, value: float | None, threshold: float | None, direction: str) -> Evidence:
    return Evidence(signal, value, threshold, direction, None, "pod")


def causes_without_agent(cluster: ClusterView) -> list[Cause]:
    """Ranked causes from what Prometheus holds, honestly scored: the correlator's
    published scores (top three of an input-bound rank) with the pod's signals as their
    evidence; signals over their alert line and the loader sizing as level-only
    candidates (their timing against the stalls is unknown without the timelines); a
    computed cause's signal over its line (the transfer's share of the wait) at its
    value, which is what the correlator scores too."""
    evidence: dict[str, list[Evidence]] = {}
    for s in cluster.signals:
        if s.cause:
            evidence.setdefault(s.cause, []).append(
                _pod_evidence(s.signal, s.value, s.threshold, s.direction))
    z = cluster.sizing
    if z.too_few:
        evidence.setdefault("too_few_workers", []).append(
            _pod_evidence("workers_needed", z.workers_needed, z.num_workers, "above"))
    out = [causes_mod.make(cause, score, "The node's correlator scored %s at %.2f (from Prometheus; "
                           "its timing evidence is in the agent, which did not answer)." % (cause, score),
                           evidence.get(cause, []))
           for cause, score in cluster.cause_scores]
    seen = {c.cause for c in out}
    # Starved workers stretch the handover too (correlate/transfer.py): the transfer's
    # share counts for as much as the CPU shortage leaves to it.
    starved = max([c.score for c in out if c.cause == "cpu_throttle"] +
                  [LEVEL_ONLY_SCORE for e in evidence.get("cpu_throttle", ())
                   if _over(e.value, e.threshold, e.direction)], default=0.0)
    for cause, rows in sorted(evidence.items()):
        over = [e for e in rows if _over(e.value, e.threshold, e.direction)]
        if cause in seen or not over:
            continue
        e = over[0]
        score = LEVEL_ONLY_SCORE
        known = vocabulary.CAUSE.get(cause)
        if e.signal == "workers_needed":
            text = ("The agent's sizing says %d workers keep up, the loader has %d; without the "
                    "node's timelines the stall period is unknown." % (e.value or 0, e.threshold or 0))
        elif known is not None and known.computed:
            score = round(min(1.0, float(e.value or 0.0)) * (1.0 - starved), 4)
            text = ("%s was %s over the window (line %s): measured by the hook, that share of the "
                    "rank's data-wait went to getting batches from the workers into the loop, not "
                    "to waiting for them." % (e.signal, pct(e.value), pct(e.threshold)))
            if starved:
                text += (" But the workers may have been short of CPU (cpu_throttle %.2f), which "
                         "stretches the handover too." % starved)
        elif known is not None and known.standing:
            # a condition's level is its evidence on either path; its model needs the
            # timelines, so the score is the level-only one (standing_causes.py)
            text = ("%s was %s its line (%g) in the window: a standing condition of the rank's "
                    "placement or set-up; the agent's model of how much of the wait it explains "
                    "needs the node's timelines." % (e.signal, e.direction, e.threshold or 0))
        else:
            text = ("%s was %s its line (%g) in the window; without the node's timelines its "
                    "timing against the stalls is unknown." % (e.signal, e.direction, e.threshold or 0))
        out.append(causes_mod.make(cause, score, text, over))
    # loader workers killed in the window: scored as the agent's correlator scores them
    # (correlate/deaths.py), from the pod's exit counter and the rank's wait
    out = deaths.merge(out, list(cluster.death_causes))
    # The remainder, once: the correlator's own (its published unexplained score, from the
    # timelines) where it gave one, else what the candidates here leave.
    if not any(c.cause == "unexplained" for c in out):
        best = max((c.score for c in out), default=0.0)
        out.append(causes_mod.make("unexplained", 1.0 - best, "What the candidates above do not account "
                                   "for (no correlator diagnosis from the node's agent)."))
    return causes_mod.order(out)  # the agent's order: one rule set on both paths


def evidence(me: Subject, cluster: ClusterView | None, diag: Diagnosis | None,
             rank_info: RankInfo | None, causes: tuple[Cause, ...] | list[Cause]) -> list[EvidenceRow]:
    """The evidence table."""
    rows: list[EvidenceRow] = []

    def add(signal: str, value: float | None, threshold: float | None = None, direction: str = "above",
            source: str = "", status: str | None = None, **more: Any) -> None:
        over = _over(value, threshold, direction)
        if status is None:
            status = "n/a" if value is None else ("info" if over is None else ("over" if over else "ok"))
        rows.append(EvidenceRow(signal, value, threshold, direction, status, source, **more))

    src = "prometheus" if cluster is not None else "agent"
    # the job's numbers through agents alone: from every agent asked (agents.py)
    job_src = "agents" if cluster is None and me.job_scope == "agents" else src
    add("data_wait_ratio", me.data_wait_ratio, THRESHOLD, source=src, rank=me.rank)
    steady = cluster.steady_data_wait_ratio if cluster is not None else (
        diag.loop.steady_data_wait_ratio if diag is not None and diag.loop is not None else None)
    if steady is not None and me.data_wait_ratio is not None and abs(steady - me.data_wait_ratio) >= 0.001:
        # each epoch's first batch left out (its workers' start-up): the loader's steady pace
        add("steady_data_wait_ratio", steady, THRESHOLD, source=src, rank=me.rank)
    jm, jmed = me.job_max, me.job_median
    add("job_max_data_wait_ratio", jm, THRESHOLD, source=job_src)
    add("job_median_data_wait_ratio", jmed, THRESHOLD, source=job_src)
    if jm is not None and jmed and me.job_scope in ("cluster", "agents") and jm >= THRESHOLD:
        # the StallscopeStragglerRank line: one rank far above the job's median
        add("straggler_factor", jm / jmed, CFG.straggler_factor, source=job_src)
    if diag is not None:
        if diag.gpu_idle_overlap_ratio is not None:
            add("gpu_idle_overlap_ratio", diag.gpu_idle_overlap_ratio, source="agent")
        if diag.stall_period_steps:
            workers = (diag.loader or UNREPORTED).num_workers
            add("stall_period_steps", diag.stall_period_steps, workers, "equal", "agent",
                status="over" if workers and diag.stall_period_steps == workers else "info")
    sizing = (rank_info.sizing if rank_info is not None else None) or (
        cluster.sizing if cluster is not None else Sizing())
    if sizing.num_workers is not None and sizing.workers_needed is not None:
        needed = sizing.workers_needed
        top = causes[0].prediction if causes else None
        # the loader's means say more workers; the top cause's model, which bounds them by
        # every capacity they share, may rule them out: the row does not say "over" then
        # (issue 49: "workers_needed 15 > 4" under a cause that ruled more workers out)
        ruled = top is not None and "num_workers" in top.rules_out
        add("workers_needed", needed, sizing.num_workers, "above", "agent" if rank_info else "prometheus",
            status=("ruled out" if ruled else "over") if needed and needed > sizing.num_workers else "ok")
    seen = {"workers_needed", "stall_period_steps"}
    for c in list(causes)[:3]:
        for e in c.evidence:
            value = e.during_stalls
            if e.signal in seen or not isinstance(value, (int, float)):
                continue
            seen.add(e.signal)
            add(e.signal, value, e.threshold, e.direction, source="agent" if diag else "prometheus",
                outside_stalls=e.outside_stalls, cause=c.cause)
    for s in (cluster.signals if cluster is not None else ()):
        if s.signal not in seen:
            seen.add(s.signal)
            add(s.signal, s.value, s.threshold, s.direction, source="prometheus", cause=s.cause)
    return rows
