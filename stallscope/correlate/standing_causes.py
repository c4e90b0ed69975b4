"""Standing causes: a condition of the rank's set-up or placement that holds while it
waits (issue 29). Co-occurrence cannot name them: a condition that is on all the time
scores near 0 against the stalls (causes.py), whatever share of the wait it costs. So a
standing cause is named when its condition is present and the rank is over the line,
and scored by how much of the wait its *model* explains. The vocabulary marks them
(``Cause.standing``, their lines on ``Signal.condition`` signals); each has a model here.

- ``numa_remote``: the loader ran on CPUs of another NUMA node than its GPU's
  (exporters/numa.py measures the share of the loader's CPU time on them). Model: on a
  remote node the loader's memory traffic (decoding into its buffers, collating, the
  copies to pinned memory and the GPU) crosses the inter-socket link, which costs it
  REMOTE_SLOWDOWN of its time (remote DRAM latency ~1.5-2x and bandwidth ~0.5-0.7x of
  local on two-socket servers: a memory-bound loader loses a third or so; an assumption
  the evidence states, not a measurement). The DataLoader's queue is replayed with the
  measured load times and with those times less that cost on the remote share: the wait
  that goes is what the placement explains.
"""
from __future__ import annotations

import numpy as np

from .. import vocabulary
from .causes import make
from .context import Context
from .model import Cause, Evidence
from .queue import replay

REMOTE_SLOWDOWN = 0.3
NUMA = "numa_remote"
REMOTE_SHARE = vocabulary.signal("numa_remote_cpu_ratio").name
EXCLUSIVE = vocabulary.signal("cpuset_exclusive").name
FUSE_DAEMON_CPUS = vocabulary.signal("cpuset_fuse_daemon_cpus").name
BATCH_LOAD = vocabulary.signal("batch_load_seconds").name
STANDING = tuple(c for c in vocabulary.CAUSES if c.kind == "standing")


class Facts:
    """Facts the host publishes about a rank that a standing cause's model may use
    beyond its signals (none needed yet: kept so the models' inputs have one home)."""


def _level(ctx: Context, name: str) -> float | None:
    """The signal's mean during the waits (time-weighted when there was no wait)."""
    scope, s = ctx.whole.signal(name, ("rank",))
    span = ctx.trace.span()
    if s is None or span is None:
        return None
    s = s.clip(*span)
    if not len(s):
        return None
    weight = ctx.steady_waits.per_sample(s)
    if weight.sum() <= 0:
        weight = s.dt().astype(np.float64)
    return float((s.v * weight).sum() / weight.sum())


def numa_remote(ctx: Context) -> Cause | None:
    share = _level(ctx, REMOTE_SHARE)
    if share is None:
        return None
    line = vocabulary.line_of(NUMA, REMOTE_SHARE)
    row = Evidence(REMOTE_SHARE, round(share, 4), line.threshold, "above", None, "rank",
                   judged_by="standing")
    if share < line.threshold:
        return make(NUMA, 0.0, "The loader ran on its GPU's NUMA node (%.0f%% of its CPU time "
                    "elsewhere)." % (100 * share), [row])
    trace = ctx.trace
    _, load = trace.signal(BATCH_LOAD, ("rank",))
    workers = (trace.loader or {}).get("num_workers") or 0
    span = trace.span()
    steady = ctx.steady
    wait = float(trace.wait[steady].sum())
    explained = None
    if load is not None and span is not None and workers and wait > 0 and steady.sum() >= 8:
        t = load.clip(*span).v
        compute = np.maximum(trace.interval[steady] - trace.wait[steady], 0) / 1e9
        prefetch = (trace.loader or {}).get("prefetch_factor") or 2
        if len(t) >= 8:
            now, _ = replay(t, compute, workers, prefetch)
            local, _ = replay(t * (1.0 - REMOTE_SLOWDOWN * share), compute, workers, prefetch)
            explained = float(np.clip((now - local) / now, 0.0, 1.0)) if now > 0 else 0.0
    if explained is None:
        # no load times to replay: the cost on the loader's time is all the model gives
        explained = REMOTE_SLOWDOWN * share
    text = ("%.0f%% of the loader's CPU time ran on CPUs of another NUMA node than its GPU's: "
            "every batch's memory traffic crosses the inter-socket link. Replayed with its load "
            "times %.0f%% shorter on that share (the modelled remote cost), the queue loses "
            "%.0f%% of its wait; pin the workers to the GPU's local CPUs." % (
                100 * share, 100 * REMOTE_SLOWDOWN, 100 * explained))
    rows = [Evidence(REMOTE_SHARE, round(share, 4), line.threshold, "above", None, "rank",
                     round(explained, 4), judged_by="standing")]
    text += _pinning(ctx, rows)
    return make(NUMA, explained, text, rows)


def _pinning(ctx: Context, rows: list[Evidence]) -> str:
    """What the pod's cpuset says about pinning (exporters/cpuset.py), as evidence rows
    and a sentence: on the shared pool the kubelet cannot align the loader with the GPU."""
    exclusive, daemons = _level(ctx, EXCLUSIVE), _level(ctx, FUSE_DAEMON_CPUS)
    out = ""
    if exclusive is not None:
        rows.append(Evidence(EXCLUSIVE, round(exclusive, 4), scope="pod", judged_by="level"))
        if exclusive < 0.5:
            out += (" The pod's CPUs are the node's shared pool: the static CPU manager gives "
                    "exclusive CPUs only to a Guaranteed pod with integer CPU requests, which the "
                    "topology manager (single-numa-node) then aligns with the GPU.")
    if daemons is not None:
        rows.append(Evidence(FUSE_DAEMON_CPUS, round(daemons), scope="pod", judged_by="level"))
        if daemons >= 1:
            out += (" The node's FUSE daemons may run on %d of its CPUs: reserve theirs "
                    "(reservedSystemCPUs) so they do not take decode time." % round(daemons))
    return out


MODELS = {NUMA: numa_remote}


def score(ctx: Context, facts: Facts | None = None) -> tuple[list[Cause], list[str]]:
    """(the standing causes whose condition was measured, those without a measurement)."""
    found: list[Cause] = []
    missing: list[str] = []
    for cause in STANDING:
        c = MODELS[cause.name](ctx)
        if c is None:
            missing.append(cause.name)
        else:
            found.append(c)
    return found, missing
