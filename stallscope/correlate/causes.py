"""Cause scores from co-occurrence: does a candidate signal move with the stalls?

Each candidate cause is probed through one or more signals (see CAUSES). For one probe,
every signal sample covers an interval; the loop's data-wait inside that interval comes
from the hook's events. Then:

- explained: the share of all data-wait time that fell in samples where the signal was
  past its threshold, or was in the sample before ("would this cause account for most
  of the wait?"; a cause leads its stalls a little, see score_probe);
- false alarm: the share of *quiet* time (samples with little waiting) in which the
  signal was past its threshold too. A high-but-flat signal is active in quiet time as
  well, so it does not move with the stalls, whatever its average;
- score = explained x (1 - false alarm), in [0, 1].

When the stalls are continuous (no quiet samples to compare against, e.g. a throttled
loader stalls on every batch) and the signal goes on and off, the loop must wait more
while it is on (intensity). When it is on all along too, the level during the stalls is
all there is: the score is discounted (LEVEL_ONLY_*) and says so. A node-wide signal is
discounted more than a rank's own: other tenants share it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import vocabulary
from ..vocabulary import ATTRIBUTE
from ..vocabulary.entries import Line
from .model import Cause, Evidence
from .trace import RankTrace, Series, WaitIndex

QUIET_SHARE = 0.25          # a sample is quiet when its wait share < 25% of the typical stall's
MIN_QUIET_TIME = 0.1        # co-occurrence needs >= 10% of the window to be quiet
LEVEL_ONLY_RANK = 0.8
LEVEL_ONLY_NODE = 0.6
ALWAYS_ON = 0.9             # a signal past its threshold this share of the time is "always on"

# The causes probed through signals, with their co-occurrence lines (the vocabulary's);
# the others are computed (too_few_workers: workers.py, transfer_cost: transfer.py) or
# what is left (unexplained).
CAUSES = tuple(c for c in vocabulary.CAUSES if c.kind == "co_occurrence")
VOCABULARY = vocabulary.CAUSE_NAMES
SHARED = frozenset(c.name for c in vocabulary.CAUSES if c.shared)
SYMPTOM_OF = {c.name: frozenset(c.symptom_of) for c in vocabulary.CAUSES if c.symptom_of}


def kind_of(name: str) -> str:
    known = vocabulary.CAUSE.get(name)
    return known.kind if known is not None else "remainder"


def make(name: str, score: float, summary: str, evidence: Iterable[Evidence] = (), **more: Any) -> Cause:
    """A Cause of the vocabulary's kind, its score rounded as the API shows it."""
    return Cause(name, round(float(score), 4), summary, tuple(evidence), kind_of(name), **more)


def unit(line: Line) -> str:
    return vocabulary.signal(line.signal).unit


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ratio":
        return "%.0f%%" % (100 * value)
    if unit == "seconds":
        return "%.3gs" % value
    if unit == "bytes_rate":
        return "%.3g MB/s" % (value / 1e6)
    if unit == "count_rate":
        return "%.3g/s" % value
    return "%.3g" % value


@dataclasses.dataclass
class ProbeResult:
    probe: Line
    scope: str
    samples: int
    explained: float
    false_alarm: float | None   # None in level-only mode
    during: float
    outside: float | None
    score: float
    mode: str                   # co-occurrence, intensity (stalls throughout) or level

    def evidence(self) -> Evidence:
        p = self.probe
        return Evidence(p.signal, _r(self.during), p.threshold, "above" if p.above else "below",
                        _r(self.outside), self.scope, _r(self.explained), _r(self.false_alarm),
                        self.samples, self.mode)


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 6)


def score_probe(probe: Line, scope: str, series: Series, wait_index: WaitIndex,
                span: tuple[int, int]) -> ProbeResult | None:
    s = series.clip(*span)
    if len(s) < 2:
        return None
    dt = s.dt()
    waited = wait_index.per_sample(s)
    total_wait = waited.sum()
    if total_wait <= 0:
        return None
    dtf = dt.astype(np.float64)
    v = s.v
    active = v > probe.threshold if probe.above else v < probe.threshold
    # A cause may lead its stalls by one sample: the prefetched batches hide its start,
    # and batches begun under it arrive late after it ends.
    led = active | np.concatenate(([False], active[:-1]))
    explained = float(waited[led].sum() / total_wait)
    # Two samples can share a time stamp (worker samples merged slightly out of order):
    # a zero-length sample waited nothing, and must not turn the typical share into NaN.
    share = np.divide(waited, dtf, out=np.zeros_like(dtf), where=dtf > 0)
    typical = float((share * waited).sum() / total_wait)
    quiet = share <= QUIET_SHARE * typical
    quiet_time = dtf[quiet].sum()
    mode = "co-occurrence"
    if quiet_time >= MIN_QUIET_TIME * dtf.sum() and quiet.sum() >= 2:
        # Judged like ``explained`` (active or just active), except that a signal that
        # just rose and is followed by a stall is leading it, not a false alarm.
        rose = active & ~np.concatenate(([False], active[:-1]))
        leading = rose & np.concatenate((~quiet[1:], [False]))
        false_alarm = float(dtf[quiet & led & ~leading].sum() / quiet_time)
        factor = 1.0 - false_alarm
    else:
        false_alarm = None
        on_time = dtf[active].sum()
        if on_time >= ALWAYS_ON * dtf.sum():
            mode = "level"  # always past the threshold while always stalling: level only
            explained = float(waited[active].sum() / total_wait)
            factor = LEVEL_ONLY_RANK if scope == "rank" else LEVEL_ONLY_NODE
        else:
            # Stalls throughout, the signal on and off: the loop must wait more while it
            # is on, or it does not move with the stalls.
            mode = "intensity"
            explained = float(waited[active].sum() / total_wait)
            on = waited[active].sum() / on_time if on_time > 0 else 0.0
            off = waited[~active].sum() / dtf[~active].sum()
            factor = float(np.clip((on - off) / on, 0.0, 1.0)) if on > 0 else 0.0
    out_w = np.maximum(dtf - waited, 0.0)
    during = float((v * waited).sum() / total_wait)
    outside = float((v * out_w).sum() / out_w.sum()) if out_w.sum() > 0 else None
    return ProbeResult(probe, scope, len(s), explained, false_alarm, during, outside,
                       explained * factor, mode)


def summary(cause: Any, best: ProbeResult) -> str:
    p = best.probe
    u = unit(p)
    text = "%s during %.0f%% of the data-wait: %s was %s during stalls vs %s outside (threshold %s)." % (
        cause.what, 100 * best.explained, p.signal, fmt(best.during, u),
        fmt(best.outside, u), fmt(p.threshold, u))
    if best.mode == "level":
        text += " Stalls were continuous, so this rests on the level alone, not on timing."
    elif best.mode == "intensity":
        text += (" Stalls were continuous; the waits were %s while it was past the threshold."
                 % ("longer" if best.score > 0 else "no longer"))
    elif best.false_alarm is not None and best.false_alarm > 0.2:
        text += " It was also past the threshold in %.0f%% of the quiet time." % (100 * best.false_alarm)
    return text


def score_signal_causes(trace: RankTrace, wait_index: WaitIndex) -> tuple[list[Cause], list[str]]:
    """A Cause for every co-occurrence cause with data, plus the names of the causes
    without any signal in the window."""
    span = trace.span()
    found: list[Cause] = []
    missing: list[str] = []
    for cause in CAUSES:
        results = []
        for probe in cause.lines:
            scope, series = trace.signal(probe.signal, probe.scopes)
            if series is None or scope is None or span is None:
                continue
            r = score_probe(probe, scope, series, wait_index, span)
            if r is not None:
                results.append(r)
        if not results:
            missing.append(cause.name)
            continue
        best = max(results, key=lambda r: r.score)
        found.append(make(cause.name, best.score, summary(cause, best),
                          [r.evidence() for r in sorted(results, key=lambda r: -r.score)]))
    return found, missing


def rank_causes(scored: Sequence[Cause]) -> list[Cause]:
    """Sort by score and add ``unexplained`` = 1 - the best score, so that a weak best
    candidate is outranked by an honest "unexplained"."""
    best = max((c.score for c in scored), default=0.0)
    top = max(scored, key=lambda c: c.score) if scored else None
    if top is None:
        text = "No signal for any candidate cause was recorded for this rank in the window."
    elif best < ATTRIBUTE:
        text = ("No candidate signal moved with the stalls enough to explain most of the "
                "wait; the closest is %s (score %.2f)." % (top.cause, top.score))
    else:
        text = "The share of the wait that %s does not account for." % top.cause
    return order(list(scored) + [make("unexplained", 1.0 - best, text)])


def order(causes: Sequence[Cause]) -> list[Cause]:
    """The causes in the order a report gives them, on every path (the agent's ranking and
    diagnose's from Prometheus alone): by score, but among the causes that explain the
    wait (score >= ATTRIBUTE)
    - the rank's own causes lead the node-wide ones (``shared``): slow reads on this
      rank's mount show up as the pod's I/O pressure as well, and the fix is the mount's
      (issue 16);
    - a symptom comes right after its cause (the vocabulary's ``symptom_of``: a stuck
      FUSE mount makes its reads slow, disk write bursts on the node make the reads slow),
      wherever that cause ranks, and says so."""
    rank = {name: i for i, name in enumerate(VOCABULARY)}
    explains = {c.cause: c for c in causes if c.score >= ATTRIBUTE}

    def own(c: Cause) -> int:
        return -(c.cause in explains and c.cause not in SHARED)
    lead_of: dict[str, Cause] = {}
    for c in causes:
        of = sorted((explains[n] for n in SYMPTOM_OF.get(c.cause, frozenset()) & set(explains)),
                    key=lambda x: (own(x), -x.score, rank.get(x.cause, 99)))
        if of and c.cause in explains:
            lead_of[c.cause] = of[0]
    # a cause and its symptoms rank as one: as the rank's own when a symptom is (the
    # bursts slowed this rank's reads), at the cause's score
    group_own: dict[str, int] = {}
    for c in causes:
        head = lead_of.get(c.cause, c)
        group_own[head.cause] = min(group_own.get(head.cause, 0), own(c), own(head))
    keyed = []
    for c in causes:
        led = lead_of.get(c.cause)
        if led is not None:
            c = dataclasses.replace(c, summary=c.summary + (
                " Ranked after %s (%.2f), which explains the wait as well and moved with it: this "
                "is its symptom." % (led.cause, led.score)))
        first = led or c
        keyed.append(((group_own[first.cause], -first.score, rank.get(first.cause, 99),
                       led is not None, rank.get(c.cause, 99)), c))
    keyed.sort(key=lambda kc: kc[0])
    return [c for _, c in keyed]


def separate_cpu(scored: list[Cause], quota_measured: bool, quota_cores: float | None,
                 throttled_share: float | None = None) -> list[Cause]:
    """cpu_throttle (a CFS quota held the loader back: raise the limit) vs cpu_contention
    (it waited for a core with no quota throttling it: the node is crowded, a limit buys
    nothing). ``quota_measured``: the cfs exporter ran; ``quota_cores``: the rank's
    effective quota or None. Throttled tasks queue too, so throttling takes its share off
    the run-queue cause: the kernel's record of that share (``throttled_share``,
    consumer.throttled_share: cpu.stat's throttled seconds over schedstat's run-queue wait)
    or, where larger, the throttle's co-occurrence. The record counts a quota that throttled
    all along, which co-occurrence discounts (issue 49: a drawn quota throttling 93 % of the
    quiet time too explained "7 %" of the run-queue wait, and the report said no quota
    throttled the rank). Without a quota there is no throttling."""
    by = {c.cause: c for c in scored}
    contention, throttle = by.get("cpu_contention"), by.get("cpu_throttle")
    if contention is None:
        return scored
    out = contention
    if quota_measured:
        cores = quota_cores
        out = out.with_score(out.score, " The rank's cgroups have no CFS quota: nothing throttled "
                             "them." if cores is None else "",
                             Evidence("cfs_quota_cores", cores, None, "above", None, "rank"))
    share = max(throttle.score if throttle is not None else 0.0, throttled_share or 0.0)
    if share > 0:
        out = out.with_score(contention.score * (1.0 - share),
                             " Throttling by the CFS quota explains %.0f%% of it (cpu_throttle)." % (
                                 100 * share))
    return [out if c is contention else c for c in scored]
