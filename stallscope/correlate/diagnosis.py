"""The node-local diagnosis of one rank: verdict, ranked causes with evidence, and the
numbers ``stallscope diagnose`` needs (the contract in docs/diagnose.md; verdicts and causes
are the vocabulary's, stallscope/vocabulary/causes.py).

Verdicts:
- ``unknown``: fewer than MIN_BATCHES batches in the window, or over the line only by
  the run's first batch, its workers' first start (rules.py: starting).
- ``input_bound``: the loop waited on its own loader for at least DATA_WAIT_LINE of
  its step time (the StallscopeDataWaitHigh alert's line) and the GPU, when it is
  measured, was idle during those waits.
- ``not_input_bound``: this rank's loader keeps up, yet its GPU sat idle without the
  loop waiting on data (it waits elsewhere, typically in a collective for a straggler),
  or, with no GPU signal, another rank of its job on this node is input-bound and
  synchronous steps make this one wait for it.
- ``healthy``: otherwise.
The agent sees only its own node's ranks, so the straggler it names is the worst rank
of the job *on this node*; ``stallscope diagnose`` adds the cluster view.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..report import ReportedError
from ..vocabulary import MIN_BATCHES, VERDICTS  # noqa: F401 (VERDICTS: the contract)
from . import (
    budget,
    checks,
    consumer,
    context,
    deaths,
    epochs,
    loader_errors,
    measured,
    predict,
    rules,
    slow_worker,
    standing_causes,
    transfer,
    workers,
)
from . import causes as causes_mod
from .context import Context
from .facts import NONE, RankFacts
from .model import Budget, Cause, Diagnosis, GpuView, Identity, Loop, Matched, RankRow, Straggler
from .overlap import InputBound, after_start, data_wait_ratio
from .sawtooth import sawtooth
from .trace import RankTrace

PREDICTED_CAUSES = 2  # the named cause and its runner-up


def _wait(ident: Mapping[str, Any], ratio: float | None, node: str = "",
          after: float | None = None, handoff: float | None = None) -> rules.RankWait:
    return rules.RankWait(ident.get("rank"), ident.get("pod"), ident.get("node") or node, ratio,
                          after, handoff)


def decide(ib: InputBound, peers: Iterable[rules.RankWait], ident: Mapping[str, Any] | None = None,
           node: str = "", after: float | None = None, handoff: float | None = None) -> rules.Judgement:
    """The Judgement by the one rule set (rules.py) from the node's numbers: this rank's
    data-wait share (every wait, the first batches' included, as the alert counts it;
    ``after``: the same without the run's first batch, rules.RankWait.after_start;
    ``handoff``: the share of the step spent taking batches over, rules.RankWait.handoff),
    its job's ranks on this node (RankWait), and the GPU when it is measured."""
    me = _wait(ident or {}, ib.data_wait_ratio, node, after, handoff)
    gpu = None
    if ib.gpu_idle_ratio is not None:
        gpu = rules.Gpu(ib.gpu_idle_ratio, ib.gpu_idle_without_wait_ratio, ib.gpu_idle_overlap_ratio)
    j = rules.judge(me, list(peers), gpu, scope="node")
    if j.verdict == "input_bound" and ib.iterator_start_wait_seconds > 0.5 * ib.data_wait_seconds:
        j = dataclasses.replace(j, reason=j.reason + (
            " Most of it (%.3gs) is the first batch of %d iterator(s): worker start-up at each "
            "epoch." % (ib.iterator_start_wait_seconds, ib.iterator_starts)))
    return j


def straggler(me: rules.RankWait, peers: Sequence[rules.RankWait], node: str,
              world: int | None = None) -> Straggler:
    """The rank of this job with the highest data-wait share among those on this node
    (RankWait; rules.straggler_of: a rank still starting is none)."""
    worst = rules.straggler_of([me] + list(peers))
    note = ("The agent sees only the ranks on node %s; `stallscope diagnose` adds the "
            "cluster view from Prometheus." % (node or "?"))
    ranks = world if world is not None else max(2, 1 + len(peers))  # others may be elsewhere
    if worst is not None and rules.over(worst.ratio) and not rules.names_straggler(worst.ratio, ranks):
        return Straggler(None, None, None, None, "A job of one rank has no straggler.")
    if worst is None or not rules.over(worst.ratio):
        return Straggler(None, None, None, None, "No rank of this job on this node waits on its "
                         "loader: the straggler, if any, is on another node. " + note)
    return Straggler(worst.rank, worst.pod, worst.node or node,
                     round(worst.ratio, 6) if worst.ratio is not None else None, note)


def _row(p: rules.RankWait) -> RankRow:
    return RankRow(p.rank, p.pod, round(p.ratio, 6) if p.ratio is not None else None,
                   round(p.after_start, 6) if p.after_start is not None else None)


def analyse(trace: RankTrace, peers: Iterable[RankTrace] = (), node: str = "",
            window_seconds: float | None = None, since_ns: int | None = None,
            facts: RankFacts = NONE) -> Diagnosis:
    """Diagnose ``trace``; ``peers`` are the other ranks' traces on this node (any job).

    ``since_ns``: a stall began then (detect.py). The verdict, the loader's numbers and
    the stall period are judged on the stall's own segment; the signals' co-occurrence
    with the waits on the whole trace, whose earlier part gives the quiet time to compare
    against. ``facts``: what the host knows of the rank beyond its trace (facts.py): its
    CFS quota (causes.separate_cpu), cpuset and read limit (capacity.py), memory limit
    (which caps the worker counts predicted), set-up (checks.py; judged from the first
    batch, whatever the verdict) and the loader's own error (loader_errors.py)."""
    return _with_error(_analyse(trace, peers, node, window_seconds, since_ns, facts),
                       facts.loader_error, facts.setup)


def _with_error(d: Diagnosis, error: ReportedError | None, setup: checks.SetUp | None) -> Diagnosis:
    """The loader's own error on the diagnosis; a cause it names leads: the loader stopped."""
    if error is None:
        return d
    judged = loader_errors.judge(error, d.loader, setup.shm_size_bytes if setup is not None else None)
    out = dataclasses.replace(d, loader_error=judged)
    if judged.cause is None:
        return out
    named = causes_mod.make(judged.cause, 1.0, judged.text)
    rest = tuple(c for c in d.causes if c.cause != judged.cause)
    return dataclasses.replace(out, causes=(named,) + rest)


hung = context.hung  # the Context's test, named here since the verdict's path turns on it


def _analyse(trace: RankTrace, peers: Iterable[RankTrace], node: str, window_seconds: float | None,
             since_ns: int | None, facts: RankFacts) -> Diagnosis:
    peers = list(peers)
    whole = trace
    segment = trace.since(since_ns) if since_ns is not None else trace
    if since_ns is not None and segment.n < MIN_BATCHES and hung(trace):
        # A hang: the stall's own segment holds little more than the call still blocked in
        # next(), too few batches for a verdict, while the detector says stalled (issue 30:
        # a rank hung on a frozen mount read "unknown, only 1 batch" for the whole hang).
        # Judged on the window that ends in it: the open wait counts there too. Only a
        # hang: a stall just dated waits for its own batches (judged on the whole window
        # with its healthy stretch, a 10 % stall read "come and go", unexplained).
        segment = trace
    ctx = Context(segment, trace)
    trace = ctx.trace
    ident = trace.ident or {}
    span = trace.span()
    who = Identity.of(ident, node)
    window = window_seconds if window_seconds is not None else (
        round((span[1] - span[0]) / 1e9, 3) if span else 0.0)
    same_job = [p for p in peers if p is not ctx.whole and (p.n >= MIN_BATCHES or context.hung(p))
                and p.ident.get("job") == ident.get("job") and p.ident.get("rank") != ident.get("rank")]
    waits = [_wait(p.ident, data_wait_ratio(p), node, after_start(p)) for p in same_job]
    base = Diagnosis(who=who, window_seconds=window, batches=trace.n, loader=trace.loader,
                     verdict="unknown", reason="",
                     job_ranks_on_node=tuple(sorted((_row(p) for p in waits), key=lambda r: r.rank)),
                     since_ns=int(since_ns) if since_ns is not None else None)
    setup = facts.setup
    if setup is not None:
        # judged on the whole trace: the epochs before a stall are the set-up's too
        epoch_s, startup_s = checks.epochs(whole)
        warned, unknown = checks.evaluate(dataclasses.replace(
            setup, loader=trace.loader if setup.loader is None else setup.loader,
            epoch_seconds=setup.epoch_seconds if setup.epoch_seconds is not None else epoch_s,
            startup_seconds=setup.startup_seconds if setup.startup_seconds is not None else startup_s))
        base = dataclasses.replace(base, warnings=warned, checks_unknown=unknown)
    stuck = next((p for p in same_job if context.hung(p)), None)
    if stuck is not None and not ctx.hung and (trace.open_ns is None or trace.n < MIN_BATCHES):
        return _victim_of_hang(base, who, stuck, node)
    if trace.n < MIN_BATCHES and not ctx.hung:  # a hang is judged while it lasts (issue 49)
        return dataclasses.replace(base, reason="Only %d batches in the window (need %d)." % (
            trace.n, MIN_BATCHES))
    ib = ctx.loop
    per = ctx.period
    saw = sawtooth(trace, per.period_seconds, ctx.waits, per.stall_batches)
    # a detected stall is judged on its own segment, whatever start it holds
    # (and a hang on what it is blocked in now, the first batch's included)
    after = ib.data_wait_ratio_after_start if since_ns is None and not ctx.hung else None
    handoff = transfer.handoff_ratio(trace)
    j = decide(ib, waits, ident, node, after, handoff)
    out = dataclasses.replace(
        base, verdict=j.verdict, reason=j.reason, rule=j.rule,
        data_wait_ratio=round(ib.data_wait_ratio, 6),
        loop=Loop(round(ib.data_wait_seconds, 6), round(ib.steady_data_wait_ratio, 6),
                  round(ib.iterator_start_wait_seconds, 6), round(ib.step_seconds, 6),
                  round(ib.compute_seconds, 6), round(after, 6) if after is not None else None,
                  round(handoff, 6) if handoff is not None else None),
        gpu=GpuView(ib.gpu_signal, trace.gpu_source if ib.gpu_signal else None, ib.gpu_samples,
                    ib.gpu_idle_ratio, ib.gpu_idle_without_wait_ratio),
        gpu_idle_overlap_ratio=ib.gpu_idle_overlap_ratio, stall=per, sawtooth=saw,
        straggler=straggler(_wait(ident, ib.data_wait_ratio, node, after), waits, who.node or node,
                            who.world_size))
    if j.verdict != "input_bound":
        return out
    split = ctx.split
    ready = split[2] / split[4] if split is not None and split[4] > 0 else None
    scored, missing, spent = rank_causes(ctx, facts, ready)
    m = measured.measure(ctx, facts, peers)
    ranked = causes_mod.rank_causes(scored)
    ranked = consumer.attribute(ranked, trace, ready, handoff)
    if m is not None:
        ranked = [dataclasses.replace(c, prediction=predict.for_cause(c.cause, m)) if i < PREDICTED_CAUSES
                  else c for i, c in enumerate(ranked)]
    return dataclasses.replace(
        out, causes=tuple(ranked), headroom=predict.headroom(m) if m is not None else None,
        budget=spent,
        not_evaluated=tuple(sorted(missing, key=causes_mod.VOCABULARY.index)))


@dataclasses.dataclass
class Scoring:
    """What the steps of rank_causes read and write: the context and the rank's facts in,
    the causes scored so far, the causes that could not be evaluated, the stall's time
    budget, and how sure it is that a side of the handoff was short of CPU."""
    ctx: Context
    facts: RankFacts
    ready_ratio: float | None
    scored: list[Cause] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    budget: Budget | None = None
    starved: float = 0.0
    consumer_held: float | None = None
    steady_share: float = 1.0  # of the whole wait, the steady batches' (the budget's base)

    @property
    def split(self) -> tuple[int, float, float, float, float] | None:
        return self.ctx.split


def _signals(s: Scoring) -> None:
    s.scored, s.missing = causes_mod.score_signal_causes(s.ctx.whole, s.ctx.whole_steady_waits)


def _fed(s: Scoring) -> None:
    _, share = s.ctx.busy
    s.scored = [workers.contradict_cpu_shortage(c, share, s.ctx.runnable) for c in s.scored]


def _quota(s: Scoring) -> None:
    s.scored = causes_mod.separate_cpu(s.scored, s.facts.quota_measured, s.facts.quota_cores,
                                       consumer.throttled_share(s.ctx.trace))


def _workers_short(s: Scoring) -> None:
    trace, whole = s.ctx.trace, s.split
    short = workers.cpu_short(trace, s.ctx.steady_waits, trace.compute_ns() / 1e9, s.ctx.runnable)
    if short is not None:
        ready_share = whole[2] / whole[1] if whole is not None and whole[1] > 0 else 1.0
        s.scored = consumer.promote(s.scored, ready_share * short[0], s.facts.quota_cores,
                                    short[1] + ": more workers would share the same CPUs.",
                                    quota_throttled=consumer.workers_throttled(trace))
    s.starved = max((c.score for c in s.scored if c.cause in consumer.CPU_CAUSES), default=0.0)


def _consumer_short(s: Scoring) -> None:
    trace, spent = s.ctx.trace, s.budget
    if spent is None or spent.handoff_seconds <= 0:
        return
    # the share of the handoff the training thread spent blocked on workers runnable
    # without a CPU, as the budget measured it: the CPU cause holds that much of the wait
    # (step ``measured``), not the handoff's own work
    short = sum(c.seconds for c in spent.components
                if c.name == "loop.workers_cpu_wait") / spent.handoff_seconds
    s.starved = max(s.starved, short)
    if consumer.held_share(trace, s.ready_ratio) is None:
        return
    # ... and, where its CPU wait was beyond its workers' (consumer.py), the share it spent
    # runnable without a CPU itself
    held = sum(c.seconds for c in spent.components if c.name == "loop.cpu_wait") / spent.handoff_seconds
    s.consumer_held = held
    s.starved = max(s.starved, held + short)


def _computed(s: Scoring) -> None:
    trace, steady = s.ctx.trace, s.ctx.steady
    for name, found in ((transfer.NAME, transfer.score(trace, steady, s.starved,
                                                       consumer=s.consumer_held is not None,
                                                       found=s.split)),
                        (slow_worker.NAME, slow_worker.score(trace, steady))):
        if found is None:
            s.missing.append(name)
        else:
            s.scored.append(found)


def _standing(s: Scoring) -> None:
    held, absent = standing_causes.score(s.ctx)
    s.scored += held
    s.missing += absent


def _budget(s: Scoring) -> None:
    s.budget = budget.account(s.ctx, {c.cause: c.score for c in s.scored})


def _too_few(s: Scoring) -> None:
    ctx, spent = s.ctx, s.budget
    measured_others = {c.cause for c in spent.components} - {None, "too_few_workers"} if spent else set()
    others = max([c.score for c in s.scored] + [spent.share_of(n) for n in measured_others if n and spent],
                 default=0.0)
    tfw = workers.score(ctx.trace, ctx.period, others, ctx.steady_waits, ctx.steady,
                        (ctx.busy, ctx.runnable))
    if tfw is None:
        s.missing.append("too_few_workers")
    else:
        s.scored.append(tfw)


def _starts(s: Scoring) -> None:
    ctx = s.ctx
    restarted = deaths.restarts(ctx.trace, ctx.starts)
    started = epochs.score(ctx.loop, restarted, ctx.trace, epochs.run_start(ctx.trace, ctx.starts))
    # the wait the starts held for a cause of their own: the epochs', and the restarts'
    # after a worker died (the deaths', scored on the whole wait by the next step)
    total = ctx.loop.data_wait_seconds
    elsewhere = (started.score if started is not None else 0.0) + (
        float(ctx.trace.wait[restarted].sum()) / 1e9 / total if total > 0 else 0.0)
    elsewhere = min(1.0, elsewhere)
    s.scored = epochs.steady_part(s.scored, elsewhere)
    if elsewhere >= epochs.STEADY_EXACT:
        s.steady_share = 1.0 - elsewhere
    if started is not None:
        s.scored.append(started)


def _deaths(s: Scoring) -> None:
    s.scored = deaths.merge(s.scored, deaths.score(s.ctx.whole))


def _measured(s: Scoring) -> None:
    # the budget accounts the steady waits; its shares count as the other causes' do, as
    # parts of the whole wait (epochs.steady_part): restarts after worker deaths held the
    # rest (tests/diagnose/test_deaths.py: a steady handoff's 93 % outranked the deaths)
    s.scored = measured_floor(s.scored, s.budget, s.steady_share)


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the cause ranking: its name, what it does, and why it is where it is."""
    name: str
    run: Callable[[Scoring], None]
    reason: str


# The causes' scoring, in order. Each step reads what the steps before it wrote; nothing
# else reorders or rewrites the scores (issue 49: what is left of ordering rules is this
# declared list, each with its reason). causes.rank_causes then sorts and adds unexplained.
STEPS: tuple[Step, ...] = (
    Step("signals", _signals, "each co-occurrence cause: does its signal move with the stalls "
         "(causes.py), judged over the whole window, whose quiet part is the comparison"),
    Step("fed", _fed, "workers measured running whenever they could were not starved of CPU: "
         "a CPU cause's co-occurrence is taken off by that share (workers.py)"),
    Step("quota", _quota, "a CFS quota's throttling explains its share of the run-queue wait "
         "(the kernel's record, cpu.stat over schedstat, or the throttle's co-occurrence): "
         "cpu_throttle where a quota held them, cpu_contention where none did (causes.py)"),
    Step("workers_short", _workers_short, "workers measured waiting for a CPU would have kept up "
         "running whenever they could: the CPU cause holds the part of the ready wait that "
         "counterfactual removes (workers.cpu_short), which the budget's proportional split "
         "under-counts when either part alone would have been fast enough"),
    Step("standing", _standing, "conditions of the set-up and placement, scored by how much of "
         "the wait their model explains (standing_causes.py)"),
    Step("budget", _budget, "the stall's time budget (budget.py), after the standing causes, "
         "whose link at capacity is a context that names a component's cause"),
    Step("consumer_short", _consumer_short, "a training thread measured waiting for a CPU that "
         "its idle workers did not, or blocked taking batches over from workers waiting for "
         "one: the share of the handoff the budget puts on those waits is the CPU's, not the "
         "handoff's own work (consumer.py); after the budget"),
    Step("computed", _computed, "the causes the hook's own numbers measure: the handoff "
         "(transfer.py, less what a CPU shortage of either side held) and one slow worker "
         "(slow_worker.py); after the CPU steps and the budget, whose shortage they discount"),
    Step("too_few_workers", _too_few, "too slow a loader is the remainder: whatever the other "
         "causes explain, by score or by the share of the wait their mechanism held, is taken "
         "off (workers.py), so it comes after every other cause"),
    Step("starts", _starts, "an iterator's first batches wait for its workers to start, an "
         "epoch's (epoch_start) or a restart's after a worker died (the death's): the other "
         "causes keep the steady part of the wait (epochs.py)"),
    Step("deaths", _deaths, "the restarts after a worker's death are the death's, judged on the "
         "whole wait, the restarts' included (deaths.py)"),
    Step("measured", _measured, "a cause scores at least the share of the wait its mechanism was "
         "measured holding (budget.py): co-occurrence never discounts a mechanism that is on all "
         "the time; last, so no step after it lowers a measured share"),
)


def _victim_of_hang(base: Diagnosis, who: Identity, stuck: RankTrace, node: str) -> Diagnosis:
    """A rank of a job whose other rank on this node is hung in next() (context.hung): in
    synchronous training it waits for that rank in the collective, whatever its own few
    batches say (issue 49: a rank hung before its first batch left its peers 'unknown,
    only 1 batch', their own loaders idle)."""
    peer = stuck.ident or {}
    blocked = float(stuck.wait[-1]) / 1e9
    reason = ("Rank %s is a victim: rank %s (pod %s) has been blocked in next() for %.0f s, hung, "
              "and in synchronous training this rank waits for it; its own loader is not what it "
              "waits on." % (who.rank, peer.get("rank"), peer.get("pod") or "?", blocked))
    return dataclasses.replace(
        base, verdict="not_input_bound", reason=reason, rule="victim",
        straggler=Straggler(peer.get("rank"), peer.get("pod"), peer.get("node") or node,
                            round(data_wait_ratio(stuck), 6),
                            "The straggler is hung on this node (blocked in next()).", hung=True))


def rank_causes(ctx: Context, facts: RankFacts = NONE, ready_ratio: float | None = None
                ) -> tuple[list[Cause], list[str], Budget | None]:
    """Every candidate cause scored on the context by STEPS (each by its kind:
    co-occurrence, computed, standing, and at least the share of the wait its mechanism
    was measured holding), the names of those that could not be evaluated, and the
    stall's time budget (budget.py).
    ``ready_ratio``: the share of the step spent waiting for a ready batch (the hook's
    split), which tells a CPU-short consumer from a CPU-short loader (consumer.py)."""
    s = Scoring(ctx, facts, ready_ratio)
    for step in STEPS:
        step.run(s)
    named = {c.cause for c in s.scored}
    missing = [c for c in dict.fromkeys(s.missing + list(deaths.CAUSES)) if c not in named]
    return s.scored, missing, s.budget


def measured_floor(scored: list[Cause], spent: Budget | None, steady_share: float = 1.0) -> list[Cause]:
    """Each cause the budget's components name scored at least their share of the wait
    (of the steady wait the budget accounts, times ``steady_share``, its part of the
    whole), with the budget's row and sentence; a cause the budget names that nothing
    scored yet is added. The other causes are left as they are."""
    if spent is None:
        return scored
    out = list(scored)
    for name in dict.fromkeys(c.cause for c in spent.components if c.cause is not None):
        share = spent.share_of(name) * steady_share
        if share <= 0:
            continue
        row = budget.evidence(spent, name)
        note = " Measured: %s held %.0f%% of the wait (the stall's time budget)." % (
            " and ".join(c.words for c in spent.components if c.cause == name), 100 * share)
        at = next((i for i, c in enumerate(out) if c.cause == name), None)
        if at is None:
            out.append(causes_mod.make(name, share, note.strip(), [row]))
        elif out[at].score < share:
            out[at] = dataclasses.replace(out[at].with_score(share, note, row), kind=out[at].kind)
        else:
            out[at] = out[at].with_score(out[at].score, "", row)
    return out


def _severity(d: Diagnosis) -> tuple[int, float]:
    order = {"input_bound": 3, "not_input_bound": 2, "healthy": 1, "unknown": 0}
    return order[d.verdict], d.data_wait_ratio or 0.0


def most_severe(found: Sequence[tuple[Mapping[str, Any], Diagnosis]]) -> Diagnosis:
    """The API's answer for several matching ranks, [(identity, diagnosis)]: the one
    that waits most on its loader, with the others summed up in ``matched_ranks``."""
    body = max(found, key=lambda f: _severity(f[1]))[1]
    if len(found) <= 1:
        return body
    matched = sorted((Matched(i["job"], i["rank"], i["pod"], d.verdict, d.data_wait_ratio, d.top_cause)
                      for i, d in found), key=lambda m: (m.job or "", m.rank))
    return dataclasses.replace(body, matched_ranks=tuple(matched), note=(
        "%d ranks match; this is the one that waits most on its loader, see matched_ranks for "
        "the others." % len(found)))
