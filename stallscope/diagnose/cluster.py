"""The cluster view from Prometheus: which job, rank and node the pod runs, how much its
rank waits on data against the job's max and median, the slowest ranks, since when,
and the node's agent.

The expressions and thresholds are the mixin's (stallscope/mixin/promql.py and
config.py), so the evidence speaks the language of the alert that paged: the SLI of
the mixin's, ``rate(data_wait_sum[w]) / rate(step_sum[w])`` per rank, evaluated raw over
``--window`` rather than read from the 5m recording rule (the window is the user's).
One query returns every rank of the job and the statistics are taken here, so a
2,048-rank job costs one evaluation, not one per statistic.
"""
from __future__ import annotations

import concurrent.futures
import difflib
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import vocabulary
from ..mixin import promql
from ..mixin.config import DEFAULT as CFG
from . import exits as exits_mod
from . import fetch, window
from .document import ClusterView, JobRank, PodSignal, Since, Sizing
from .errors import DiagnoseError
from .prom import Prometheus, label, selector

THRESHOLD = CFG.data_wait_warning  # the data-wait line (vocabulary.DATA_WAIT_LINE)
TOP_K = 5
IDENTITY = ("job", "rank", "pod", "namespace", "node")
# A pod signal's query: (signal, cause, threshold, direction, expression of (matchers, window)).
PodQuery = tuple[str, "str | None", "float | None", str, Callable[[tuple[str, ...], str], str]]


def matchers(**match: str | None) -> tuple[str, ...]:
    return tuple("%s=%s" % (k, label(v)) for k, v in match.items() if v is not None)


def sli(w: str, **match: str | None) -> str:
    expr: str = promql.data_wait_ratio(CFG, matchers(**match), w)
    return expr.replace("\n", " ")


def _rank_row(labels: Mapping[str, str], value: float | None) -> JobRank:
    """A series' labels as a JobRank (Prometheus's label values, the edge)."""
    rank: int | str | None
    try:
        rank = int(labels.get("rank", ""))
    except ValueError:
        rank = labels.get("rank")
    return JobRank(rank, labels.get("pod"), labels.get("node"), value, namespace=labels.get("namespace"),
                   job=labels.get("job"))


def _worst(rows: Iterable[JobRank]) -> JobRank:
    return max(rows, key=lambda r: (r.data_wait_ratio is not None, r.data_wait_ratio or 0.0))


def resolve(prom: Prometheus, pod: str, namespace: str | None, w: str) -> list[JobRank]:
    """The pod's ranks [{job, rank, pod, namespace, node}], or DiagnoseError."""
    rows = prom.query("last_over_time(stallscope_step_seconds_count%s[%s])"
                      % (selector(pod=pod, namespace=namespace), w))
    found = {tuple(labels.get(k, "") for k in IDENTITY): labels for labels, _ in rows}
    if not found:
        raise DiagnoseError(_missing(prom, pod, namespace, w))
    spaces = sorted({k[3] for k in found})
    if len(spaces) > 1:
        raise DiagnoseError("pod %s exists in namespaces %s: give -n NAMESPACE" % (pod, ", ".join(spaces)))
    return [_rank_row(labels, None) for labels in found.values()]


def _missing(prom: Prometheus, pod: str, namespace: str | None, w: str) -> str:
    """Why the pod has no samples in the window: an unknown name or an empty window."""
    steps = "stallscope_step_seconds_count%s" % selector(pod=pod, namespace=namespace)
    if prom.series(steps):
        if time.time() - prom.now < 60:
            return ("no data for pod %s in the last %s at %s: its series stopped earlier "
                    "(try a longer --window)" % (pod, w, prom.url))
        # after the fact (--at, issue 36): before the pod's first sample, or in a gap
        then = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(prom.now))
        if not prom.series(steps, end=prom.now):
            return ("no data for pod %s in the %s before %s at %s: its series begin after that "
                    "(the job had not started, or it is past Prometheus's retention)"
                    % (pod, w, then, prom.url))
        return ("no data for pod %s in the %s before %s at %s: its series have no sample there "
                "(try a longer --window)" % (pod, w, then, prom.url))
    if namespace is not None:
        other = prom.series("stallscope_step_seconds_count%s" % selector(pod=pod))
        if other:
            spaces = sorted({s.get("namespace", "") for s in other})
            return "pod %s is not in namespace %s (found in: %s)" % (pod, namespace, ", ".join(spaces))
    known = prom.label_values("pod", match="stallscope_step_seconds_count")
    close = difflib.get_close_matches(pod, known, n=3, cutoff=0.6)
    hint = " (did you mean %s?)" % ", ".join(close) if close else ""
    return ("unknown pod %s: no stallscope series carry pod=\"%s\" at %s%s"
            % (pod, pod, prom.url, hint))


def recorded_sli(**match: str | None) -> str:
    """The alert's own per-rank figure: the mixin's rank-level 5m recording rule."""
    expr: str = promql.sel(CFG, promql.names(CFG)["rank_ratio"], *matchers(**match))
    return expr


def job_ranks(prom: Prometheus, job: str | None, namespace: str | None, w: str) -> tuple[list[JobRank], str]:
    """(every rank of the job with its data-wait ratio, the expression that gave them).

    The ratios are the rank-level recording rule's at the report's time when the rules
    are loaded (the figures the alert that paged reads), and raw over the window only
    where they are not: raw, this is the one query that reads every rank's series over
    the whole window, and at 16,384 ranks it alone took diagnose past its 5 s budget
    (benchmarks/scale, docs/deploy.md). The pod's own ranks stay raw over the window."""
    expr = recorded_sli(job=job, namespace=namespace)
    rows = prom.query(expr)
    if not rows:
        expr = sli(w, job=job, namespace=namespace)
        rows = prom.query(expr)
    best: dict[Any, JobRank] = {}
    for labels, value in rows:
        r = _rank_row(labels, value)
        key = (r.rank, r.pod)
        if key not in best or (value or 0.0) > (best[key].data_wait_ratio or 0.0):
            best[key] = r
    return list(best.values()), expr


def since(prom: Prometheus, who: JobRank, window_s: float) -> Since | None:
    """When the rank's data-wait ratio last crossed above THRESHOLD and stayed there.

    A range query over 4x the window: a stall that began before the window is found
    too. ``open_ended`` means it was above the line for the whole lookback."""
    lookback = min(4 * window_s, 7 * 86400)
    step = max(1.0, lookback / 240)
    rate_w = window.promql(max(window_s / 5, 2 * step))
    expr = sli(rate_w, job=who.job, namespace=who.namespace, pod=who.pod, rank=str(who.rank))
    series = prom.query_range(expr, prom.now - lookback, prom.now, step)
    if not series:
        return None
    points = series[0][1]
    start = None
    for t, v in reversed(points):
        if v is None or v < THRESHOLD:
            break
        start = t
    if start is None:
        return Since(False, who.rank, lookback, expr)
    return Since(True, who.rank, lookback, expr, start, round(prom.now - start, 3),
                 start <= prom.now - lookback + step)


def agent_url(prom: Prometheus, node: str | None, w: str) -> str | None:
    """The agent of ``node`` from its own build_info series: with honor_labels the
    scrape's ``instance`` label is still the target address (host:port)."""
    for expr in ("stallscope_agent_build_info%s" % selector(node=node),
                 "last_over_time(stallscope_agent_build_info%s[%s])" % (selector(node=node), w)):
        rows = [labels for labels, _ in prom.query(expr) if labels.get("instance")]
        if rows:
            return fetch.base_url(sorted(rows, key=lambda labels: labels["instance"])[0]["instance"])
    return None


def dark_ranks(prom: Prometheus, job: str | None, namespace: str | None,
               exclude: str | None = None) -> tuple[list[JobRank], list[str]]:
    """(the job's ranks that reported within the mixin's silent lookback but have no
    sample now, on an agent whose last scrape failed (up == 0); those agents). A
    failed scrape ends its series at once (staleness markers), so a node whose agent is
    down drops its ranks out of every view: Prometheus cannot say whether a victim waits
    for one of them (issue 35). A rank silent on a live agent is StallscopeRankSilent's.
    ``exclude``: a pod whose ranks are left out (the one diagnosed)."""
    up = promql.sel(CFG, "up", CFG.agent_selector) if CFG.agent_selector else "up"
    if not prom.query("%s == 0" % up):  # the usual answer, and a cheap one at any scale
        return [], []
    sel = selector(job=job, namespace=namespace)
    rows = prom.query(
        "group by (namespace, job, rank, pod, node, instance) (present_over_time("
        "stallscope_step_seconds_count%s[%s])) unless on (namespace, job, rank) "
        "stallscope_step_seconds_count%s and on (instance) (%s == 0)" % (sel, CFG.silent_lookback, sel, up))
    rows = [(labels, v) for labels, v in rows if labels.get("pod") != exclude]
    found = sorted((_rank_row(labels, None) for labels, _ in rows), key=lambda r: _order_key(r.rank))
    agents = sorted({labels["instance"] for labels, _ in rows if labels.get("instance")})
    return found, agents


def _order_key(rank: Any) -> tuple[int, Any]:
    return (0, rank) if isinstance(rank, int) else (1, str(rank))


def _pod_signal(cause: vocabulary.Cause, line: vocabulary.Line) -> PodQuery:
    """(signal, cause, threshold, direction, expression of (matchers, window)) of one of a
    cause's lines, with the line of the alert on that signal where there is one (the
    evidence then speaks the language of the page)."""
    alerts = [a for a in cause.alerts if a.signal == line.signal]
    threshold = CFG.line(alerts[0].name) if alerts else line.threshold
    direction = "above" if line.above else "below"
    agg = "max" if line.above else "min"

    def build(m: tuple[str, ...], w: str) -> str:
        expr: str = promql.signal(CFG, line.signal, m, w)
        if "$w" in vocabulary.signal(line.signal).query:
            return "%s(%s)" % (agg, expr)
        return "%s(%s_over_time((%s)[%s:]))" % (agg, agg, expr, w)
    return (line.signal, cause.name, threshold, direction, build)


# The pod's cause signals as Prometheus has them, with the alerts' lines: the evidence
# when the node's agent cannot be asked, and context when it can. Every cause line
# whose signal has a Prometheus face (stallscope/vocabulary/), once each.
POD_SIGNALS: tuple[PodQuery, ...] = tuple({
    line.signal: _pod_signal(c, line) for c in reversed(vocabulary.CAUSES) for line in reversed(c.lines)
    if vocabulary.signal(line.signal).query}.values())[::-1] + (
    ("hook_dropped_events", None, 0, "above",
     lambda m, w: "sum(increase(%s[%s]))" % (promql.sel(CFG, "stallscope_hook_dropped_events_total", *m), w)),
)


def pod_signals(prom: Prometheus, pod: str, namespace: str | None, w: str) -> list[PodSignal]:
    m = matchers(pod=pod, namespace=namespace)
    out = []
    for name, cause, threshold, direction, build in POD_SIGNALS:
        q = build(m, w).replace("\n", " ")
        value = prom.scalar(q)
        if value is not None:
            out.append(PodSignal(name, cause, value, threshold, direction, "prometheus", q))
    return out


def _newest(prom: Prometheus, selector_expr: str, w: str) -> list[tuple[dict[str, str], float]]:
    """Each series' last value over the window, of the series in the newest scrape that had
    any: what the agent published last. A series it stopped publishing earlier in the window
    (a cause no longer among the top three, a budget component gone) is not mixed in with
    what replaced it, and a job that ended keeps its last answer (issue 49: a cause the
    agent scored while its window still held the run's start read first from Prometheus
    seconds after the agent had dropped it)."""
    rows = prom.samples("%s[%s]" % (selector_expr, w))
    last = [(labels, points[-1]) for labels, points in rows if points and points[-1][1] is not None]
    if not last:
        return []
    newest = max(t for _, (t, _) in last)
    # one target's series share a scrape's timestamp; half a second covers rounding
    return [(labels, float(v)) for labels, (t, v) in last if t >= newest - 0.5 and v is not None]


def cause_scores(prom: Prometheus, who: JobRank, w: str) -> list[tuple[str, float]]:
    """The correlator's published scores (top causes of an input-bound rank), as it
    published them last."""
    sel = selector(job=who.job, namespace=who.namespace, pod=who.pod, rank=str(who.rank))
    best: dict[str, float] = {}
    # a missing label is an empty one in Prometheus's data model
    for labels, v in _newest(prom, "stallscope_stall_cause_score" + sel, w):
        cause = labels.get("cause", "")
        best[cause] = max(v, best.get(cause, v))
    return sorted(best.items(), key=lambda c: -c[1])


def budget_shares(prom: Prometheus, who: JobRank, w: str) -> list[tuple[str, str, float]]:
    """[(component, cause, share)] of the time budget the agent published last for the
    pod (stallscope_stall_budget_ratio, largest first): the series of its newest scrape
    that had one, so a job that ended keeps its last budget and a component gone from the
    budget before then is not summed with those that replaced it."""
    sel = selector(job=who.job, namespace=who.namespace, pod=who.pod)
    return sorted(((labels.get("component", ""), labels.get("cause", ""), v)
                   for labels, v in _newest(prom, "stallscope_stall_budget_ratio" + sel, w)),
                  key=lambda c: -c[2])


def loader_sizing(prom: Prometheus, who: JobRank, w: str) -> Sizing:
    """num_workers and the agent's advice (issue 4's workers_needed), as Prometheus has
    them: the loader's side of the story when the agent cannot be asked."""
    sel = selector(job=who.job, namespace=who.namespace, pod=who.pod, rank=str(who.rank))
    out: dict[str, Any] = {}
    info = prom.query("last_over_time(stallscope_loader_info%s[%s])" % (sel, w))
    if info:
        try:
            out["num_workers"] = int(info[0][0].get("num_workers", ""))
        except ValueError:
            pass
    for key, metric in (("workers_needed", "stallscope_loader_workers_needed"),
                        ("quota_limited", "stallscope_loader_workers_quota_limited")):
        value = prom.scalar("max(last_over_time(%s%s[%s]))" % (metric, sel, w))
        if value is not None:
            out[key] = bool(value) if key == "quota_limited" else int(value)
    return Sizing.of(out)


def view(prom: Prometheus, pod: str, namespace: str | None, window_s: float,
         top_k: int = TOP_K) -> ClusterView:
    """Everything Prometheus knows about the pod's rank and its job, as one dict."""
    w = window.promql(window_s)
    mine = resolve(prom, pod, namespace, w)
    namespace = mine[0].namespace
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # key=str: a series without the job or node label (None) sorts beside the names
        jobs = {j: pool.submit(job_ranks, prom, j, namespace, w)
                for j in sorted({r.job for r in mine}, key=str)}
        node_agents = {n: pool.submit(agent_url, prom, n, w)
                       for n in sorted({r.node for r in mine}, key=str)}
        signals = pool.submit(pod_signals, prom, pod, namespace, w)
        own = pool.submit(prom.query, sli(w, pod=pod, namespace=namespace))
        ranks: dict[str | None, list[JobRank]] = {}
        exprs: dict[str | None, str] = {}
        for j, f in jobs.items():
            ranks[j], exprs[j] = f.result()
        by_key = {(r.job, r.rank, r.pod): r for rows in ranks.values() for r in rows}
        for labels, value in own.result():  # the pod's own ranks: raw over the window
            r = _rank_row(labels, value)
            by_key[(r.job, r.rank, r.pod)] = r
        pod_ranks = [by_key.get((r.job, r.rank, r.pod), r) for r in mine]
        me = _worst(pod_ranks)
        job = ranks[me.job]
        finite = [r for r in job if r.data_wait_ratio is not None]
        straggler = _worst(finite) if finite else None
        target = me if (me.data_wait_ratio or 0.0) >= THRESHOLD else straggler
        when = None
        if target is not None and (target.data_wait_ratio or 0.0) >= THRESHOLD:
            when = pool.submit(since, prom, target, window_s)
        scores = pool.submit(cause_scores, prom, me, w)
        spent = pool.submit(budget_shares, prom, me, w)
        batches = pool.submit(prom.scalar, "sum(increase(stallscope_step_seconds_count%s[%s]))" % (
            selector(job=me.job, namespace=namespace, pod=pod, rank=str(me.rank)), w))
        sizing = pool.submit(loader_sizing, prom, me, w)
        died = pool.submit(exits_mod.of, prom, me, window_s)
        steady = pool.submit(prom.scalar, promql.steady_data_wait_ratio(CFG, matchers(
            job=me.job, namespace=namespace, pod=pod, rank=str(me.rank)), w).replace("\n", " "))
        handoff = pool.submit(prom.scalar, promql.handoff_ratio(CFG, matchers(
            job=me.job, namespace=namespace, pod=pod, rank=str(me.rank)), w).replace("\n", " "))
        exits, deaths = died.result()
        # the pod's own ranks are not its job's unseen peers: a pod whose agent is down
        # is reported from what Prometheus still holds of it, with that warning
        dark, down = dark_ranks(prom, me.job, namespace, exclude=pod)
        return ClusterView(
            job=me.job or "", rank=me.rank, pod=pod, namespace=namespace or "", node=me.node or "",
            data_wait_ratio=me.data_wait_ratio, batches=batches.result(),
            pod_ranks=tuple(sorted(pod_ranks, key=lambda r: str(r.rank))),
            job_ranks=len(job), job_ranks_with_data=len(finite),
            job_max_data_wait_ratio=straggler.data_wait_ratio if straggler else None,
            job_median_data_wait_ratio=(statistics.median(r.data_wait_ratio for r in finite
                                                          if r.data_wait_ratio is not None)
                                        if finite else None),
            straggler=straggler,
            top_ranks=tuple(sorted(finite, key=lambda r: -(r.data_wait_ratio or 0.0))[:top_k]),
            ranks_without_batches=tuple(sorted((r for r in job if r.data_wait_ratio is None),
                                               key=lambda r: str(r.rank))[:top_k]),
            since=when.result() if when else None, agent_url=node_agents[me.node].result(),
            signals=tuple(signals.result()), cause_scores=tuple(scores.result()),
            sizing=sizing.result(),
            # the pod's loader workers that died, by reason, and the causes they score
            worker_exits=tuple(exits), death_causes=tuple(deaths), sli_expr=exprs[me.job],
            steady_data_wait_ratio=steady.result(), handoff_ratio=handoff.result(),
            dark_ranks=tuple(dark), dark_agents=tuple(down), budget_shares=tuple(spent.result()))
