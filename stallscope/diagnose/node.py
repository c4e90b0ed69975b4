"""Node detail from the pod's agent: the correlator's diagnosis, the rank's loader,
PIDs and sizing advice (``/api/v1/ranks``), and its timeline for ``--plot``, each read
into the report's typed objects here (document.py; the diagnosis by the correlator's
own decoder, correlate/codec.py).

Anything the agent cannot answer becomes a note, never an abort: the cluster view
still stands on its own (see report.py).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

from ..correlate import codec
from ..correlate.model import Diagnosis
from ..report import LoaderSettings
from ..vocabulary import MIN_BATCHES
from . import fetch
from .document import NodeView, Progress, RankInfo, Sizing


class NoRank(Exception):
    """The agent answered but tracks no live rank for the pod."""


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def rank_info(entry: Any) -> RankInfo:
    """A /api/v1/ranks entry, typed (the agent's api.py)."""
    e: Mapping[str, Any] = entry if isinstance(entry, Mapping) else {}
    pids = e.get("worker_pids") or []

    def num(key: str) -> float | None:
        v = e.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return RankInfo(
        job=e.get("job"), rank=e.get("rank"), pod=e.get("pod"), namespace=e.get("namespace"),
        node=e.get("node"), pid=e.get("pid"), ns_pid=e.get("ns_pid"),
        worker_pids=tuple(p for p in pids if isinstance(p, int)),
        loader=LoaderSettings.from_json(e["loader"]) if isinstance(e.get("loader"), Mapping) else None,
        sizing=Sizing.of(e["sizing"]) if isinstance(e.get("sizing"), Mapping) else None,
        exited=bool(e.get("exited")), blocked_in_next_seconds=num("blocked_in_next_seconds"),
        last_seen_seconds_ago=num("last_seen_seconds_ago"),
        batches=e.get("batches") if isinstance(e.get("batches"), int) else None,
        step_seconds_total=num("step_seconds_total"), data_wait_seconds_total=num("data_wait_seconds_total"),
        worker_deaths=tuple(d for d in e.get("worker_deaths") or () if isinstance(d, Mapping)),
        hang=e.get("hang") if isinstance(e.get("hang"), Mapping) else None,
        world_size=e.get("world_size") if type(e.get("world_size")) is int and e["world_size"] > 0 else None)


def view(url: str, pod: str, namespace: str | None, window_s: float, rank: Any = None,
         job: str | None = None) -> NodeView:
    """The node's view of the pod. Raises fetch.Unreachable when nothing answers and
    NoRank when the pod is not among the agent's live ranks."""
    url = fetch.base_url(url)
    body = fetch.get_json(url + "/api/v1/ranks", _params(pod=pod, namespace=namespace))
    ranks = [rank_info(r) for r in body.get("ranks") or []]
    if job is not None:
        ranks = [r for r in ranks if r.job == job] or ranks
    if not ranks:
        raise NoRank("the agent at %s (node %s) tracks no live rank of pod %s" % (
            url, body.get("node") or "?", pod))
    notes = []
    diag: Diagnosis | None = None
    try:
        diag = codec.decode(fetch.get_json(url + "/api/v1/diagnosis", _params(
            pod=pod, namespace=namespace, rank=rank, job=job, seconds="%g" % window_s)))
    except fetch.HttpError as e:
        notes.append("the agent gave no diagnosis: %s" % e.reason)
    except codec.Malformed as e:
        notes.append("the agent's diagnosis could not be read: %s" % e)
    want = rank if rank is not None else (diag.who.rank if diag is not None else None)
    chosen = next((r for r in ranks if want is not None and str(r.rank) == str(want)), None)
    if chosen is None:
        chosen = max(ranks, key=lambda r: r.wait_share)
    tl = None
    try:
        tl = timeline(url, chosen.rank, chosen.job, chosen.pod, window_s)
    except fetch.HttpError as e:
        notes.append("the agent gave no timeline: %s" % e.reason)
    return NodeView(url, body.get("node"), chosen, tuple(ranks), diag, tl, progress(tl, chosen),
                    tuple(notes))


def timeline(url: str, rank: Any, job: str | None, pod: str | None, window_s: float) -> Any:
    return fetch.get_json(fetch.base_url(url) + "/api/v1/timeline", _params(
        rank=rank, job=job, pod=pod, seconds="%g" % min(window_s, 86400)))


def progress(tl: Mapping[str, Any] | None, rank: RankInfo, now: float | None = None) -> Progress | None:
    """The window's batches: a loop blocked in next() reports nothing until next()
    returns, so a stuck rank shows only as batches that stopped coming while its process
    still reports (heartbeats). The age uses the hook's wall-clock offset: this
    machine's clock against the node's."""
    if tl is None:
        return None
    batches = tl.get("batches") or []
    if not batches:
        return Progress(0, rank.batches, None, None)
    now = time.time() if now is None else now
    last = (batches[-1]["t_end_ns"] + (tl.get("clock_offset_ns") or 0)) / 1e9
    return Progress(len(batches), rank.batches, round(max(0.0, now - last), 3),
                    statistics.median(b["interval_ns"] for b in batches) / 1e9)


def timeline_ratio(tl: Mapping[str, Any]) -> float | None:
    """Data-wait share of step time from a timeline's batch events (the SLI, node-side),
    for an agent that answers no diagnosis."""
    batches = tl.get("batches") or []
    if len(batches) < MIN_BATCHES:
        return None
    step = sum(b["interval_ns"] for b in batches)
    return (sum(b["wait_ns"] for b in batches) / step) if step > 0 else None
