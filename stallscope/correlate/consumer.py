"""Who was short of CPU: the loader, or the training process that consumes its batches
(issue 30: "a throttled training process with idle workers").

A CFS quota, or crowded CPUs, can hold back either side of the handoff. The CPU causes'
signals say that the rank's cgroups were throttled or its tasks queued, not which task
the loop waited on. Two measurements together say it:
- the hook's split of each wait (hook/transfer.py): the batches were ready (the
  ready-wait under the data-wait line), so the waits are the handoff. That alone does
  not place the shortage: throttled workers answer the handoff late too (the lab's
  cpu-throttle run measured 91 % of its wait as transfer, transfer.py);
- the loader-state sampler (exporters/loaderstate.py): the training process's main
  thread runnable with no CPU for a share of its time (MAIN_CPU_WAIT_LINE) that its
  workers are not.
Then the process held back is the consumer: the fix is the trainer container's CPU limit
(or fewer processes competing with it), and more workers, which compete with it for the
same CPUs, make it worse. Without the sampler's numbers nothing is said.

The cause keeps its name (the CPU is what is short, and its alert pages on the same
throttling); its sentence and evidence say which process it held back. Its score is the
handoff's share of the wait the consumer's shortage explains (``promote``): a quota that
throttles all along scores low by co-occurrence (it was on outside the stalls too), so
without this the stretched handoff itself led as ``transfer_cost`` (the lab's
trainer-throttled run: transfer_cost 0.85, cpu_throttle 0.07, with the main thread
waiting for a CPU 12-18 % of its time and its idle workers under 1 %).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..report import UNREPORTED
from ..vocabulary import DATA_WAIT_LINE, line_of, signal
from .causes import make
from .model import Cause, Evidence
from .trace import RankTrace

CPU_CAUSES = ("cpu_throttle", "cpu_contention")
WORKERS_IDLE = signal("loader_workers_idle_ratio").name
WORKERS_CPU_WAIT = signal("loader_workers_cpu_wait_ratio").name
MAIN_CPU_WAIT = signal("loader_main_cpu_wait_ratio").name
THROTTLED = line_of("cpu_throttle", "cfs_throttled_ratio")
THROTTLED_SECONDS = signal("cfs_throttled_seconds_rate").name
HELD_BACK = signal("cfs_held_back_ratio").name
# The main thread runnable with no CPU for a tenth of its time: a quota or a crowd holds
# the consumer back (a loop that blocks in next() or sleeps on the GPU is not runnable),
# when its workers wait for a CPU less than half as much.
MAIN_CPU_WAIT_LINE = 0.1


def _mean(trace: RankTrace, name: str) -> float | None:
    _, series = trace.signal(name, ("rank",))
    span = trace.span()
    if series is None or span is None:
        return None
    s = series.clip(*span)
    return float(s.v.mean()) if len(s) else None


def _waits(trace: RankTrace, ready_ratio: float | None) -> tuple[float, float | None] | None:
    """(the main thread's CPU wait, its workers') when the loader kept up and the consumer,
    not its workers, waited for a CPU; None otherwise."""
    if ready_ratio is None or ready_ratio >= DATA_WAIT_LINE:
        return None
    main_wait, workers_wait = _mean(trace, MAIN_CPU_WAIT), _mean(trace, WORKERS_CPU_WAIT)
    if main_wait is None or main_wait < MAIN_CPU_WAIT_LINE or (
            workers_wait is not None and workers_wait >= 0.5 * main_wait):
        return None
    return main_wait, workers_wait


def held_share(trace: RankTrace, ready_ratio: float | None) -> float | None:
    """How much of the handoff's wait the consumer's CPU shortage explains: the share of
    the main thread's CPU wait beyond its workers' (1 when they never waited, 0.5 at the
    rule's edge, where they waited half as much); None where the rule does not hold."""
    found = _waits(trace, ready_ratio)
    if found is None:
        return None
    main_wait, workers_wait = found
    return 1.0 - (workers_wait or 0.0) / main_wait


def throttled(trace: RankTrace) -> bool:
    """Whether the rank's cgroups were throttled in at least the line's share of their CFS
    periods over the window, on the mean (the kernel's own record, cpu.stat)."""
    mean = _mean(trace, THROTTLED.signal)
    return mean is not None and mean >= THROTTLED.threshold


def throttled_share(trace: RankTrace) -> float | None:
    """The quota's share of the seconds the rank's workers waited for a CPU, at most 1; 0
    when the kernel's record says the quota did not throttle them; None when not measured.
    The share of the time a runnable process of the cgroup was held back by the quota
    (cfs_held_back_ratio: the throttled seconds a second over the CPUs its processes spread
    across, as the kernel adds a throttled cfs_rq's time once per CPU) over the share of
    its time a worker waited for a CPU (schedstat, which counts a throttled task's time as
    waiting). Recorded before the held-back share: the throttled seconds over the workers,
    which under-reads a quota on more workers than CPUs: 4 workers on 2 CPUs read at most
    half, and drawn runs under a bursty quota read 0.37-0.47 and were named cpu_contention
    (seeds 439, 443, issue 49)."""
    if not throttled(trace):
        return 0.0 if _mean(trace, THROTTLED.signal) is not None else None
    held, secs = _mean(trace, HELD_BACK), _mean(trace, THROTTLED_SECONDS)
    wait = _mean(trace, WORKERS_CPU_WAIT)
    workers = (trace.loader or UNREPORTED).num_workers or 0
    if wait is None or not workers:
        return None
    if wait <= 0:
        return 1.0
    if held is not None:
        return min(1.0, held / wait)
    return min(1.0, secs / (wait * workers)) if secs is not None else None


def workers_throttled(trace: RankTrace) -> bool:
    """Whether the quota, not a crowd, held the rank's workers back: its cgroups' throttled
    seconds a second (cpu.stat, summed over the CPUs' run queues) at least half the
    seconds its workers waited for a CPU a second (schedstat, which counts a throttled
    task's time as waiting). A throttled run queue holding two workers counts once there
    and twice in schedstat, so a quota's share is if anything under-read. A crowd alone
    leaves the throttled seconds near 0, and the co-occurrence scores decide as before
    (a workers' quota of 0.2 CPU on a crowded node named cpu_contention for part of its
    stall: the live mixin test's top)."""
    share = throttled_share(trace)
    return share is not None and share >= 0.5


def promote(scored: Sequence[Cause], score: float, quota_cores: float | None,
            note: str = "The training process was short of CPU while it took batches over.",
            quota_throttled: bool = False) -> list[Cause]:
    """The CPU cause that held a side of the handoff back scored at least ``score``, the
    part of the wait its model explains (held_share here; the workers' side:
    workers.cpu_short). Which one: cpu_throttle where ``quota_throttled`` (the kernel's
    record says the quota held that side back: ``throttled`` for the consumer, whose
    co-occurrence scores cannot tell, as both CPU causes' are cut to 0 when the workers
    were not starved, workers.contradict_cpu_shortage: a recorded trainer-throttled run,
    which carries no quota, was named cpu_contention; ``workers_throttled`` for the
    workers), else the CPU cause the signals
    already scored higher (the quota's throttling, or the run queue), else cpu_throttle
    under a CFS quota and cpu_contention without one. ``note`` is added to its sentence."""
    present = sorted((c for c in scored if c.cause in CPU_CAUSES and c.score > 0), key=lambda c: -c.score)
    if quota_throttled or (not present and quota_cores is not None):
        name = "cpu_throttle"
    else:
        name = present[0].cause if present else "cpu_contention"
    score = round(score, 4)
    out = list(scored)
    for i, c in enumerate(out):
        if c.cause == name:
            if c.score < score:
                out[i] = dataclasses.replace(c, score=score, summary=c.summary + " " + note)
            return out
    out.append(make(name, score, note))
    return out


def attribute(ranked: Sequence[Cause], trace: RankTrace, ready_ratio: float | None,
              handoff_ratio: float | None) -> list[Cause]:
    """The ranked causes, a CPU cause's sentence saying that the consumer was held back
    when the loader kept up (``ready_ratio``: the share of the step spent waiting for a
    ready batch; ``handoff_ratio``: the share spent taking batches over; both measured
    by the hook, transfer.py)."""
    out = list(ranked)
    found = _waits(trace, ready_ratio)
    if handoff_ratio is None or found is None or ready_ratio is None:
        return out
    main_wait, workers_wait = found
    idle = _mean(trace, WORKERS_IDLE)
    for i, c in enumerate(out):
        if c.cause not in CPU_CAUSES:
            continue
        held = "throttled" if c.cause == "cpu_throttle" else "kept off the CPU"
        text = (" The loader kept up: the loop waited %.1f%% of its step for a ready batch and "
                "%.1f%% taking batches over, so the process %s was the training process, the "
                "consumer" % (100 * ready_ratio, 100 * handoff_ratio, held))
        evidence = [Evidence("ready_wait_ratio", round(ready_ratio, 6), DATA_WAIT_LINE, "below",
                             None, "rank", judged_by="measured")]
        if idle is not None:
            text += "; its loader workers were idle %.0f%% of their time" % (100 * idle)
            evidence.append(Evidence(WORKERS_IDLE, round(idle, 4), None, "above", None, "rank"))
        text += "; the main thread waited for a CPU %.0f%% of its time" % (100 * main_wait)
        evidence.append(Evidence(MAIN_CPU_WAIT, round(main_wait, 4), MAIN_CPU_WAIT_LINE, "above",
                                 None, "rank"))
        if workers_wait is not None:
            text += ", its workers %.0f%%" % (100 * workers_wait)
        if c.cause == "cpu_throttle":
            text += (". Raise the trainer container's CPU limit; the loader has headroom, and more "
                     "workers would compete with the consumer for the same quota.")
        else:  # no quota held it: the node's CPUs were busy, with its own workers among them
            text += (". Run fewer processes beside it (fewer loader workers, cheaper work in them, "
                     "other pods off its CPUs) or give it CPUs of its own; the loader has headroom, "
                     "and more workers would take more of the CPUs the consumer needs.")
        out[i] = c.with_score(c.score, text, *evidence)
    return out
