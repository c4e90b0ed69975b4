"""A job that has just ended (issue 52, item 1): paged by an alert that fired in a job's
last minutes, the on-call person runs ``diagnose POD`` after the job has gone. Its agent
no longer tracks the rank (or holds it as exited for its last 30 s), so the node's view
says nothing, and the window ending now is mostly after the job. Prometheus still holds
the job's last minutes: the report is of the window ending at the pod's last batch,
from Prometheus alone, and says so.

The job ended, rather than its node's agent went down, when the agent answers and
tracks no live rank of the pod; without an agent to ask, when the pod's series are gone
from Prometheus while its agent's scrape target is up.
"""
from __future__ import annotations

from collections.abc import Iterable

from . import fetch
from .prom import Prometheus, label, selector

LOOKBACK_S = 3600      # how far back a job's end is looked for
LAST_WINDOW_S = 300.0  # the job's last minutes the report is of (or --window, if shorter)


def last_batch(prom: Prometheus, pod: str, namespace: str | None) -> tuple[float, dict[str, str]] | None:
    """(the time of the pod's last batch, the labels of its series) from its step counters'
    raw samples over LOOKBACK_S, or None when it has none there."""
    rows = prom.samples("stallscope_step_seconds_count%s[%ds]" % (selector(pod=pod, namespace=namespace),
                                                                  LOOKBACK_S))
    best: tuple[float, dict[str, str]] | None = None
    for labels, values in rows:
        last = None
        for (_, v0), (t1, v1) in zip(values, values[1:]):
            if v0 is not None and v1 is not None and v1 > v0:
                last = t1
        if last is None and values:
            last = values[-1][0]
        if last is not None and (best is None or last > best[0]):
            best = (last, labels)
    return best


def _agent_tracks(urls: Iterable[str], pod: str, namespace: str | None) -> bool | None:
    """Whether an agent asked tracks a live (not exited) rank of the pod; None when none
    of them answered."""
    answered = False
    for url in urls:
        params = {"pod": pod}
        if namespace:
            params["namespace"] = namespace
        try:
            body = fetch.get_json(fetch.base_url(url) + "/api/v1/ranks", params)
        except fetch.SourceError:
            continue
        answered = True
        if any(isinstance(r, dict) and not r.get("exited") for r in body.get("ranks") or []):
            return True
    return False if answered else None


def _agent_of(prom: Prometheus, labels: dict[str, str]) -> list[str]:
    """The agent of the pod's node, from its own build_info series (cluster.agent_url)."""
    from .cluster import agent_url
    url = agent_url(prom, labels.get("node"), "%ds" % LOOKBACK_S)
    return [url] if url else []


def _target_up_without_series(prom: Prometheus, pod: str, namespace: str | None,
                              labels: dict[str, str]) -> bool:
    """The pod's series are gone while the target that exported them is up: its agent
    dropped the rank (it ended), not the scrape."""
    if prom.query("stallscope_step_seconds_count%s" % selector(pod=pod, namespace=namespace)):
        return False
    instance = labels.get("instance")
    if not instance:
        return False
    return any(v == 1 for _, v in prom.query("up{instance=%s}" % label(instance)))


def ended_at(prometheus_url: str, pod: str, namespace: str | None, agent_urls: list[str] | None,
             prometheus_alone: bool = False) -> float | None:
    """When the pod's job ended (its last batch), or None while it runs, when its agent
    cannot be asked, or when Prometheus has nothing of it."""
    prom = Prometheus(prometheus_url)
    try:
        found = last_batch(prom, pod, namespace)
        if found is None:
            return None
        t, labels = found
        if prometheus_alone:
            return t if _target_up_without_series(prom, pod, namespace, labels) else None
        urls = agent_urls or _agent_of(prom, labels)
        tracks = _agent_tracks(urls, pod, namespace or labels.get("namespace")) if urls else None
        if tracks is None:  # no agent to ask, or it is down: Prometheus decides
            return t if _target_up_without_series(prom, pod, namespace, labels) else None
        return None if tracks else t
    except fetch.SourceError:
        return None  # the report's own queries say what failed
