"""What to do next, from the runbooks (runbooks/<Alert>.md, one per alert of the mixin),
and the exact commands for a deeper look."""
from __future__ import annotations

import shlex

from .. import vocabulary
from ..correlate.model import Cause
from ..report import UNREPORTED
from ..vocabulary import ATTRIBUTE
from . import window
from .document import NextStep, Report, Sizing

RUNBOOK = "runbooks/%s.md"


def runbook_alert(cause: Cause) -> str:
    """The alert whose runbook fits a ranked cause: of a cause paged by several alerts,
    the one on the signal that explained most of the wait (evidence is ranked)."""
    c = vocabulary.CAUSE.get(cause.cause) or vocabulary.cause("unexplained")
    by_signal = {a.signal: a.name for a in c.alerts}
    for e in cause.evidence:
        if e.signal in by_signal:
            return by_signal[e.signal]
    return c.runbook_alert


def ruled_out(doc: Report) -> frozenset[str]:
    """The settings the top cause's prediction says will not help by themselves: no next
    step may recommend them (issue 29: a cpu_contention report led with "Raise
    num_workers" while its prediction said more workers would not help)."""
    p = doc.causes[0].prediction if doc.causes else None
    return frozenset(p.rules_out) if p is not None else frozenset()


def cause_step(c: Cause, doc: Report, banned: frozenset[str]) -> NextStep:
    """The step for one ranked cause: its prediction's change where one was modelled (and
    is not ruled out), else the vocabulary's advice."""
    known = vocabulary.CAUSE.get(c.cause) or vocabulary.cause("unexplained")
    alert, text = runbook_alert(c), known.advice
    if set(known.advises) & banned:
        text = known.advice_otherwise
    p = c.prediction
    if c.cause == "too_few_workers" and "num_workers" not in banned and doc.sizing.workers_needed \
            and (p is None or not p.configured):
        text = _more_workers(doc.sizing, doc)
    if p is not None and p.configured and not (p.settings.names() & banned):
        # the measured change replaces the generic advice's first step
        head = "%s%s: predicted data-wait %.1f%%, step %.3gs." % (
            p.change[0].upper(), p.change[1:], 100 * p.predicted_data_wait_ratio,
            p.predicted_step_seconds)
        if c.cause == "too_few_workers":
            # the replayed worker count stands instead of the sizing rule's, not beside it
            # (two different counts in one step read as a contradiction)
            persistent = (doc.loader or UNREPORTED).persistent_workers
            text = head + ("" if persistent else " Set persistent_workers=True.")
            text += beyond_cores(doc, p.settings.num_workers)
        else:
            text = "%s %s" % (head, text)
    elif p is not None and not p.configured and p.rules_out:
        text = "%s (%s)." % (text.rstrip("."), p.change)
    if c.cause == "too_few_workers" and not (p is not None and p.configured) \
            and (doc.loader or UNREPORTED).persistent_workers is False:
        # only where it is off (issue 49: a report told a loader that had it to set it)
        text += " Set persistent_workers=True."
    return NextStep(text, RUNBOOK % alert if alert else None)


def steps(doc: Report) -> list[NextStep]:
    out: list[NextStep] = []

    def add(alert: str | None, text: str) -> None:
        out.append(NextStep(text, RUNBOOK % alert if alert else None))

    if doc.verdict == "healthy":
        add(None, "Nothing to do for this pod: its loader keeps up.")
    elif doc.verdict == "not_input_bound":
        s = doc.straggler
        if s is not None and s.pod:
            add("StallscopeStragglerRank", "Diagnose the straggler: stallscope diagnose %s%s "
                "(rank %s on node %s)." % (s.pod, " -n %s" % doc.namespace if doc.namespace else "",
                                           s.rank, s.node))
        else:
            add("StallscopeStragglerRank", "Find the rank this one waits for (it is not input-bound "
                "itself).")
    elif doc.verdict == "input_bound":
        named = [c for c in doc.causes if c.score >= ATTRIBUTE] or list(doc.causes[:1])
        banned = ruled_out(doc)
        out.extend(cause_step(c, doc, banned) for c in named[:2])
        if doc.job_ranks > 1:
            add("StallscopeDataWaitHigh", "Compare the worst and the median rank: close means the "
                "whole job starves (shared storage, per-sample cost); far apart means one bad rank "
                "or node.")
    else:
        add("StallscopeRankSilent", "Check that the rank is alive and iterating, and that its hook "
            "reaches the node's agent.")
    if any(r.signal == "hook_dropped_events" and r.status == "over" for r in doc.evidence):
        add("StallscopeHookDroppingEvents", "The hook dropped events: the numbers above undercount.")
    return out


def _more_workers(z: Sizing, doc: Report) -> str:
    text = "Raise num_workers from %s to %s" % (z.num_workers, z.workers_needed)
    if z.quota_limited:
        # More workers than the CPU quota can run only share the same throttled CPU time.
        keep_up = z.workers_to_keep_up
        text += ("; that is all the pod's CPU quota allows: raise its CPU limit%s" %
                 (" (keeping up needs %s workers)" % keep_up if keep_up else ""))
    if not (doc.loader or UNREPORTED).persistent_workers:
        text += "; set persistent_workers=True"
    return text + "." + beyond_cores(doc, z.workers_needed)


OFF_CPU = 0.5  # workers busy on the CPU less than this share of the time mostly wait


def beyond_cores(doc: Report, count: int | None) -> str:
    """torch warns when num_workers exceeds the CPUs the process may use ("Our suggested
    max number of worker in current system is 2"): a count past them, for workers that
    mostly wait off the CPU (reads, sleeps, a remote store), answers that warning (issue
    52: it went unanswered while the report said more workers would help)."""
    if not isinstance(count, int):
        return ""
    cores = doc.sizing.cfs_quota_cores or _usable_cpus()
    busy = next((r.value for r in doc.evidence if r.signal == "workers_cpu_ratio / num_workers"), None)
    if not cores or count <= cores or not isinstance(busy, (int, float)) or busy >= OFF_CPU:
        return ""
    return (" torch will warn that %d workers are more than its suggested maximum (%g, the CPUs "
            "it may use); its workers here are %.0f%% off the CPU (waiting, not computing), so "
            "more of them than cores still help." % (count, cores, 100 * (1 - busy)))


def _usable_cpus() -> int | None:
    import os
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def commands(doc: Report, prometheus_url: str | None = None, agent_url: str | None = None) -> list[str]:
    """The commands for a deeper look, each runnable as printed (issue 52: the ``--plot``
    one lacked the source the report came from and failed with "no source"): the source
    given (Prometheus, else the agent), ``-n`` only where there is a namespace (outside
    Kubernetes ``-n default`` named a namespace the pod is not in)."""
    pod, ns, w = doc.pod, doc.namespace, doc.window_seconds
    source = (" --prometheus %s" % shlex.quote(prometheus_url) if prometheus_url else
              " --agent %s" % shlex.quote(agent_url) if agent_url else "")
    space = " -n %s" % shlex.quote(ns) if ns else ""
    base = "stallscope diagnose %s%s --window %s%s" % (shlex.quote(pod), space, window.promql(w), source)
    out = []
    if agent_url:
        stacks = base if " --agent " in base else "%s --agent %s" % (base, shlex.quote(agent_url))
        out.append("%s --stacks   # on node %s (py-spy needs the node's PIDs)" % (stacks, doc.node))
    out.append("%s --plot %s.png" % (base, shlex.quote(pod)))
    if agent_url:
        q = "pod=%s&seconds=%d" % (pod, w)
        out.append("curl -s '%s/api/v1/diagnosis?%s'" % (agent_url, q))
        if doc.rank is not None:
            out.append("curl -s '%s/api/v1/timeline?rank=%s&pod=%s&seconds=%d'" % (
                agent_url, doc.rank, pod, w))
    if prometheus_url and doc.sli_expr:
        out.append("curl -sG %s/api/v1/query --data-urlencode %s" % (
            prometheus_url, shlex.quote("query=topk(10, %s)" % doc.sli_expr)))
    s = doc.straggler
    if doc.verdict == "not_input_bound" and s is not None and s.pod and s.pod != pod:
        out.append("stallscope diagnose %s%s%s" % (shlex.quote(s.pod), space, source))
    return out
