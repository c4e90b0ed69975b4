"""The verdict rules: written once, applied to two data sources (issue 16).

The agent's ``/api/v1/diagnosis`` (its node's ranks, from the hook's timelines) and
``stallscope diagnose`` on both paths (the job's ranks from Prometheus, or the node's
from the agent) call ``judge`` with the same kind of numbers, so one rank over one
window gets one verdict whichever source answered. The headline alert draws the same
line on the same quantity:

    StallscopeDataWaitHigh: max by (namespace, job) (the rank's 5m ratio) > DATA_WAIT_LINE

where a rank's ratio is every second blocked in next(loader) (the first batch of each
epoch included) over its step seconds. Hence the invariant the tests hold these rules
to: when that expression is true for a rank's job, no rank of the job is ``healthy``
(the worst rank is over the line: ``input_bound``; every other rank is ``input_bound``
over the line on its own, or waits for that rank: ``not_input_bound``).

The one exception is a process's start, when only starting ranks are over the line
(the tests hold the invariant over the ranks judged). A rank's first batch waits for
its workers' first start (forks, imports, opening the dataset), once per run; over the
first seconds of steps that one wait can put the share over the line while every later
batch keeps up (issue 15: a healthy 4-rank job read ``input_bound`` for its first 10 s,
then ``healthy``: verdict flips). Where the source sees that batch (the agent: its timelines), a rank over the
line only by it is ``unknown``, "starting", and no straggler for the others, until its
steps outweigh it or a stall is detected. The alert cannot page on it either: the batch
leaves the rate window (5m) long before the ``for:`` (15m) has held.

Victims and culprits: in synchronous training every rank waits for the slowest, and a
victim's own loader often waits a little too (the per-batch transfer cost: 2-3 % on a
busy node). A rank is a victim, ``not_input_bound`` naming the straggler, when another
rank of its job is over the line and waits STRAGGLER_FACTOR times as long as it does
(the StallscopeStragglerRank alert's factor): fixing the straggler is what buys time.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..vocabulary import DATA_WAIT_LINE, STRAGGLER_FACTOR

# GPU idle while the loop was *not* waiting on data, above this share of the time: the
# rank waits elsewhere (a collective for a slower rank, another node's straggler).
COLLECTIVE_IDLE = 0.15
# GPU idle below this share through the waits: queued GPU work hid them (said, not excused).
GPU_BUSY_THROUGH = 0.05
# The handoff's least share of the data-wait for the reason to say the loader keeps up:
# the larger part of the stall's time, as the budget would put it first.
HANDOFF_HOLDS = 0.5


@dataclasses.dataclass(frozen=True)
class RankWait:
    """One rank's data-wait share over the window: seconds in next() / step seconds."""
    rank: Any
    pod: Any
    node: Any
    ratio: float | None
    # The same share with the run's first batch left out, when the window holds that
    # batch and the source can tell (the agent's timelines; overlap.after_start), else None.
    after_start: float | None = None
    # The share of the step time spent handing batches over (the waits' part that was not
    # waiting for a worker's batch to be ready: hook/transfer.py), where the hook split the
    # waits, else None.
    handoff: float | None = None

    @property
    def keeps_up(self) -> bool:
        """Over the line, yet the loader had the batches ready: the handoff puts it there
        and holds the larger part of the wait. A rank at the line whose ready-wait is just
        under it while the handoff is the smaller part is waiting on its loader: drawn 420
        (wait 2.2 %, handoff 0.4 %) said "the loader keeps up" over workers blocked on a
        cache's misses for 80 % of the wait (issue 49: one report, one story)."""
        return over(self.ratio) and self.handoff is not None and self.ratio is not None \
            and not over(self.ratio - self.handoff) and self.handoff >= HANDOFF_HOLDS * self.ratio

    @property
    def starting(self) -> bool:
        """Over the line only by the run's first batch: the start-up decides, not the loader."""
        return over(self.ratio) and self.after_start is not None and not over(self.after_start)

    def who(self) -> str:
        return "rank %s (pod %s on node %s)" % (self.rank, self.pod, self.node or "?")


@dataclasses.dataclass(frozen=True)
class Gpu:
    """What the agent measured of the rank's GPU over the same window (None: no GPU)."""
    idle_ratio: float | None = None
    idle_without_wait_ratio: float | None = None
    idle_overlap_ratio: float | None = None


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: str
    reason: str
    rule: str                      # which rule decided (for the report and the tests)
    straggler: RankWait | None     # the job's worst rank (this one, another, or None)


def pct(x: float | None) -> str:
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def over(ratio: float | None) -> bool:
    return ratio is not None and ratio >= DATA_WAIT_LINE


def straggler_of(job: list[RankWait]) -> RankWait | None:
    """The job's worst rank (ties: the lowest rank, so both paths pick the same one); a
    rank still starting is not judged, as a straggler either."""
    known = [r for r in job if r.ratio is not None and not r.starting]
    if not known:
        return None
    return max(known, key=lambda r: (r.ratio, -_order(r.rank)))


def names_straggler(worst: float | None, ranks: int) -> bool:
    """Whether a report names the job's worst rank as its straggler: it waits over the
    line and the job has another rank to be slower than (issue 49: single-rank runs named
    their only rank, and a healthy four-rank job one of its ranks, through Prometheus)."""
    return ranks > 1 and over(worst)


def _order(rank: Any) -> float:
    try:
        return float(rank)
    except (TypeError, ValueError):
        return 0.0


def judge(me: RankWait, job: list[RankWait], gpu: Gpu | None = None,
          scope: str = "job") -> Judgement:
    """The verdict for ``me`` among ``job`` (its ranks that the source sees, ``me``
    included or not); ``scope`` says which ranks those are ("job", or "node" when the
    agent sees only its node's), for the reasons' wording."""
    ranks = [r for r in job if (r.rank, r.pod) != (me.rank, me.pod)] + [me]
    worst = straggler_of(ranks)
    if me.ratio is None:
        return Judgement("unknown", "No data-wait measurement for rank %s in the window." % me.rank,
                         "no_data", worst)
    other = worst is not None and (worst.rank, worst.pod) != (me.rank, me.pod)
    if (other and worst is not None and worst.ratio is not None and over(worst.ratio)
            and (not over(me.ratio) or worst.ratio >= STRAGGLER_FACTOR * me.ratio)):
        mine = ("its own loader keeps up (data-wait %s)" % pct(me.ratio) if not over(me.ratio) else
                "its own loader waits %s (over the %s line, but a fraction of the straggler's)" % (
                    pct(me.ratio), pct(DATA_WAIT_LINE)))
        text = ("Rank %s is a victim: %s, while %s waits %s of its step time on its loader; in "
                "synchronous training this rank waits for it, and fixing that rank is what buys "
                "time." % (me.rank, mine, worst.who(), pct(worst.ratio)))
        if gpu is not None and (gpu.idle_without_wait_ratio or 0.0) >= COLLECTIVE_IDLE:
            text += (" Measured: its GPU was idle %s of the time while the loop was not waiting "
                     "on data (in the collective, for the straggler)." % pct(gpu.idle_without_wait_ratio))
        return Judgement("not_input_bound", text, "victim", worst)
    if me.starting:
        return Judgement("unknown", (
            "Rank %s is starting: it waited %s of its step time, over the %s line only by its "
            "first batch, which waited for its workers' first start; its other batches waited "
            "%s. Judged once its steps outweigh that start, or at once when a stall is "
            "detected." % (me.rank, pct(me.ratio), pct(DATA_WAIT_LINE), pct(me.after_start))),
            "starting", worst)
    if over(me.ratio) and me.keeps_up and me.ratio is not None and me.handoff is not None:
        # The SLI stays what it is (every second in next()), but the loader is not what is
        # slow: its batches were ready, and taking each one over is the cost (issue 30).
        return Judgement("input_bound", (
            "The loader keeps up; the per-batch handoff costs %s of the step. Rank %s waits in "
            "next() for %s of its step time (line: %s), yet only %s waiting for a worker's "
            "batch to be ready: the rest is taking each ready batch over from the workers "
            "(the causes say what held it: its own work, or a process short of CPU)." % (
                pct(me.handoff), me.rank, pct(me.ratio), pct(DATA_WAIT_LINE),
                pct(max(0.0, me.ratio - me.handoff)))), "handoff", worst)
    if over(me.ratio):
        text = "Rank %s waits on its own loader for %s of its step time (line: %s)" % (
            me.rank, pct(me.ratio), pct(DATA_WAIT_LINE))
        if other and worst is not None and over(worst.ratio):
            text += "; %s waits %s, within %gx of it: both are input-bound" % (
                worst.who(), pct(worst.ratio), STRAGGLER_FACTOR)
        elif len(ranks) > 1:
            text += "; it is the %s's slowest rank" % ("job" if scope == "job" else "node's ranks of the job")
        if gpu is not None and gpu.idle_overlap_ratio is not None:
            text += "; %s of the GPU's idle time overlapped those waits" % pct(gpu.idle_overlap_ratio)
        # Said only when the GPU idled for well under the waits (queued work covered
        # them), not when its idle time merely matches a small wait.
        if gpu is not None and gpu.idle_ratio is not None and gpu.idle_ratio < GPU_BUSY_THROUGH \
                and gpu.idle_ratio < 0.5 * me.ratio:
            text += ("; the GPU stayed busy through them (idle %s): queued GPU work hides the "
                     "waits for now, and the step time grows once it stops" % pct(gpu.idle_ratio))
        return Judgement("input_bound", text + ".", "over_line", worst)
    if gpu is not None and (gpu.idle_without_wait_ratio or 0.0) >= COLLECTIVE_IDLE:
        return Judgement("not_input_bound", (
            "The GPU was idle %s of the time while the loop was not waiting on data (data-wait "
            "%s): rank %s waits elsewhere, most likely in a collective for a slower rank." % (
                pct(gpu.idle_without_wait_ratio), pct(me.ratio), me.rank)), "gpu_idle_elsewhere", worst)
    return Judgement("healthy", "Rank %s waited %s of its step time for data (line: %s)." % (
        me.rank, pct(me.ratio), pct(DATA_WAIT_LINE)), "under_line", worst)
