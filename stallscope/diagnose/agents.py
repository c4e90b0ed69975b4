"""The job across nodes from its agents alone (``diagnose POD --agent URL --agent URL``,
no Prometheus).

An agent sees only its node's ranks. A job whose ranks span nodes is judged by the rules
against the whole job (correlate/rules.py: is another rank the straggler?), so through
agents alone diagnose asks every agent it is given for the job's ranks on its node over
the same window: each answers its ranks' data-wait shares from its timelines
(``/api/v1/diagnosis``, as it does for its own node), and the rank is then judged against
the union, the same job that Prometheus's view holds. Every row says which agent it came
from.
"""
from . import fetch


def job_rows(urls, job, namespace, window_s):
    """(rows, sources, warnings): rows {rank, pod, node, data_wait_ratio, source} of
    ``job``'s ranks that the agents at ``urls`` track (a rank with too few batches in the
    window has no ratio), a source entry per agent, and a warning per agent that did not
    answer (its node's ranks are then missing from the job)."""
    rows, sources, warnings = [], [], []
    for url in urls:
        url = fetch.base_url(url)
        try:
            node, found = _node_rows(url, job, namespace, window_s)
        except fetch.SourceError as e:
            sources.append({"name": "agent", "url": url, "ok": False, "error": e.message})
            warnings.append("agent %s at %s: %s; the job's ranks on its node are not in the "
                            "job's view" % ("unreachable" if isinstance(e, fetch.Unreachable)
                                            else "failed", url, e.message))
            continue
        sources.append({"name": "agent", "url": url, "ok": True, "node": node})
        rows.extend(found)
    return rows, sources, warnings


def _node_rows(url, job, namespace, window_s):
    query = {"job": job, "namespace": namespace} if namespace else {"job": job}
    body = fetch.get_json(url + "/api/v1/ranks", query)
    node, ranks = body.get("node"), body.get("ranks") or []
    if not ranks:
        return node, []
    first = ranks[0]
    d = fetch.get_json(url + "/api/v1/diagnosis", dict(query, rank=first["rank"],
                                                       seconds="%g" % window_s))
    ratios = {(first["rank"], first.get("pod")): (d.get("data_wait_ratio"),
                                                  d.get("data_wait_ratio_after_start"))}
    for p in d.get("job_ranks_on_node") or []:
        ratios[(p["rank"], p.get("pod"))] = (p.get("data_wait_ratio"), p.get("data_wait_ratio_after_start"))
    source = "agent %s" % url
    rows = []
    for r in ranks:
        ratio, after = ratios.get((r["rank"], r.get("pod")), (None, None))
        rows.append({"rank": r["rank"], "pod": r.get("pod"), "node": r.get("node") or node,
                     "data_wait_ratio": ratio, "data_wait_ratio_after_start": after, "source": source})
    return node, rows
