"""The time budget of a stall: where the time of the batches the loop waited on went
(issue 49, item 1).

Each steady wait in ``next()`` is split by the hook (hook/transfer.py) into the wait for a
batch the workers had not finished (``ready``) and the handoff of a finished one. Each
part is then accounted by what the tasks on it were measured doing while the loop waited
(the loader-state sampler, exporters/loaderstate.py: schedstat for on a CPU and waiting
for one, the blocked call for the rest):

- the handoff, by the training thread: runnable without a CPU for the share its CPU
  wait takes of the step (``loader_main_cpu_wait_ratio``), on the handoff itself for
  the rest;
- the ready wait, by the workers that were producing the batch: on a CPU, runnable
  without one, blocked on storage, on the network, in a sleep, or in another call,
  each in proportion to their measured share of the workers' time. Idle workers (waiting
  for work) hold no batch the loop waits on: their share is reported beside the budget,
  not in it.

Every component is a measured mechanism with its share of the wait. The mechanism maps
to a cause by its context (``MECHANISMS``; which CPU cause by the kernel's throttling
record, bandwidth where a link was measured at its capacity, a FUSE mount's health), and
the cause is scored at least the share of the wait its mechanism held
(diagnosis.rank_causes, step ``measured``): a condition that is on all the time is not
discounted for being on outside the stalls too, which co-occurrence alone does (issue 49:
a mount slow all along read storage_latency 0.25 beside "blocked reading storage 92 %").
Co-occurrence still names what made a mechanism slow when timing is the mechanism (write
bursts, cold cache: the vocabulary's ``symptom_of``) and corroborates.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..report import UNREPORTED
from ..vocabulary import ATTRIBUTE, line_of, signal
from . import consumer, deaths, transfer
from .context import Context
from .model import Budget, Component, Evidence
from .trace import RankTrace, Series, WaitIndex

# The workers' states that can hold a batch the loop waits on, in the order a report
# lists them (the vocabulary's LOADER_STATES less ``idle``, which holds none).
WORKER_STATES = ("on_cpu", "cpu_wait", "storage", "network", "sleeping")
ERRORS = line_of("storage_errors", "storage_error_ratio")  # the store failing its requests
# the producing workers' share of their time below which the budget places only that
# share of the ready wait (the rest: ``workers.idle``, no cause)
PRODUCING_MIN = 0.1
# Local reads, as a share of the bytes the loader delivers, past which workers that wait
# on the network fetch on a miss what they read locally on a hit. The kernel counts a
# read() of a file in rchar and not a socket's recv() (proc(5), /proc/<pid>/io), so a
# loader that only fetches reads ~nothing locally: the drawn runs over sockets read
# 0.001-0.002 of what they delivered; those through a cache in front of the same store,
# 3.8-7.8 times it (tests/data/draws, issue 49).
LOCAL_READS_MIN = 0.1


def during_waits(trace: RankTrace, name: str, waits: WaitIndex,
                 scopes: tuple[str, ...] = ("rank",)) -> float | None:
    """The signal's mean weighted by the loop's wait in each of its samples: its value
    during the stalls (the capacities' too: measured.py)."""
    _, series = trace.signal(signal(name).name, scopes)
    span = trace.span()
    if series is None or span is None:
        return None
    s: Series = series.clip(*span)
    if not len(s):
        return None
    waited = waits.per_sample(s)
    weight = waited if waited.sum() > 0 else s.dt().astype(np.float64)
    if weight.sum() <= 0:
        return None
    return float((s.v * weight).sum() / weight.sum())


def _last(trace: RankTrace, name: str) -> float | None:
    """The signal's latest sample in the trace's span: a level over the rank's life."""
    _, series = trace.signal(signal(name).name, ("rank",))
    span = trace.span()
    if series is None or span is None:
        return None
    s: Series = series.clip(*span)
    return float(s.v[-1]) if len(s) else None


def _mean(trace: RankTrace, name: str) -> float | None:
    """The signal's time-weighted mean over the trace's span."""
    _, series = trace.signal(signal(name).name, ("rank",))
    span = trace.span()
    if series is None or span is None:
        return None
    s: Series = series.clip(*span)
    dt = s.dt().astype(np.float64) if len(s) else np.zeros(0)
    if not len(s) or dt.sum() <= 0:
        return None
    return float((s.v * dt).sum() / dt.sum())


def _main_split(trace: RankTrace, waits: WaitIndex) -> tuple[float | None, float | None]:
    """(the training thread's CPU-wait share, its on-CPU share) while the loop waited: the
    sampler's signals, else a recorded timeline's split of the window."""
    wait = during_waits(trace, "loader_main_cpu_wait_ratio", waits)
    on = during_waits(trace, "loader_main_on_cpu_ratio", waits)
    split = (trace.loader_split or {}).get("main")
    if on is None and split is not None:
        on = split.get("on_cpu", 0.0)
        if wait is None or "cpu_wait" in split:
            wait = split.get("cpu_wait", 0.0)
    return wait, on


def _fuse_down(trace: RankTrace, waits: WaitIndex) -> bool:
    """A FUSE mount the rank reads was down or its probe hung while the loop waited."""
    up = during_waits(trace, "fuse_up", waits)
    return up is not None and up < 0.5


def _killed(trace: RankTrace) -> str | None:
    """The death cause of the rank's workers the kernel killed in the window, or None: the
    workers that replace them start again, and their start's sleeps and waits (a dataset's
    set-up, the lab's worker start) are the death's, as the restart is (deaths.py; the live
    SIGBUS test's restarted workers asleep read too_few_workers 0.75 over the deaths' 0.75)."""
    for cause, name in deaths.SIGNALS.items():
        _, s = trace.signal(name, ("rank",))
        if s is not None and len(s) and float(np.nansum(s.v)) > 0:
            return cause
    return None


def _asleep(trace: RankTrace, waits: WaitIndex) -> str:
    """The cause of workers asleep in their own code while the loop waits. A retry's
    backoff, where what they retry was measured failing: a dead FUSE mount under their
    reads, a /dev/shm that cannot hold the batches its workers place at once (the hook's
    batch bytes), a store failing its requests past the line. Otherwise a wait of the
    dataset's own (a simulated or remote wait, a rate limiter): per-sample time more
    workers overlap, the loader too slow."""
    if _fuse_down(trace, waits):
        return "fuse_unhealthy"
    killed = _killed(trace)
    if killed is not None:
        return killed
    loader = trace.loader or UNREPORTED
    batch, workers = loader.batch_bytes, loader.num_workers or 1
    free = during_waits(trace, "shm_free_bytes", waits, ("rank", "node"))
    if batch and free is not None and free < batch * workers:
        return "shm_exhaustion"
    errors = during_waits(trace, ERRORS.signal, waits)
    if errors is not None and errors >= ERRORS.threshold:
        return "storage_errors"
    return "too_few_workers"


def _fetches_on_miss(trace: RankTrace, waits: WaitIndex) -> str:
    """Workers that wait on the network while their loader reads files at a rate near
    what it delivers read two tiers: local copies, and the remote store for what the
    local one lacks. Their network time is the local tier's misses (cache_miss), not a
    store slow for every read (storage_latency). Over the window, not during the waits:
    the loop waits while the workers fetch a miss, and reads its hits between the waits
    (a drawn run read 2 KB/s locally during its waits, 0.2 MB/s over the window, for the
    47 KB/s it delivered). Or over the loader's life, where its workers read: a window
    can hold none of the hits (a cache holding the first shard in four: every hit in the
    run's first 4 s, outside the trailing window the agent published, whose top cause was
    storage_latency in 3 of 14 drawn cache_miss runs, issue 49). Only the workers': a
    training process that loads without workers also reads its checkpoint. Returns the
    measured context in words, "" when it does not hold."""
    loader = trace.loader or UNREPORTED
    batch = loader.batch_bytes
    span = trace.span()
    if not batch or span is None or span[1] <= span[0]:
        return ""
    local = _mean(trace, "loader_read_bytes_rate")
    delivered = batch * trace.n / ((span[1] - span[0]) / 1e9)
    if local is not None and local >= LOCAL_READS_MIN * delivered:
        return ("fetching what their local copies lack: the loader read %.1f MB/s of local files, "
                "%.1fx the bytes it delivered" % (local / 1e6, local / delivered))
    life = _last(trace, "loader_life_read_bytes_per_batch")
    if loader.num_workers and life is not None and life >= LOCAL_READS_MIN * batch:
        return ("fetching what their local copies lack: over their life the workers read %.0f KB "
                "of local files a batch, %.1fx the bytes they delivered" % (life / 1e3, life / batch))
    return ""


WRITES = line_of("checkpoint_contention", "disk_write_bytes_rate")
# batches of each kind (in the node's write bursts, outside them) before their waits are
# compared: fewer says nothing of the bursts
BURST_BATCHES_MIN = 3


def _bursts_held(trace: RankTrace, waits: WaitIndex) -> str:
    """Reads slowed by the node's disk write bursts (a checkpoint): the wait the loop's
    batches held during the bursts beyond what its batches held outside them, when that
    excess is most of the wait. A time split of the wait by the bursts, not co-occurrence,
    which discounts bursts on much of the time: drawn 456, bursts over 58 % of its
    samples, 35 ms a batch in them and 0.6 ms outside, 0.96 of the wait, while the bursts'
    co-occurrence scored 0.47 and the mount they slowed was named (storage_latency, issue
    49). Returns the measured context in words, "" when it does not hold."""
    _, writes = trace.signal(WRITES.signal, ("node",))
    if writes is None or len(writes) < 2 or not len(waits.ends):
        return ""
    at = np.searchsorted(writes.t, waits.ends)  # the sample whose interval holds the batch's end
    known = at < len(writes)
    burst = np.zeros(len(waits.ends), dtype=bool)
    burst[known] = writes.v[at[known]] > WRITES.threshold
    inside, outside = waits.wait[burst & known], waits.wait[~burst & known]
    total = float(waits.wait.sum())
    if len(inside) < BURST_BATCHES_MIN or len(outside) < BURST_BATCHES_MIN or total <= 0:
        return ""
    excess = (float(inside.mean()) - float(outside.mean())) * len(inside)
    if excess < ATTRIBUTE * total:
        return ""
    return ("slowed by the node's disk write bursts: %.1f ms a batch during them, %.1f ms "
            "outside, %.0f%% of the wait" % (inside.mean() / 1e6, outside.mean() / 1e6, 100 * excess / total))


def mechanisms(trace: RankTrace, scored: Mapping[str, float],
               waits: WaitIndex) -> dict[str, tuple[str | None, str]]:
    """Each component's cause in its context, and that context in words where a
    measurement beyond the component's own chose the cause. ``scored``: the causes'
    scores so far, for the one context a score gives (a link measured at its capacity:
    bandwidth_bound)."""
    at_capacity = scored.get("bandwidth_bound", 0.0) >= ATTRIBUTE
    bursts = "" if at_capacity or _fuse_down(trace, waits) else _bursts_held(trace, waits)
    storage = "fuse_unhealthy" if _fuse_down(trace, waits) else (
        "bandwidth_bound" if at_capacity else "checkpoint_contention" if bursts else "storage_latency")
    missed = "" if at_capacity else _fetches_on_miss(trace, waits)
    network = "bandwidth_bound" if at_capacity else ("cache_miss" if missed else "storage_latency")
    quota_spent = consumer.workers_throttled(trace)
    workers_cpu = "cpu_throttle" if quota_spent else "cpu_contention"
    # on a CPU under a quota they spend (the kernel throttled them: the cgroup used its whole
    # quota in the period): more workers share the same quota, so their CPU time is the
    # quota's, not too few of them (a drawn ramping quota of 0.27 CPU on 1 worker: on CPU
    # 0.41 of the wait, throttled 0.46, named unexplained, issue 49)
    on_cpu = ("cpu_throttle", "the quota spent: more workers would share it") if quota_spent \
        else ("too_few_workers", "")
    return {
        "loop.handoff": ("transfer_cost", ""),
        "loop.blocked": ("transfer_cost", ""),
        "loop.workers_cpu_wait": ("cpu_throttle", ""),
        "loop.cpu_wait": ("cpu_throttle" if consumer.throttled(trace) else "cpu_contention", ""),
        "workers.on_cpu": on_cpu,
        "workers.cpu_wait": (workers_cpu, ""),
        "workers.storage": (storage, bursts),
        "workers.network": (network, missed),
        "workers.sleeping": (_asleep(trace, waits), ""),
    }


def account(ctx: Context, scored: Mapping[str, float] | None = None) -> Budget | None:
    """The budget of the judged segment's steady waits, or None when the loop did not wait."""
    trace = ctx.trace
    steady = ctx.steady
    waits = ctx.steady_waits
    if ctx.hung:
        # a hang: what holds the loop now is its open wait, whatever the window held before
        # it (issue 49 item 3: named from the blocked call at every poll of the hang)
        steady = np.zeros(trace.n, dtype=bool)
        steady[-1] = True
        waits = WaitIndex(trace.t_end[-1:], trace.wait[-1:])
    if not steady.any():
        return None
    wait = float(trace.wait[steady].sum()) / 1e9
    if wait <= 0:
        return None
    found = ctx.split if not ctx.hung else transfer.split(trace, steady)
    shares = {s: during_waits(trace, "loader_workers_%s_ratio" % s, waits) for s in WORKER_STATES}
    idle = during_waits(trace, "loader_workers_idle_ratio", waits)
    sampled = any(v is not None for v in shares.values())
    causes = mechanisms(trace, scored or {}, waits)
    parts: dict[str, float] = {}
    if found is None:
        ready, handoff, step = wait, 0.0, float(trace.interval[steady].sum()) / 1e9
    else:
        _, split_wait, ready_ns, moved_ns, step_ns = found
        # the waits the hook did not split (an older hook's batches) go with the ready part
        ready = ready_ns / 1e9 + max(0.0, wait - split_wait / 1e9)
        handoff, step = moved_ns / 1e9, step_ns / 1e9
    main_wait, main_on = _main_split(trace, waits)
    if handoff > 0 and main_wait is not None and main_on is not None and main_wait + main_on > 0:
        # taking a batch over, the training thread is on a CPU, runnable without one, or
        # blocked on the worker that sends it. What it could run of the handoff splits as
        # its time does while it could run; what it could not (its running and runnable
        # time a smaller share of its time than the handoff is of the steps) it was blocked
        # on the workers' side: the quota's, as far as the kernel's record says it throttled
        # them (consumer.throttled_share), the handoff's own IPC otherwise (a worker's fd
        # sharer answers each tensor: a drawn transfer cost's workers, idle 98 %, waited
        # for a CPU more than they ran, and that did not make its IPC theirs). Issue 49: a
        # drawn quota's handoff, 3.5 % of the step with the thread running or runnable 1 %
        # of its time, read half "its own work".
        ran = main_wait + main_on
        of_steps = handoff / step if step > 0 else 0.0
        could = handoff if ran >= of_steps else handoff * ran / of_steps
        starved = could * main_wait / ran
        parts["loop.cpu_wait"] = starved
        parts["loop.handoff"] = could - starved
        blocked = handoff - could
        if blocked > 0:
            quota = consumer.throttled_share(trace) or 0.0
            parts["loop.workers_cpu_wait"] = blocked * quota
            parts["loop.blocked"] = blocked * (1.0 - quota)
    elif handoff > 0 and main_wait is not None:
        # an older agent's trace: the CPU wait alone, all of it put on the handoff at most
        starved = min(handoff, main_wait * step)
        parts["loop.cpu_wait"] = starved
        parts["loop.handoff"] = handoff - starved
    elif handoff > 0:
        # the training thread not sampled: the handoff is measured (the hook's split), what
        # held it is not (throttled workers answer it late too, transfer.py)
        parts["loop.unsampled"] = handoff
    if sampled and ready > 0:
        busy = {s: max(0.0, v or 0.0) for s, v in shares.items()}
        # what the sampler saw the producing workers doing, idle time left out; the rest of
        # their time (other calls) stays in the budget as ``workers.other``
        producing = max(1.0 - (idle or 0.0), sum(busy.values()), 1e-9)
        # workers found idle nearly all the time while the loop waited for their batch hold
        # it in nothing the sampler placed (a wait it reads as idle: a loopback socket):
        # their few busy samples are not blown up to the whole wait
        placed = ready * min(1.0, producing / PRODUCING_MIN)
        for s, v in busy.items():
            parts["workers." + s] = placed * v / producing
        parts["workers.other"] = placed * max(0.0, 1.0 - sum(busy.values()) / producing)
        parts["workers.idle"] = ready - placed
    elif ready > 0:
        parts["unsplit"] = parts.get("unsplit", 0.0) + ready
    # unrounded: the codec rounds, once, where the numbers leave as JSON
    comps = sorted((Component(name, sec, sec / wait, *causes.get(name, (None, "")))
                    for name, sec in parts.items() if sec > 0), key=lambda c: -c.seconds)
    return Budget(wait, ready, handoff, tuple(comps), idle, sampled)


def evidence(b: Budget, cause: str) -> Evidence:
    """The budget's row for a cause: the share of the wait its mechanisms held."""
    names = "+".join(c.name for c in b.components if c.cause == cause)
    return Evidence("time_budget " + names, b.share_of(cause), ATTRIBUTE, "above",
                    None, "rank", b.share_of(cause), judged_by="measured")
