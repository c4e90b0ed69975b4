"""``run()``: the cluster view, the node detail and (optionally) the stacks, merged into
one typed Report (document.py; its JSON, by document.encode, is the contract of
``stallscope diagnose --json``, docs/diagnose.md).
A source that fails becomes a warning when another one can still answer; only when
nothing can does ``run`` raise DiagnoseError (exit 2).
"""
from __future__ import annotations

import datetime
import statistics
import time
from typing import Any

from ..correlate import rules
from ..correlate.model import Budget, Component, Diagnosis
from . import agents as agents_mod
from . import cluster as cluster_mod
from . import ended as ended_mod
from . import fetch, nextsteps, outlook, verdict
from . import node as node_mod
from . import stacks as stacks_mod
from . import window as durations
from .document import ClusterView, JobRank, NodeView, Report, Sizing, Source, Subject
from .errors import DiagnoseError
from .prom import Prometheus, selector

EXIT = {"healthy": 0, "input_bound": 1, "not_input_bound": 1, "unknown": 2}


def exit_code(doc: Report) -> int:
    """0 no stall, 1 a stall (this rank's loader, or a straggler it waits for), 2 unknown."""
    return EXIT.get(doc.verdict, 2)


def _cluster(prometheus_url: str, pod: str, namespace: str | None, w: float, fallback: bool,
             sources: list[Source], warnings: list[str], at: float | None = None) -> ClusterView | None:
    prom = Prometheus(prometheus_url, now=at)
    try:
        view = cluster_mod.view(prom, pod, namespace, w)
    except fetch.SourceError as e:
        what = "Prometheus unreachable at %s: %s" % (prom.url, e.message) if isinstance(
            e, fetch.Unreachable) else "Prometheus at %s failed: %s" % (prom.url, e.message)
        sources.append(Source("prometheus", prom.url, False, error=e.message))
        if not fallback:
            raise DiagnoseError(what) from e
        warnings.append(what + "; showing the node's view only")
        return None
    except DiagnoseError as e:
        sources.append(Source("prometheus", prom.url, False, error=str(e)))
        if not fallback:
            raise
        warnings.append("%s; showing the node's view only" % e)
        return None
    sources.append(Source("prometheus", prom.url, True))
    return view


def _node(urls: list[str], pod: str, namespace: str | None, w: float, cl: ClusterView | None,
          sources: list[Source], warnings: list[str], alone: bool) -> NodeView | None:
    """The node detail from the first agent of ``urls`` that tracks the pod (with several
    agents given, the pod's node is not known before asking)."""
    rank, job = (cl.rank, cl.job) if cl is not None else (None, None)
    failed: list[tuple[str, Exception]] = []
    for url in urls:
        try:
            view = node_mod.view(url, pod, namespace, w, rank=rank, job=job)
        except (fetch.SourceError, node_mod.NoRank) as e:
            failed.append((url, e))
            continue
        sources.append(Source("agent", view.url, True, node=view.node))
        warnings.extend(view.notes)
        return view
    for url, err in failed:
        sources.append(Source("agent", fetch.base_url(url), False, error=_message(err)))
    url, worst = failed[-1] if len(failed) == 1 else _worst_failure(failed)
    msg = _message(worst)
    what = ("agent unreachable at %s: %s" % (fetch.base_url(url), msg)
            if isinstance(worst, fetch.Unreachable) else msg if isinstance(worst, node_mod.NoRank)
            else "agent at %s failed: %s" % (fetch.base_url(url), msg))
    if len(failed) > 1:
        what = "none of the %d agents tracks pod %s (%s)" % (len(failed), pod, what)
    if alone:
        raise DiagnoseError(what) from worst
    warnings.append(what + "; showing the Prometheus view only")
    return None


def _message(e: Exception) -> str:
    return e.message if isinstance(e, fetch.SourceError) else str(e)


def _worst_failure(failed: list[tuple[str, Exception]]) -> tuple[str, Exception]:
    """The failure to report when no agent answered for the pod: one that tracks no such
    pod says more than one that could not be reached."""
    return next(((u, e) for u, e in failed if isinstance(e, node_mod.NoRank)), failed[-1])


def _urls(agent_url: Any) -> list[str]:
    if not agent_url:
        return []
    return [agent_url] if isinstance(agent_url, str) else list(agent_url)


def _identity(cl: ClusterView | None, nd: NodeView | None, others: list[JobRank] | None = None) -> Subject:
    """This rank and its job's numbers, from the cluster when it answered, else from the
    agents: the rank's own (its node's ranks of the job) and, with ``others`` (rows from
    the other agents given, agents.py), the job's ranks on their nodes too."""
    if cl is not None:
        return Subject(cl.job, cl.rank, cl.pod, cl.namespace, cl.node, cl.data_wait_ratio,
                       cl.job_max_data_wait_ratio, cl.job_median_data_wait_ratio, "cluster", cl.job_ranks,
                       progress=nd.progress if nd is not None else None,
                       rank_info=nd.rank if nd is not None else None, batches=cl.batches)
    assert nd is not None
    r, d = nd.rank, nd.diagnosis
    ratio = d.data_wait_ratio if d is not None else None
    if ratio is None and d is None and nd.timeline:  # the agent gave no diagnosis
        ratio = node_mod.timeline_ratio(nd.timeline)
    node = r.node or nd.node
    source = "agent %s" % nd.url
    after = d.loop.data_wait_ratio_after_start if d is not None and d.loop is not None else None
    rows = [JobRank(r.rank, r.pod, node, ratio, after, source)]
    rows += [JobRank(p.rank, p.pod, node, p.data_wait_ratio, p.data_wait_ratio_after_start, source)
             for p in (d.job_ranks_on_node if d is not None else ())]
    rows += others or []
    ratios = [x.data_wait_ratio for x in rows if x.data_wait_ratio is not None]
    return Subject(r.job, r.rank, r.pod, r.namespace, node, ratio,
                   max(ratios) if ratios else None, statistics.median(ratios) if ratios else None,
                   "agents" if others is not None else "node", len(ratios), after, tuple(rows),
                   nd.progress, r)


def _straggler(cl: ClusterView | None, diag: Diagnosis | None, me: Subject) -> JobRank | None:
    """The job's worst rank, named only when it waits over the line and the job has other
    ranks (rules.names_straggler, the one rule both paths apply); where no rank with
    batches is, a rank its agent found hung in next() (diagnosis._victim_of_hang: a hung
    rank has no completed batch, so no share in Prometheus, issue 49)."""
    hung = _hung_peer(diag)
    if cl is not None:
        worst = cl.straggler
        return worst if worst is not None and rules.names_straggler(worst.data_wait_ratio, cl.job_ranks) \
            else hung
    if me.job_scope == "agents":  # the job's worst rank, as the cluster view names it
        known = [x for x in me.job_rows or () if x.data_wait_ratio is not None and not verdict.starting(x)]
        top = max(known, key=lambda x: (x.data_wait_ratio or 0.0, -_order(x.rank)), default=None)
        return top if top is not None and rules.names_straggler(top.data_wait_ratio, len(known)) else hung
    s = diag.straggler if diag is not None else None
    if s is None or s.rank is None:
        return None
    return JobRank(s.rank, s.pod, s.node, s.data_wait_ratio)


def _hung_peer(diag: Diagnosis | None) -> JobRank | None:
    """The straggler the agent named because it is hung in next(), or None."""
    s = diag.straggler if diag is not None else None
    if s is None or s.rank is None or not s.hung:
        return None
    return JobRank(s.rank, s.pod, s.node, s.data_wait_ratio)


def _order(rank: Any) -> float:
    try:
        return float(rank)
    except (TypeError, ValueError):
        return 0.0


def _top(cl: ClusterView | None, me: Subject, k: int = 10) -> tuple[JobRank, ...]:
    """The job's slowest ranks, each with the source it came from."""
    if cl is not None:
        return tuple(JobRank(r.rank, r.pod, r.node, r.data_wait_ratio, source="prometheus")
                     for r in cl.top_ranks)
    if me.job_scope != "agents":
        return ()
    known = [x for x in me.job_rows or () if x.data_wait_ratio is not None]
    return tuple(sorted(known, key=lambda x: -(x.data_wait_ratio or 0.0))[:k])


# The agent keeps this much of a rank's timeline (agent/options.py --timeline): a report
# about a moment further back is Prometheus's alone (issue 36)
AGENT_HORIZON_S = 900.0


def alert_start(prometheus_url: str, name: str, pod: str, namespace: str | None) -> float:
    """When the last instance of alert ``name`` about ``pod`` (or about its job, for a
    job-level alert) became active, from Prometheus's ALERTS_FOR_STATE (its value is the
    instance's activeAt), over the last ALERT_LOOKBACK."""
    prom = Prometheus(prometheus_url)
    ns = {"namespace": namespace} if namespace else {}
    try:
        jobs = {r.get("job") for r, _ in prom.query("last_over_time(stallscope_step_seconds_count%s[%s])" % (
            selector(pod=pod, **ns), ALERT_LOOKBACK))}
        rows = prom.query("max_over_time(ALERTS_FOR_STATE%s[%s])" % (selector(alertname=name, **ns),
                                                                     ALERT_LOOKBACK))
    except fetch.SourceError as e:
        raise DiagnoseError("Prometheus at %s: %s" % (prometheus_url, e.message)) from e
    starts = [v for r, v in rows if v is not None and (r.get("pod") == pod or (
        "pod" not in r and r.get("job") in jobs))]
    if not starts:
        raise DiagnoseError("no %s alert about pod %s (or its job) on record in the last %s" % (
            name, pod, ALERT_LOOKBACK))
    return max(starts)


ALERT_LOOKBACK = "7d"


def run(pod: str, namespace: str | None = None, prometheus_url: str | None = None, agent_url: Any = None,
        window: str = "15m", stacks: bool = False, plot: str | None = None, finished: bool = False,
        at: float | None = None, alert: str | None = None) -> Report:
    """Diagnose ``pod``; returns the Report (see render.render_text, exit_code).
    ``finished``: the run is over (``stallscope run``): stopped ranks are not stuck ones.
    ``agent_url=False``: Prometheus alone, no agent asked (as when the node's agent is
    down: the lab checks both paths name one cause)."""
    try:
        w = durations.parse(window)
    except ValueError as e:
        raise DiagnoseError(str(e)) from None
    if not prometheus_url and agent_url is not False and not agent_url or \
            agent_url is False and not prometheus_url:
        raise DiagnoseError("no source: give --prometheus URL (or set STALLSCOPE_PROMETHEUS_URL) "
                            "or --agent URL")
    t0 = time.monotonic()
    sources: list[Source] = []
    warnings: list[str] = []
    if alert is not None:
        if not prometheus_url:
            raise DiagnoseError("--alert needs --prometheus: alerts are on record there")
        if at is not None:
            raise DiagnoseError("give --at or --alert, not both")
        # centred on the alert's start: the window ending half a window after it, or now
        # while that is still to come (a pending or young alert). Its start is said as
        # Prometheus has it (issue 52: the window's centre was printed, 5 minutes before
        # the job began, while the alert was pending)
        began = alert_start(prometheus_url, alert, pod, namespace)
        at = min(time.time(), began + w / 2)
        warnings.append("%s %s, active since %s%s" % (
            "centred on" if at == began + w / 2 else "about", alert,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
            "" if at == began + w / 2 else "; the window ends now (%s after that)" % durations.human(
                max(0.0, at - began))))
    if at is not None:
        # after the fact (issue 36): the window ending at ``at``, from Prometheus; the
        # agent only while its timeline still holds that moment
        age = time.time() - at
        if not prometheus_url:
            raise DiagnoseError("--at needs --prometheus: the past is in Prometheus, not in the agent")
        if age < -60:
            raise DiagnoseError("--at %s is in the future" % time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                        time.gmtime(at)))
        if age > AGENT_HORIZON_S - w:
            agent_url = False
            warnings.append("after the fact: the window ends %s ago, past the agent's timeline; from "
                            "Prometheus alone (recorded cause scores and signals), no stacks or live "
                            "timeline for then" % durations.human(age))
            if stacks:
                warnings.append("stacks: not taken, the moment asked about is past")
                stacks = False
    ended = None
    if at is None and prometheus_url and not finished:
        # paged about a job that has since ended (issue 52): its last minutes, from Prometheus
        ended = ended_mod.ended_at(prometheus_url, pod, namespace, _urls(agent_url) or None,
                                   prometheus_alone=agent_url is False)
        if ended is not None:
            at, w, finished = ended, min(w, ended_mod.LAST_WINDOW_S), True
            agent_url = False
            if stacks:
                warnings.append("stacks: not taken, the job has ended")
                stacks = False
    cl = None
    if prometheus_url:
        cl = _cluster(prometheus_url, pod, namespace, w, bool(agent_url), sources, warnings, at)
    urls = [] if agent_url is False else (
        _urls(agent_url) or ([cl.agent_url] if cl is not None and cl.agent_url else []))
    url = urls[0] if urls else None
    nd = None
    if urls:
        nd = _node(urls, pod, namespace or (cl.namespace if cl is not None else None), w, cl,
                   sources, warnings, alone=cl is None)
    elif cl is not None and agent_url is not False:
        warnings.append("no agent for node %s in Prometheus (stallscope_agent_build_info): give "
                        "--agent URL for the node's detail" % cl.node)
    diag = nd.diagnosis if nd is not None else None
    others = None
    if cl is None and nd is not None and len(urls) > 1:  # the job across the agents' nodes (agents.py)
        rest = [u for u in urls if fetch.base_url(u) != nd.url]
        others, more, notes = agents_mod.job_rows(rest, nd.rank.job or "", nd.rank.namespace, w)
        sources.extend(more)
        warnings.extend(notes)
    me = _identity(cl, nd, others)
    stack_doc = _stacks(nd, warnings) if stacks else None
    v, reason = verdict.decide(me, cl, diag, stack_doc, w, finished=finished)
    unseen = verdict.unseen_ranks(me, cl)
    if unseen and cl is not None:  # said in the JSON too, whatever the verdict (issue 35)
        warnings.append("partial view: %d of the job's %d ranks have no series, their node's agent "
                        "not scraped (%s); the job's max, median and straggler cover the other %d "
                        "only" % (unseen, me.job_ranks + unseen, verdict.dark_list(cl), me.job_ranks))
    elif unseen:
        warnings.append("partial view: the agents asked see %d of the job's %d ranks; the job's "
                        "max, median and straggler cover those only" % (me.job_ranks, me.job_ranks + unseen))
    if diag is not None and v == diag.verdict:
        causes = diag.causes
    elif v == "input_bound" and cl is not None:
        causes = tuple(verdict.causes_without_agent(cl))
    else:
        causes = ()
    info = nd.rank if nd is not None else None
    rank_h, job_h = outlook.headroom(me.data_wait_ratio, me.job_max, me.job_scope, diag)
    doc = Report(
        verdict=v, reason=reason, causes=causes, job=me.job, rank=me.rank, pod=me.pod or pod,
        namespace=me.namespace, node=me.node, data_wait_ratio=me.data_wait_ratio,
        job_max_data_wait_ratio=me.job_max, job_median_data_wait_ratio=me.job_median,
        job_scope=me.job_scope, job_ranks=me.job_ranks, threshold=cluster_mod.THRESHOLD,
        straggler=_straggler(cl, diag, me), top_ranks=_top(cl, me),
        pod_ranks=cl.pod_ranks if cl is not None else (),
        ranks_without_batches=cl.ranks_without_batches if cl is not None else (),
        since=cl.since if cl is not None else None, window_seconds=w,
        generated_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        loader=(info.loader if info is not None else None) or (diag.loader if diag is not None else None),
        sizing=(info.sizing if info is not None else None) or (cl.sizing if cl is not None else Sizing()),
        pids={"main": info.pid, "workers": list(info.worker_pids)} if info is not None else None,
        progress=me.progress, blocked_in_next_seconds=info.blocked_in_next_seconds if info else None,
        # why its loader workers died (the agent's workers exporter, issue 18)
        worker_deaths=info.worker_deaths if info is not None else (),
        # ... and the pod's exits by reason over the window, as Prometheus counted them
        worker_exits=cl.worker_exits if cl is not None else (),
        # the agent's triage of a next() call blocked past its threshold (agent/parts/hangs.py)
        hang=(info.hang if info is not None else None) or (diag.hang if diag is not None else None),
        gpu=diag.gpu if diag is not None else None,
        stall_period_steps=diag.stall_period_steps if diag is not None else None,
        agent_verdict=diag.verdict if diag is not None else None,
        sli_expr=cl.sli_expr if cl is not None else None,
        agent_url=(nd.url if nd is not None else None) or (fetch.base_url(url) if url else None),
        prometheus_url=fetch.base_url(prometheus_url) if prometheus_url else None,
        steady_data_wait_ratio=_steady(cl, diag), handoff_ratio=verdict.handoff(cl, diag),
        prediction=outlook.prediction(v, diag), rank_headroom=rank_h, job_headroom=job_h,
        cost=outlook.cost(v, causes, me.data_wait_ratio, me.job_max, me.job_ranks, me.job_scope),
        change=diag.change if diag is not None else None,
        evidence=tuple(verdict.evidence(me, cl, diag, info, causes)), stacks=stack_doc,
        budget=(diag.budget if diag is not None and v == diag.verdict == "input_bound"
                else _published_budget(cl, w) if v == "input_bound" else None),
        sources=tuple(sources), warnings=tuple(warnings))
    doc = _with_setup(doc, diag)
    if ended is not None:
        doc = _with(doc, ended_at=ended)
    if plot:
        doc = _with(doc, plot=_plot(plot, doc, nd, warnings, at), warnings=tuple(warnings))
    doc = _with(doc, next_steps=tuple(nextsteps.steps(doc)),
                commands=tuple(nextsteps.commands(doc, doc.prometheus_url, doc.agent_url)))
    return _with(doc, elapsed_seconds=round(time.monotonic() - t0, 3))


CHECKS_UNKNOWN = ("set-up checks not known: only the node's agent judges them (from the loader's "
                  "settings, the pod's CPU quota, /dev/shm and GPU); give --agent URL")


def _with_setup(doc: Report, diag: Diagnosis | None) -> Report:
    """The agent's set-up warnings and the loader's own error (issue 32). A cause the
    error names leads whatever the verdict: the loader stopped on it."""
    if diag is None:
        return _with(doc, checks_note=CHECKS_UNKNOWN)
    doc = _with(doc, setup_warnings=diag.warnings, checks_unknown=diag.checks_unknown,
                loader_error=diag.loader_error)
    err = diag.loader_error
    if err is not None and err.cause is not None:
        named = diag.cause(err.cause)
        if named is not None and (not doc.causes or doc.causes[0].cause != err.cause):
            doc = _with(doc, causes=(named,) + tuple(c for c in doc.causes if c.cause != err.cause))
    return doc


def _steady(cl: ClusterView | None, diag: Diagnosis | None) -> float | None:
    """The rank's data-wait share without iterator starts: Prometheus's when it answered
    (the counters the alert reads), else the agent's (its timelines)."""
    if cl is not None and cl.steady_data_wait_ratio is not None:
        return cl.steady_data_wait_ratio
    return diag.loop.steady_data_wait_ratio if diag is not None and diag.loop is not None else None


def _published_budget(cl: ClusterView | None, window_s: float) -> Budget | None:
    """The time budget the agent published for the pod, as Prometheus holds it (its shares;
    the seconds are those shares of the rank's steady wait over the window), when the
    agent itself is not asked: the same components, causes and shares either way."""
    if cl is None or not cl.budget_shares:
        return None
    ratio = cl.steady_data_wait_ratio if cl.steady_data_wait_ratio is not None else cl.data_wait_ratio
    wait = (ratio or 0.0) * window_s
    if wait <= 0:
        return None
    comps = tuple(Component(name, share * wait, share, cause or None)
                  for name, cause, share in cl.budget_shares)
    handoff = sum(c.seconds for c in comps if c.name.startswith("loop."))
    return Budget(wait, max(0.0, wait - handoff), handoff, comps, None,
                  any(c.name.startswith("workers.") for c in comps))


def _with(doc: Report, **changes: Any) -> Report:
    import dataclasses
    return dataclasses.replace(doc, **changes)


def _stacks(nd: NodeView | None, warnings: list[str]) -> dict[str, Any]:
    if nd is None:
        msg = "stacks: --stacks needs the node's agent (it knows the rank's PIDs)"
        warnings.append(msg)
        return {"error": msg}
    try:
        r = nd.rank
        return stacks_mod.collect({"rank": r.rank, "pid": r.pid, "ns_pid": r.ns_pid,
                                   "worker_pids": list(r.worker_pids), "node": nd.node})
    except stacks_mod.StacksError as e:
        warnings.append("stacks: %s" % e)
        return {"error": str(e)}


def _plot(path: str, doc: Report, nd: NodeView | None, warnings: list[str],
          at: float | None = None) -> str | None:
    from . import plot  # matplotlib only when asked for
    try:
        return plot.write(path, doc, nd.timeline if nd is not None else None, at)
    except plot.PlotError as e:
        warnings.append("plot: %s" % e)
        return None
