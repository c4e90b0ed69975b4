"""``run()``: the cluster view, the node detail and (optionally) the stacks, merged into
one document, the contract of ``stallscope diagnose --json`` (docs/diagnose.md, "--json").
A source that fails becomes a warning when another one can still answer; only when
nothing can does ``run`` raise DiagnoseError (exit 2).
"""
import datetime
import statistics
import time

from . import agents as agents_mod
from . import cluster as cluster_mod
from . import fetch, nextsteps, outlook, verdict
from . import node as node_mod
from . import stacks as stacks_mod
from . import window as durations
from .errors import DiagnoseError
from .prom import Prometheus

EXIT = {"healthy": 0, "input_bound": 1, "not_input_bound": 1, "unknown": 2}


def exit_code(doc):
    """0 no stall, 1 a stall (this rank's loader, or a straggler it waits for), 2 unknown."""
    return EXIT.get(doc.get("verdict"), 2)


def _cluster(prometheus_url, pod, namespace, w, fallback, sources, warnings):
    prom = Prometheus(prometheus_url)
    try:
        view = cluster_mod.view(prom, pod, namespace, w)
    except fetch.SourceError as e:
        what = "Prometheus unreachable at %s: %s" % (prom.url, e.message) if isinstance(
            e, fetch.Unreachable) else "Prometheus at %s failed: %s" % (prom.url, e.message)
        sources.append({"name": "prometheus", "url": prom.url, "ok": False, "error": e.message})
        if not fallback:
            raise DiagnoseError(what) from e
        warnings.append(what + "; showing the node's view only")
        return None
    except DiagnoseError as e:
        sources.append({"name": "prometheus", "url": prom.url, "ok": False, "error": str(e)})
        if not fallback:
            raise
        warnings.append("%s; showing the node's view only" % e)
        return None
    sources.append({"name": "prometheus", "url": prom.url, "ok": True})
    return view


def _node(urls, pod, namespace, w, cl, sources, warnings, alone):
    """The node detail from the first agent of ``urls`` that tracks the pod (with several
    agents given, the pod's node is not known before asking)."""
    rank, job = (cl["rank"], cl["job"]) if cl else (None, None)
    failed = []
    for url in urls:
        try:
            view = node_mod.view(url, pod, namespace, w, rank=rank, job=job)
        except (fetch.SourceError, node_mod.NoRank) as e:
            failed.append((url, e))
            continue
        sources.append({"name": "agent", "url": view["url"], "ok": True, "node": view["node"]})
        warnings.extend(view["notes"])
        return view
    for url, e in failed:
        msg = e.message if isinstance(e, fetch.SourceError) else str(e)
        sources.append({"name": "agent", "url": fetch.base_url(url), "ok": False, "error": msg})
    url, e = failed[-1] if len(failed) == 1 else _worst_failure(failed)
    msg = e.message if isinstance(e, fetch.SourceError) else str(e)
    what = ("agent unreachable at %s: %s" % (fetch.base_url(url), msg)
            if isinstance(e, fetch.Unreachable) else msg if isinstance(e, node_mod.NoRank)
            else "agent at %s failed: %s" % (fetch.base_url(url), msg))
    if len(failed) > 1:
        what = "none of the %d agents tracks pod %s (%s)" % (len(failed), pod, what)
    if alone:
        raise DiagnoseError(what) from e
    warnings.append(what + "; showing the Prometheus view only")
    return None


def _worst_failure(failed):
    """The failure to report when no agent answered for the pod: one that tracks no such
    pod says more than one that could not be reached."""
    return next(((u, e) for u, e in failed if isinstance(e, node_mod.NoRank)), failed[-1])


def _urls(agent_url):
    if not agent_url:
        return []
    return [agent_url] if isinstance(agent_url, str) else list(agent_url)


def _identity(cl, nd, w, others=None):
    """This rank and its job's numbers, from the cluster when it answered, else from the
    agents: the rank's own (its node's ranks of the job) and, with ``others`` (rows from
    the other agents given, agents.py), the job's ranks on their nodes too."""
    if cl is not None:
        return {"job": cl["job"], "rank": cl["rank"], "pod": cl["pod"], "namespace": cl["namespace"],
                "node": cl["node"], "data_wait_ratio": cl["data_wait_ratio"],
                "job_max": cl["job_max_data_wait_ratio"], "job_median": cl["job_median_data_wait_ratio"],
                "job_scope": "cluster", "job_ranks": cl["job_ranks"], "batches": cl.get("batches"),
                "progress": (nd or {}).get("progress"), "rank_info": (nd or {}).get("rank")}
    r, d = nd["rank"], nd["diagnosis"] or {}
    ratio = d.get("data_wait_ratio")
    if ratio is None and not d and nd.get("timeline"):  # the agent gave no diagnosis
        ratio = node_mod.timeline_ratio(nd["timeline"])
    node = r.get("node") or nd["node"]
    source = "agent %s" % nd["url"]
    after = d.get("data_wait_ratio_after_start")  # the rank is starting (rules.py)
    rows = [{"rank": r["rank"], "pod": r["pod"], "node": node, "data_wait_ratio": ratio,
             "data_wait_ratio_after_start": after, "source": source}]
    rows += [{"rank": p["rank"], "pod": p.get("pod"), "node": node,
              "data_wait_ratio": p.get("data_wait_ratio"),
              "data_wait_ratio_after_start": p.get("data_wait_ratio_after_start"), "source": source}
             for p in d.get("job_ranks_on_node") or []]
    rows += others or []
    ratios = [x["data_wait_ratio"] for x in rows if x["data_wait_ratio"] is not None]
    return {"job": r["job"], "rank": r["rank"], "pod": r["pod"], "namespace": r["namespace"],
            "node": node, "data_wait_ratio": ratio, "data_wait_ratio_after_start": after,
            "job_max": max(ratios) if ratios else None,
            "job_median": statistics.median(ratios) if ratios else None,
            "job_scope": "agents" if others is not None else "node", "job_ranks": len(ratios),
            "job_rows": rows, "progress": nd.get("progress"), "rank_info": r}


def _straggler(cl, diag, me):
    if cl is not None and cl.get("straggler"):
        s = cl["straggler"]
        return {k: s[k] for k in ("rank", "pod", "node", "data_wait_ratio")}
    if me["job_scope"] == "agents":  # the job's worst rank, as the cluster view names it
        known = [x for x in me["job_rows"] if x["data_wait_ratio"] is not None
                 and not verdict.starting(x)]
        s = max(known, key=lambda x: (x["data_wait_ratio"], -_order(x["rank"])), default=None)
        return None if s is None else {k: s[k] for k in ("rank", "pod", "node", "data_wait_ratio")}
    s = (diag or {}).get("straggler") or {}
    if s.get("rank") is None:
        return None
    return {k: s.get(k) for k in ("rank", "pod", "node", "data_wait_ratio")}


def _order(rank):
    try:
        return float(rank)
    except (TypeError, ValueError):
        return 0.0


def _top(cl, me, k=10):
    """The job's slowest ranks, each with the source it came from."""
    if cl is not None:
        return [dict(r, source="prometheus") for r in cl.get("top_ranks") or []]
    if me["job_scope"] != "agents":
        return []
    known = [x for x in me["job_rows"] if x["data_wait_ratio"] is not None]
    return sorted(known, key=lambda x: -x["data_wait_ratio"])[:k]


def run(pod, namespace=None, prometheus_url=None, agent_url=None, window="15m", stacks=False,
        plot=None, finished=False):
    """Diagnose ``pod``; returns the report document (see render_text, exit_code).
    ``finished``: the run is over (``stallscope run``): stopped ranks are not stuck ones."""
    try:
        w = durations.parse(window)
    except ValueError as e:
        raise DiagnoseError(str(e)) from None
    if not prometheus_url and not agent_url:
        raise DiagnoseError("no source: give --prometheus URL (or set STALLSCOPE_PROMETHEUS_URL) "
                            "or --agent URL")
    t0 = time.monotonic()
    sources, warnings = [], []
    cl = None
    if prometheus_url:
        cl = _cluster(prometheus_url, pod, namespace, w, bool(agent_url), sources, warnings)
    urls = _urls(agent_url) or ([cl["agent_url"]] if (cl or {}).get("agent_url") else [])
    url = urls[0] if urls else None
    nd = None
    if urls:
        nd = _node(urls, pod, namespace or (cl or {}).get("namespace"), w, cl, sources, warnings,
                   alone=cl is None)
    elif cl is not None:
        warnings.append("no agent for node %s in Prometheus (stallscope_agent_build_info): give "
                        "--agent URL for the node's detail" % cl["node"])
    diag = (nd or {}).get("diagnosis")
    others = None
    if cl is None and len(urls) > 1:  # the job across the agents' nodes (agents.py)
        rest = [u for u in urls if fetch.base_url(u) != nd["url"]]
        r = nd["rank"]
        others, more, notes = agents_mod.job_rows(rest, r["job"], r.get("namespace"), w)
        sources.extend(more)
        warnings.extend(notes)
    me = _identity(cl, nd, w, others)
    stack_doc = _stacks(nd, warnings) if stacks else None
    v, reason = verdict.decide(me, cl, diag, stack_doc, w, finished=finished)
    if diag is not None and v == diag.get("verdict"):
        causes = diag.get("causes") or []
    elif v == "input_bound" and cl is not None:
        causes = verdict.causes_without_agent(cl)
    else:
        causes = []
    rank_info = (nd or {}).get("rank") or {}
    doc = {
        "api": "v1", "verdict": v, "reason": reason, "causes": causes,
        "job": me["job"], "rank": me["rank"], "pod": me["pod"] or pod, "namespace": me["namespace"],
        "node": me["node"], "data_wait_ratio": me["data_wait_ratio"],
        "job_max_data_wait_ratio": me["job_max"], "job_median_data_wait_ratio": me["job_median"],
        "job_scope": me["job_scope"], "job_ranks": me["job_ranks"],
        "threshold": cluster_mod.THRESHOLD, "straggler": _straggler(cl, diag, me),
        "top_ranks": _top(cl, me), "pod_ranks": (cl or {}).get("pod_ranks") or [],
        "ranks_without_batches": (cl or {}).get("ranks_without_batches") or [],
        "since": (cl or {}).get("since"), "window_seconds": w,
        "generated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loader": rank_info.get("loader") or (diag or {}).get("loader"),
        "sizing": rank_info.get("sizing") or (cl or {}).get("sizing") or {},
        "pids": ({"main": rank_info.get("pid"), "workers": rank_info.get("worker_pids") or []}
                 if rank_info else None),
        "progress": me.get("progress"),
        "blocked_in_next_seconds": rank_info.get("blocked_in_next_seconds"),
        # why its loader workers died (the agent's workers exporter, issue 18)
        "worker_deaths": rank_info.get("worker_deaths") or [],
        # ... and the pod's exits by reason over the window, as Prometheus counted them
        "worker_exits": (cl or {}).get("worker_exits") or [],
        # the agent's triage of a next() call blocked past its threshold (agent/hangs.py)
        "hang": rank_info.get("hang") or (diag or {}).get("hang"),
        "gpu": (diag or {}).get("gpu"), "stall_period_steps": (diag or {}).get("stall_period_steps"),
        "agent_verdict": (diag or {}).get("verdict"), "sli_expr": (cl or {}).get("sli_expr"),
        "agent_url": (nd or {}).get("url") or (fetch.base_url(url) if url else None),
        "prometheus_url": fetch.base_url(prometheus_url) if prometheus_url else None,
    }
    doc.update(outlook.of(doc, diag))
    doc["evidence"] = verdict.evidence(me, cl, diag, rank_info, causes)
    doc["stacks"] = stack_doc
    if plot:
        doc["plot"] = _plot(plot, doc, nd, warnings)
    doc["next_steps"] = nextsteps.steps(doc)
    doc["commands"] = nextsteps.commands(doc, doc["prometheus_url"], doc["agent_url"])
    doc["sources"] = sources
    doc["warnings"] = warnings
    doc["elapsed_seconds"] = round(time.monotonic() - t0, 3)
    return doc


def _stacks(nd, warnings):
    if nd is None:
        msg = "stacks: --stacks needs the node's agent (it knows the rank's PIDs)"
        warnings.append(msg)
        return {"error": msg}
    try:
        return stacks_mod.collect(dict(nd["rank"], node=nd["node"]))
    except stacks_mod.StacksError as e:
        warnings.append("stacks: %s" % e)
        return {"error": str(e)}


def _plot(path, doc, nd, warnings):
    from . import plot  # matplotlib only when asked for
    try:
        return plot.write(path, doc, (nd or {}).get("timeline"))
    except plot.PlotError as e:
        warnings.append("plot: %s" % e)
        return None
