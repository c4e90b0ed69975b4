"""slow_worker: one loader worker holds every batch behind its own (issue 18, item 2).

A DataLoader hands batch indices to its workers in turn and, with ``in_order=True`` (the
default), delivers batches in that order: when one worker is slower than the others, the
loop waits for its batch while the others' batches are ready (pytorch/pytorch#135409).
With ``in_order=False`` (torch >= 2.6) the loop takes whichever batch is ready and new
indices go to workers with room, so the fast workers carry the load.

Measured from the workers' own reports: each batch's load time (``batch_load_seconds``)
and the worker that made it (``batch_worker_pid``, the same time stamps). Per worker: its
load times. Per steady wait of the loop: the worker whose batch ended it (the last batch
finished before the wait ended) and whether, when it began, batches were ready (finished
by the workers, not yet taken by the loop: held back by the order). The score:

    score = (share of the wait spent on the slowest worker's batches)
          x (share of the wait that in_order=False removes, replayed below)
          x (how far the slowest worker stands out: its median load over the others')
          x (1, or CONSISTENCY_MISS when its fast batches are as fast as the others':
             costly batches that happened to fall to one worker, not a slow worker)
"""
from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from ..report import UNREPORTED
from ..vocabulary import signal
from .causes import make
from .model import Cause, Evidence, WorkerSpread

NAME = "slow_worker"
BATCH_LOAD = signal("batch_load_seconds").name
BATCH_WORKER = signal("batch_worker_pid").name
WORKER_REPORT = signal("worker_report_pid").name
MIN_PER_WORKER = 3          # batches a worker must have made in the window
SPREAD_LOW, SPREAD_HIGH = 1.25, 2.0   # slowest / others' median load: no .. clear spread
CONSISTENCY_MISS = 0.25
REPLAY_BATCHES = 600
SEED = 17
# A worker's report carries every batch it finished before it was sent, and its workers
# report each on its own beat (the hook's, whatever it is: the analysis reads the times
# the reports were sent from the trace, worker_report_pid): the newest seconds of the
# window hold some workers' batches and not yet the others'. A worker whose newest report
# is older than the newest of all by more than the longest spacing of one worker's
# reports in the trace, and this slack, has stopped reporting (it died), not late.
REPORT_SLACK_NS = int(2e9)


def per_worker(trace: Any) -> dict[int, np.ndarray] | None:
    """{worker PID: its batches' load times (s), oldest first} over the trace's span, or
    None without the workers' per-batch reports."""
    span = trace.span()
    _, load = trace.signal(BATCH_LOAD, ("rank",))
    _, who = trace.signal(BATCH_WORKER, ("rank",))
    if span is None or load is None or who is None:
        return None
    load, who = load.clip(*span), who.clip(*span)
    if len(load) != len(who) or not np.array_equal(load.t, who.t):
        return None  # recorded together, one sample each per batch: anything else is torn
    pids = who.v.astype(np.int64)
    return {int(p): load.v[pids == p] for p in np.unique(pids)}


def _completions(trace: Any, span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    _, load = trace.signal(BATCH_LOAD, ("rank",))
    _, who = trace.signal(BATCH_WORKER, ("rank",))
    load, who = load.clip(*span), who.clip(*span)
    return load.t, who.v.astype(np.int64)


def report_times(trace: Any) -> dict[int, np.ndarray] | None:
    """{worker PID: the times its reports were sent, oldest first}, or None where the
    trace has none (a recording from before the agent kept them)."""
    _, sent = trace.signal(WORKER_REPORT, ("rank",))
    if sent is None:
        return None
    pids = sent.v.astype(np.int64)
    return {int(p): sent.t[pids == p] for p in np.unique(pids)}


def reported_until(trace: Any) -> int | None:
    """The newest time up to which every reporting worker's batches have arrived: the
    oldest of the workers' newest reports, those that stopped reporting aside; None
    without any. A recording without the report times: the oldest of the workers'
    newest batches (a report went after each), no worker judged stopped."""
    t_done, pid = _completions(trace, trace.span())
    if not len(t_done):
        return None
    sent = report_times(trace)
    if not sent:
        return int(min(t_done[pid == p].max() for p in np.unique(pid)))
    newest = {p: int(t[-1]) for p, t in sent.items()}
    for p in np.unique(pid):  # a batch came in a report sent after it
        newest[int(p)] = max(newest.get(int(p), 0), int(t_done[pid == p].max()))
    latest = max(newest.values())
    # the spacing of the reports as they came: the longest between one worker's two
    spacing = max((int(np.diff(t).max()) for t in sent.values() if len(t) > 1), default=None)
    if spacing is None:
        return min(newest.values())
    return min(t for t in newest.values() if t >= latest - spacing - REPORT_SLACK_NS)


def attribute(trace: Any, steady: np.ndarray) -> tuple[dict[int, float], dict[int, float], float]:
    """Per worker PID: (seconds of steady wait its batch ended, of those seconds the part
    whose wait began with another batch ready: finished by a worker, not yet taken by
    the loop, which only the order keeps it from taking), and the seconds of steady wait
    counted: those that ended by ``reported_until``. A wait the workers' reports have not
    reached yet has no batch to end it and would look like a transfer, given to no worker:
    in a 30 s window with workers reporting every 16 s, half of a slow worker's share."""
    until = reported_until(trace)
    t_done, pid = _completions(trace, trace.span())
    behind: dict[int, float] = {}
    held: dict[int, float] = {}
    if until is None:
        return behind, held, 0.0
    known = steady & (trace.t_end <= until)
    ends, waits = trace.t_end[known], trace.wait[known]
    starts = ends - waits
    last = np.searchsorted(t_done, ends, side="right") - 1   # the batch that ended each wait
    first = np.searchsorted(t_done, starts, side="right")    # batches finished before it began
    # batches taken by the loop before each wait began
    taken = np.searchsorted(trace.t_end, starts, side="right")
    # The batches the window's first takes got were finished before the window began:
    # missing from the completions, by a constant count M, the batches ready at its
    # start. The loop takes only finished batches, so after each take (completions so
    # far + M) >= (takes so far): M is at least the largest shortfall, and exactly that
    # where a take left none ready (the count errs low by the fewest ever left ready).
    takes = trace.t_end[trace.t_end <= until]
    shortfall = np.arange(1, len(takes) + 1) - np.searchsorted(t_done, takes, side="right")
    missing = max(0, int(shortfall.max())) if len(shortfall) else 0
    ready = first + missing - taken
    # a wait whose batch was finished before it began was a transfer, not a worker's
    for i in np.nonzero((waits > 0) & (last >= 0) & (last >= first))[0]:
        w = int(pid[last[i]])
        s = float(waits[i]) / 1e9
        behind[w] = behind.get(w, 0.0) + s
        if ready[i] > 0:
            held[w] = held.get(w, 0.0) + s
    return behind, held, float(waits.sum()) / 1e9


def replay(loads: list[np.ndarray], compute: np.ndarray, prefetch: int, in_order: bool,
           n: int = REPLAY_BATCHES, seed: int = SEED) -> float:
    """The loop's data-wait share with each worker's own load times (drawn with
    replacement), as torch's _MultiProcessingDataLoaderIter schedules them: indices go
    to the workers in turn (in_order=False: to the next one with fewer than prefetch
    outstanding), and the loop takes batches in order (or whichever is ready first)."""
    rng = np.random.default_rng(seed)
    w = len(loads)
    draws = [rng.choice(x, n).tolist() for x in loads]
    comp = rng.choice(compute, n).tolist() if len(compute) else [0.0] * n
    cap = max(1, prefetch)
    free = [0.0] * w
    count = [0] * w
    outstanding = [0] * w
    order: list[tuple[float, int]] = []   # in order: (ready time, worker) per batch
    ready: list[tuple[float, int, int]] = []  # out of order: heap of (ready, seq, worker)
    cursor = [0, 0]  # next worker in the cycle, batches issued

    def issue(now: float) -> None:
        for _ in range(w):
            k = cursor[0] % w
            cursor[0] += 1
            if in_order or outstanding[k] < cap:
                break
        else:
            return
        done = max(free[k], now) + draws[k][count[k] % n]
        free[k], count[k] = done, count[k] + 1
        outstanding[k] += 1
        cursor[1] += 1
        if in_order:
            order.append((done, k))
        else:
            heapq.heappush(ready, (done, cursor[1], k))

    for _ in range(w * cap):
        issue(0.0)
    loop = waits = steps = 0.0
    skip = min(n // 4, 2 * w * cap)  # the queue fills first
    for i in range(n):
        if in_order:
            done, k = order[i]
        else:
            done, _, k = heapq.heappop(ready)
        got = max(done, loop)
        outstanding[k] -= 1
        issue(got)  # torch puts the next index as it returns a batch
        if i >= skip:
            waits += got - loop
            steps += got - loop + comp[i]
        loop = got + comp[i]
    return waits / steps if steps > 0 else 0.0


def analyse(trace: Any, steady: np.ndarray) -> WorkerSpread | None:
    """The rank's workers: the slowest, the spread, where the wait went and what
    in_order=False would remove; None without per-worker reports from 2+ workers."""
    loads = per_worker(trace)
    workers = (trace.loader or UNREPORTED).num_workers or 0
    if not loads or workers < 2:
        return None
    loads = {p: x for p, x in loads.items() if len(x) >= MIN_PER_WORKER}
    if len(loads) < 2:
        return None
    medians = {p: float(np.median(x)) for p, x in loads.items()}
    slowest = max(medians, key=lambda p: (medians[p], -p))
    rest = np.concatenate([x for p, x in loads.items() if p != slowest])
    others = float(np.median(rest))
    spread = medians[slowest] / others if others > 0 else float("inf")
    consistent = float(np.quantile(loads[slowest], 0.25)) > float(np.quantile(rest, 0.75))
    behind, held, total = attribute(trace, steady)
    compute = np.maximum(trace.interval[steady] - trace.wait[steady], 0) / 1e9
    prefetch = (trace.loader or UNREPORTED).prefetch_factor or 2
    wait_share = round(float(behind.get(slowest, 0.0) / total), 4) if total > 0 else 0.0
    replayed: dict[str, float | None] = dict.fromkeys(
        ("replayed_wait_ratio", "in_order_false_wait_ratio", "in_order_false_removes",
         "removes_measured_share"))
    # No worker standing out, the cause scores 0 whatever the queue's replays say: they
    # are not run (600 batches each, twice, at every refresh of a stalled rank: most of
    # the agent's analysis time at 8 ranks x 8 workers, ~0.3 % of a core)
    if spread > SPREAD_LOW:
        # the workers as the loader has them: each one seen, the slowest among them
        pools = [loads[p] for p in sorted(loads)]
        wait_in = replay(pools, compute, prefetch, True)
        wait_out = replay(pools, compute, prefetch, False)
        removes = float(np.clip(1.0 - wait_out / wait_in, 0.0, 1.0)) if wait_in > 0 else 0.0
        replayed = dict(
            replayed_wait_ratio=round(wait_in, 4), in_order_false_wait_ratio=round(wait_out, 4),
            in_order_false_removes=round(removes, 4),
            # of the wait measured, what in_order=False takes away: the waits behind the
            # slowest worker, as far as the replay says they go
            removes_measured_share=round(float(behind.get(slowest, 0.0) / total) * removes, 4)
            if total > 0 else 0.0)
    return WorkerSpread(
        pid=slowest, workers_seen=len(loads), num_workers=workers,
        load_seconds=round(medians[slowest], 6), others_load_seconds=round(others, 6),
        spread=round(float(spread), 3), consistent=bool(consistent), wait_share=wait_share,
        held_share=round(float(held.get(slowest, 0.0) / behind[slowest]), 4)
        if behind.get(slowest) else 0.0,
        workers={p: (round(medians[p], 6), len(loads[p]), round(float(behind.get(p, 0.0)), 3))
                 for p in sorted(loads)},
        **replayed)


def score(trace: Any, steady: np.ndarray) -> Cause | None:
    """The slow_worker Cause (with the WorkerSpread), or None when nothing bears on it."""
    a = analyse(trace, steady)
    if a is None:
        return None
    if a.spread == float("inf"):
        stands_out = 1.0
    else:
        stands_out = float(np.clip((a.spread - SPREAD_LOW) / (SPREAD_HIGH - SPREAD_LOW), 0.0, 1.0))
    value = a.wait_share * (a.in_order_false_removes or 0.0) * stands_out * (
        1.0 if a.consistent else CONSISTENCY_MISS)
    text = ("Worker %d (of %d seen) takes %.3gs a batch against %.3gs for the others (median, "
            "%.1fx); %.0f%% of the loop's wait was for its batches, and other batches "
            "were ready during %.0f%% of that wait: in-order delivery holds them behind it." % (
                a.pid, a.workers_seen, a.load_seconds, a.others_load_seconds, a.spread,
                100 * a.wait_share, 100 * a.held_share))
    if not a.consistent:
        text += (" But its fast batches are as fast as the others': costly batches fell to it, "
                 "not a slow worker.")
    if a.in_order_false_removes and a.removes_measured_share is not None \
            and a.replayed_wait_ratio is not None and a.in_order_false_wait_ratio is not None:
        text += (" in_order=False would remove ~%.0f%% of the measured wait: %.0f%% of the waits "
                 "for its batches (the DataLoader's queue replayed with each worker's load times: "
                 "%.1f%% -> %.1f%% of the step waiting for a batch)." % (
                     100 * a.removes_measured_share, 100 * a.in_order_false_removes,
                     100 * a.replayed_wait_ratio, 100 * a.in_order_false_wait_ratio))
    ev = [Evidence("worker_batch_load_spread", a.spread, SPREAD_LOW, "above", None, "rank",
                   worker_pid=a.pid),
          Evidence("slowest_worker_wait_share", a.wait_share, None, "above", None, "rank",
                   a.wait_share)]
    return make(NAME, value, text, ev, worker=a)
