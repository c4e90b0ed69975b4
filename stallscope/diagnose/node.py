"""Node detail from the pod's agent: the correlator's diagnosis, the rank's loader,
PIDs and sizing advice (``/api/v1/ranks``), and its timeline for ``--plot``.

Anything the agent cannot answer becomes a note, never an abort: the cluster view
still stands on its own (see report.py).
"""
import statistics
import time

from ..vocabulary import MIN_BATCHES
from . import fetch


class NoRank(Exception):
    """The agent answered but tracks no live rank for the pod."""


def _params(**kw):
    return {k: v for k, v in kw.items() if v is not None}


def view(url, pod, namespace, window_s, rank=None, job=None):
    """{url, node, rank (the /api/v1/ranks entry), diagnosis or None, notes}.

    Raises fetch.Unreachable when nothing answers and NoRank when the pod is not
    among the agent's live ranks."""
    url = fetch.base_url(url)
    body = fetch.get_json(url + "/api/v1/ranks", _params(pod=pod, namespace=namespace))
    ranks = body.get("ranks") or []
    if job is not None:
        ranks = [r for r in ranks if r.get("job") == job] or ranks
    if not ranks:
        raise NoRank("the agent at %s (node %s) tracks no live rank of pod %s" % (
            url, body.get("node") or "?", pod))
    notes = []
    diag = None
    try:
        diag = fetch.get_json(url + "/api/v1/diagnosis", _params(
            pod=pod, namespace=namespace, rank=rank, job=job, seconds="%g" % window_s))
    except fetch.HttpError as e:
        notes.append("the agent gave no diagnosis: %s" % e.reason)
    chosen = None
    want = rank if rank is not None else (diag or {}).get("rank")
    for r in ranks:
        if want is not None and str(r.get("rank")) == str(want):
            chosen = r
    if chosen is None:
        chosen = max(ranks, key=_wait_share)
    tl = None
    try:
        tl = timeline(url, chosen["rank"], chosen.get("job"), chosen.get("pod"), window_s)
    except fetch.HttpError as e:
        notes.append("the agent gave no timeline: %s" % e.reason)
    return {"url": url, "node": body.get("node"), "rank": chosen, "ranks": ranks,
            "diagnosis": diag, "timeline": tl, "progress": progress(tl, chosen), "notes": notes}


def _wait_share(r):
    step = r.get("step_seconds_total") or 0.0
    return (r.get("data_wait_seconds_total") or 0.0) / step if step > 0 else 0.0


def timeline(url, rank, job, pod, window_s):
    return fetch.get_json(fetch.base_url(url) + "/api/v1/timeline", _params(
        rank=rank, job=job, pod=pod, seconds="%g" % min(window_s, 86400)))


def progress(tl, rank, now=None):
    """{batches, last_batch_age_seconds, median_interval_seconds} of the window: a loop
    blocked in next() reports nothing until next() returns, so a stuck rank shows only
    as batches that stopped coming while its process still reports (heartbeats).
    The age uses the hook's wall-clock offset: this machine's clock against the node's."""
    if tl is None:
        return None
    batches = tl.get("batches") or []
    out = {"batches": len(batches), "batches_total": rank.get("batches"),
           "last_batch_age_seconds": None, "median_interval_seconds": None}
    if batches:
        now = time.time() if now is None else now
        last = (batches[-1]["t_end_ns"] + (tl.get("clock_offset_ns") or 0)) / 1e9
        out["last_batch_age_seconds"] = round(max(0.0, now - last), 3)
        out["median_interval_seconds"] = statistics.median(b["interval_ns"] for b in batches) / 1e9
    return out




def timeline_ratio(tl):
    """Data-wait share of step time from a timeline's batch events (the SLI, node-side),
    for an agent that answers no diagnosis."""
    batches = tl.get("batches") or []
    if len(batches) < MIN_BATCHES:
        return None
    step = sum(b["interval_ns"] for b in batches)
    return (sum(b["wait_ns"] for b in batches) / step) if step > 0 else None
