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
from __future__ import annotations

from typing import Any

from ..correlate import codec
from . import fetch
from .document import JobRank, Source


def job_rows(urls: list[str], job: str, namespace: str | None,
             window_s: float) -> tuple[list[JobRank], list[Source], list[str]]:
    """(rows, sources, warnings): ``job``'s ranks that the agents at ``urls`` track (a
    rank with too few batches in the window has no ratio), a source per agent, and a
    warning per agent that did not answer (its node's ranks are then missing from the
    job)."""
    rows: list[JobRank] = []
    sources: list[Source] = []
    warnings: list[str] = []
    for url in urls:
        url = fetch.base_url(url)
        try:
            node, found = _node_rows(url, job, namespace, window_s)
        except (fetch.SourceError, codec.Malformed) as e:
            msg = e.message if isinstance(e, fetch.SourceError) else "its diagnosis: %s" % e
            sources.append(Source("agent", url, False, error=msg))
            warnings.append("agent %s at %s: %s; the job's ranks on its node are not in the "
                            "job's view" % ("unreachable" if isinstance(e, fetch.Unreachable)
                                            else "failed", url, msg))
            continue
        sources.append(Source("agent", url, True, node=node))
        rows.extend(found)
    return rows, sources, warnings


def _node_rows(url: str, job: str, namespace: str | None, window_s: float) -> tuple[Any, list[JobRank]]:
    query = {"job": job, "namespace": namespace} if namespace else {"job": job}
    body = fetch.get_json(url + "/api/v1/ranks", query)
    node, ranks = body.get("node"), body.get("ranks") or []
    if not ranks:
        return node, []
    first = ranks[0]
    d = codec.decode(fetch.get_json(url + "/api/v1/diagnosis", dict(query, rank=first["rank"],
                                                                    seconds="%g" % window_s)))
    after = d.loop.data_wait_ratio_after_start if d.loop is not None else None
    ratios = {(first["rank"], first.get("pod")): (d.data_wait_ratio, after)}
    for p in d.job_ranks_on_node:
        ratios[(p.rank, p.pod)] = (p.data_wait_ratio, p.data_wait_ratio_after_start)
    source = "agent %s" % url
    rows = []
    for r in ranks:
        ratio, after = ratios.get((r["rank"], r.get("pod")), (None, None))
        rows.append(JobRank(r["rank"], r.get("pod"), r.get("node") or node, ratio, after, source))
    return node, rows
