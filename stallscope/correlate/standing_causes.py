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
- ``bandwidth_bound`` (issue 31): a link of the node ran at its capacity
  (exporters/links.py: receive rate over the link speed or the configured capacity)
  while the rank waited. Model, the bytes/s math: the loader reads B bytes a batch
  (shard reads, or its workers' /proc/<pid>/io); at the compute's pace T_c it would need
  B / T_c a second, and it got R. The link at capacity holds it to R, so the step cannot
  be shorter than B / R: the wait beyond T_c up to B / R is what the link explains. It
  is the link the loader waits on only as far as its workers were blocked on the network
  (the loader-state sampler): the score is that share of the explained wait, over
  NETWORK_LINE.
- ``storage_errors`` (issue 31): a share of the rank's storage requests failed (429/503
  slow down, 5xx, timeouts: the hook's counts) while it waited, and the client retried.
  Model: the failures cost the workers their backoff (the loader-state sampler's time
  asleep) and the failed share of their time on the network; the DataLoader's queue is
  replayed with the load times less that share: the wait that goes is what the failures
  explain.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import vocabulary
from ..report import UNREPORTED
from . import measured
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
BANDWIDTH = "bandwidth_bound"
LINK_RATIO = vocabulary.signal("link_receive_ratio").name
NETWORK_SHARE = vocabulary.signal("loader_workers_network_ratio").name
SLEEPING_SHARE = vocabulary.signal("loader_workers_sleeping_ratio").name
STORAGE_ERRORS = "storage_errors"
ERROR_RATIO = vocabulary.signal("storage_error_ratio").name
MOST_LOST = 0.95  # a load time is never modelled to vanish
# workers blocked on the network this share of their time during the waits: the link is
# what they wait on (a worker also decodes and hands over; half its time is the line
# the storage cause draws on the same sampler, loader_workers_storage_ratio)
NETWORK_LINE = 0.5


def _level(ctx: Context, name: str, scopes: tuple[str, ...] = ("rank",)) -> float | None:
    """The signal's mean during the waits (time-weighted when there was no wait)."""
    scope, s = ctx.whole.signal(name, scopes)
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
    explained = _replayed_without(ctx, REMOTE_SLOWDOWN * share)
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


def bandwidth_bound(ctx: Context) -> Cause | None:
    link = _level(ctx, LINK_RATIO, ("node",))
    if link is None:
        return None
    line = vocabulary.line_of(BANDWIDTH, LINK_RATIO)
    rows = [Evidence(LINK_RATIO, round(link, 4), line.threshold, "above", None, "node",
                     judged_by="standing")]
    if link < line.threshold:
        return make(BANDWIDTH, 0.0, "No link of the node ran at capacity (the busiest at %.0f%%)."
                    % (100 * link), rows)
    trace, steady = ctx.trace, ctx.steady
    rate = measured.read_rate(ctx.whole)
    network = _level(ctx, NETWORK_SHARE)
    n = int(steady.sum())
    waited = float(trace.wait[steady].sum()) / 1e9
    span = ctx.whole.span()
    if rate is None or rate[0] <= 0 or n < 2 or waited <= 0 or span is None:
        return make(BANDWIDTH, 0.0, "A link of the node ran at %.0f%% of its capacity, but the "
                    "loader's bytes were not measured (no shard reads; its workers' reads over sockets are "
                    "not in /proc/<pid>/io, nor was the link's traffic measured)."
                    % (100 * link), rows)
    batches_per_s = ctx.whole.n / ((span[1] - span[0]) / 1e9)
    per_batch = rate[0] / batches_per_s
    compute = trace.compute_ns() / 1e9
    demand = per_batch / compute if compute > 0 else float("inf")
    floor = per_batch / rate[0]  # the step at the link's pace: B / R
    wait = waited / n
    explained = float(np.clip((floor - compute) / wait, 0.0, 1.0))
    on_network = 1.0 if network is None else min(1.0, network / NETWORK_LINE)
    rows.append(Evidence("loader_read_bytes_per_batch", round(per_batch), scope="rank",
                         judged_by="level"))
    rows.append(Evidence("loader_demand_bytes_rate", round(demand), round(rate[0]), "above",
                         None, "rank", round(explained, 4), judged_by="standing"))
    if network is not None:
        rows.append(Evidence(NETWORK_SHARE, round(network, 4), NETWORK_LINE, "above", None, "rank",
                             judged_by="level"))
    text = ("A link of the node ran at %.0f%% of its capacity while the loader waited: the loader "
            "reads %.3g MB a batch (%s); at the compute's pace (%.3gs a batch) it needs %.3g MB/s "
            "and got %.3g MB/s, so no step can be shorter than %.3gs, which explains %.0f%% of "
            "the wait" % (100 * link, per_batch / 1e6, rate[1], compute, demand / 1e6, rate[0] / 1e6,
                          floor, 100 * explained))
    if network is None:
        text += "; what the workers were blocked on was not sampled"
    else:
        text += "; its workers were blocked on the network %.0f%% of their time" % (100 * network)
    text += ". More workers share the same link: change the bytes/s math."
    return make(BANDWIDTH, explained * on_network, text, rows)


def _replayed_without(ctx: Context, share: float) -> float | None:
    """The share of the steady wait that goes when every load time loses ``share`` of
    itself (the DataLoader's queue replayed both ways), or None without load times."""
    trace, steady = ctx.trace, ctx.steady
    _, load = trace.signal(BATCH_LOAD, ("rank",))
    workers = (trace.loader or UNREPORTED).num_workers or 0
    span = trace.span()
    if load is None or span is None or not workers or steady.sum() < 8 or not trace.wait[steady].sum():
        return None
    t = load.clip(*span).v
    if len(t) < 8:
        return None
    compute = np.maximum(trace.interval[steady] - trace.wait[steady], 0) / 1e9
    prefetch = (trace.loader or UNREPORTED).prefetch_factor or 2
    now, _ = replay(t, compute, workers, prefetch)
    less, _ = replay(t * (1.0 - share), compute, workers, prefetch)
    return float(np.clip((now - less) / now, 0.0, 1.0)) if now > 0 else 0.0


def storage_errors(ctx: Context) -> Cause | None:
    err = _level(ctx, ERROR_RATIO)
    if err is None:
        return None
    line = vocabulary.line_of(STORAGE_ERRORS, ERROR_RATIO)
    rows = [Evidence(ERROR_RATIO, round(err, 4), line.threshold, "above", None, "rank",
                     judged_by="standing")]
    if err < line.threshold:
        return make(STORAGE_ERRORS, 0.0, "%.1f%% of the rank's storage requests failed." % (100 * err),
                    rows)
    asleep, network = _level(ctx, SLEEPING_SHARE), _level(ctx, NETWORK_SHARE)
    lost = min(MOST_LOST, (asleep or 0.0) + err * (network or 0.0))
    explained = _replayed_without(ctx, lost)
    how = "replayed with each load time %.0f%% shorter, the queue loses" % (100 * lost)
    if explained is None:
        explained, how = lost, "without the workers' load times to replay, that is"
    for name, value in ((SLEEPING_SHARE, asleep), (NETWORK_SHARE, network)):
        if value is not None:
            rows.append(Evidence(name, round(value, 4), scope="rank", judged_by="level"))
    rows[0] = dataclasses.replace(rows[0], explained_wait_share=round(explained, 4))
    text = ("%.0f%% of the rank's storage requests failed (429/503 slow down, 5xx, timeouts) while "
            "it waited, and the client retried them" % (100 * err))
    if asleep is None and network is None:
        text += "; what the workers did meanwhile was not sampled"
    else:
        text += ("; its workers slept between retries %.0f%% of their time and were on the network "
                 "%.0f%% (%.0f%% of it on failed requests)" % (100 * (asleep or 0.0), 100 * (network or 0.0),
                                                               100 * err))
    text += ": %s %.0f%% of its wait." % (how, 100 * explained)
    return make(STORAGE_ERRORS, explained, text, rows)


MODELS = {NUMA: numa_remote, BANDWIDTH: bandwidth_bound, STORAGE_ERRORS: storage_errors}



def score(ctx: Context) -> tuple[list[Cause], list[str]]:
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
