"""``--plot FILE.png``: the window's data-wait (share of each time bin the loop spent
blocked in next()) against GPU busy, from the agent's timeline; without the agent, the
rank's data-wait ratio from Prometheus alone. matplotlib is imported only here (the
``plot`` extra)."""
from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import figure
from ..figure import PlotError as PlotError  # what callers catch: the one error of figure.py
from . import cluster, fetch, node
from .document import Report
from .prom import Prometheus

if TYPE_CHECKING:
    import numpy as np

BINS = 300


def _share(batches: Sequence[Mapping[str, Any]], offset_ns: int,
           width_s: float) -> tuple[list[datetime.datetime], np.ndarray]:
    """(bin starts as datetimes, data-wait share per bin) from batch events."""
    import numpy as np

    end = np.array([b["t_end_ns"] for b in batches], dtype=np.int64)
    wait = np.array([b["wait_ns"] for b in batches], dtype=np.int64)
    t0, t1 = int((end - wait).min()), int(end.max())
    width = int(width_s * 1e9)
    edges = np.arange(t0, t1 + width, width, dtype=np.int64)
    waited = np.zeros(len(edges) - 1 or 1)
    for s, e in zip(end - wait, end):  # spread each wait over the bins it overlaps
        i = max(0, int((s - t0) // width))
        while i < len(waited) and edges[i] < e:
            lo, hi = max(s, edges[i]), min(e, edges[i] + width)
            if hi > lo:
                waited[i] += hi - lo
            i += 1
    x = [datetime.datetime.fromtimestamp((t + offset_ns) / 1e9) for t in edges[:len(waited)]]
    return x, waited / width


def _from_agent(doc: Report, tl: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    if tl is None and doc.agent_url and doc.rank is not None:
        try:
            tl = node.timeline(doc.agent_url, doc.rank, doc.job, doc.pod, doc.window_seconds)
        except fetch.SourceError:
            tl = None
    if tl is None:
        return None
    batches = tl.get("batches") or []
    if not batches:
        return None
    off = tl.get("clock_offset_ns") or 0
    x, share = _share(batches, off, max(0.2, doc.window_seconds / BINS))
    gpu = (tl.get("signals") or {}).get("gpu_busy_ratio") or []
    gx = [datetime.datetime.fromtimestamp((t + off) / 1e9) for t, _ in gpu]
    return {"x": x, "wait": share, "gpu_x": gx, "gpu": [v for _, v in gpu], "source": "agent"}


def _from_prometheus(doc: Report, at: float | None = None) -> dict[str, Any] | None:
    """The window ending at ``at`` (--at, or the end of a job that has ended), else now."""
    if not doc.prometheus_url or doc.rank is None:
        return None
    prom = Prometheus(doc.prometheus_url, now=at)
    w = doc.window_seconds
    step = max(1.0, w / BINS)
    # a rate window of two scrapes at least (at 15-30 s, a 12 s one held no rate at all)
    expr = cluster.sli("%ds" % max(60, int(4 * step)), job=doc.job, namespace=doc.namespace,
                       pod=doc.pod, rank=str(doc.rank))
    try:
        series = prom.query_range(expr, prom.now - w, prom.now, step)
    except fetch.SourceError:
        return None
    if not series:
        return None
    pts = [(t, v) for t, v in series[0][1] if v is not None]
    return {"x": [datetime.datetime.fromtimestamp(t) for t, _ in pts], "wait": [v for _, v in pts],
            "gpu_x": [], "gpu": [], "source": "prometheus"}


def write(path: str, doc: Report, timeline: Mapping[str, Any] | None = None,
          at: float | None = None) -> str:
    figure.pyplot()  # matplotlib missing: say so before looking for a timeline
    data = _from_agent(doc, timeline) or _from_prometheus(doc, at)
    if data is None:
        raise PlotError("no timeline for the window from the agent or Prometheus")
    with figure.drawn(path) as (fig, ax):
        ax.fill_between(data["x"], data["wait"], step="post", color="tab:red", alpha=0.45,
                        label="data-wait (share of time)")
        if data["gpu"]:
            source = ((doc.gpu.source if doc.gpu is not None else None) or "").lower()
            ax.plot(data["gpu_x"], data["gpu"], color="tab:green", lw=1.2, drawstyle="steps-pre",
                    label="GPU busy (simulated)" if source == "simulated" else "GPU busy")
        else:
            ax.plot([], [], " ", label="GPU busy: no samples")
        ax.axhline(doc.threshold, color="grey", ls=":", lw=1, label="alert line")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("share of time")
        ax.set_title("%s  rank %s of %s on %s  (%s, from the %s)" % (
            doc.pod, doc.rank, doc.job, doc.node, doc.verdict, data["source"]))
        ax.legend(loc="upper right", fontsize=8)
        fig.autofmt_xdate()
    return path
