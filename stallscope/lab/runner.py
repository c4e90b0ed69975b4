"""``stallscope lab run``: one scenario end to end in a session of its own (lab/session.py):
the agent (+ Prometheus), the scenario's job with its fault, a measured window with a
progress display, then what stallscope found (lab/findings.py); everything undone after.
"""
import dataclasses
import time

from .. import vocabulary
from ..processes import teardown
from . import findings, nodes, report, scenarios, traces
from .job import Unavailable
from .session import Session

__all__ = ["ALERTS_FROM_S", "Options", "Unavailable", "run"]

# Alerts count from when the rules' rate window (10 s) no longer reaches back into the
# ranks' start-up (the first batch waits for the workers to start).
ALERTS_FROM_S = 11.0
# A drawn run whose slowed rank has too few batches for a verdict in its last
# ``duration`` seconds (the window the agent's correlator and diagnose judge) goes on, at
# most this long, until it has them (the correlator's MIN_BATCHES, and a few more) or
# stops making batches (a hang is judged while it lasts): a drawn CPU-contention run of
# 23 s made 14 batches of 1.6 s, and the agent said "unknown" (issue 49). A pace that slow
# never fills a window of that length: the findings then judge a wider one
# (verdict_seconds).
EXTEND_MAX_S = 30.0
EXTEND_BATCHES = vocabulary.MIN_BATCHES + 3
STALLED_S = 5.0


@dataclasses.dataclass
class Options:
    ranks: int = None               # None: the scenario's (2 unless it says)
    duration: float = None          # None: the scenario's default
    keep: bool = False              # keep everything up after the report until Ctrl-C
    record: str = None              # directory for labelled traces
    prometheus: bool = None         # None: when installed
    workdir: str = None             # None: a temporary directory, removed afterwards
    say: object = None              # progress/messages sink (str -> None)
    live: bool = None               # redraw the progress line in place (None: stderr is a TTY)
    warmup_batches: int = 1         # the window starts once every rank has had this many
    nodes: tuple = ()               # the lab node of each rank (lab/nodes.py); () the scenario's


def run(scenario, opts):
    """Run ``scenario``; returns the result dict (see findings.result). Raises Unavailable
    when the machine lacks what the scenario needs, teardown.Interrupted on a signal."""
    if scenario.real is None:
        raise Unavailable("%s has no real run, only a synthetic trace (syn-%s.json)" % (
            scenario.name, scenario.name))
    reason = scenario.make_fault().missing()
    if reason:
        raise Unavailable("%s %s" % (scenario.name, reason))
    duration = float(opts.duration or scenario.real.duration)
    ranks = opts.ranks or scenario.real.ranks
    placed = tuple(opts.nodes) or scenario.real.nodes
    if placed and not nodes.isolated():
        raise Unavailable("%s runs on lab nodes, which need root, iproute2, nsenter and unshare"
                          % scenario.name)
    if placed and ranks != len(placed):
        raise Unavailable("%s places its %d ranks on lab nodes: --ranks cannot change that"
                          % (scenario.name, len(placed)))
    with teardown.Teardown() as td:
        session = Session(td, workdir=opts.workdir, say=opts.say)
        session.say("lab: %s (%d ranks, %.0fs): %s" % (scenario.name, ranks, duration, scenario.title))
        agent_args = findings.agent_args(duration) + scenario.make_fault().agent_args()
        placement = None
        if placed:
            made = {name: session.add_node(name, agent_args=agent_args) for name in dict.fromkeys(placed)}
            placement = [made[name] for name in placed]
        else:
            session.start_agent(duration, scenario.make_fault().agent_args())
        if opts.prometheus is not False and findings.prometheus_installed():
            session.start_prometheus()
        job = session.start_job(scenario, ranks=ranks, duration=duration, placement=placement)
        beside = None
        if scenario.real.beside:  # a second job on the same nodes (issue 35)
            beside = session.start_job(scenarios.get(scenario.real.beside), ranks=ranks,
                                       name=job.job + "-beside", pod_prefix="beside-",
                                       duration=duration, placement=placement)
            beside.wait_ready(opts.warmup_batches)
        base = job.wait_ready(opts.warmup_batches)
        job.kept = opts.keep  # the report's commands: for what stays up (findings.via_diagnose)
        first = findings.first_batch_warnings(job)
        base = job.wait_ready(opts.warmup_batches)  # the window starts after that look
        now, fired, history = _window(job, base, opts.live)
        result = findings.collect(job, base, now, fired, history, first_warnings=first, beside=beside)
        if opts.record:
            result["recorded"] = traces.record(job, result, opts.record)
        if opts.keep:
            report.keeping(job, result)
            while True:
                job.check_alive()
                time.sleep(1.0)
    return result


def _batches(now, base, target):
    """The target rank's batch count in ``now`` less ``base``'s, or None when not known."""
    r, b = now.get(target), base.get(target)
    try:
        return int(r["batches"]) - (int(b["batches"]) if b else 0)
    except (TypeError, KeyError, ValueError):
        return None


def _trailing(history, target, seconds):
    """The target's batches over the last ``seconds`` of ``history`` ([(elapsed, ranks)])."""
    end_t, end = history[-1]
    start = next((r for t, r in history if t >= end_t - seconds), history[0][1])
    return _batches(end, start, target)


def verdict_seconds(history, target, seconds, need=EXTEND_BATCHES):
    """The trailing window to judge the target on: ``seconds``, or, where the target made
    fewer than ``need`` batches in it, back to where it had made ``need`` fewer (the whole
    run at most). A window of fixed length holds no more batches of a steady pace however
    long the run goes on: a drawn CPU-contention run of 1.6 s batches held 19 in its 27 s,
    the victims' agent said "unknown" after the 30 s extension (seed 426, issue 49)."""
    if (_trailing(history, target, seconds) or 0) >= need:
        return seconds
    end_t, end = history[-1]
    made = _batches(end, history[0][1], target)
    if made is None:
        return seconds
    for t, ranks in reversed(history):
        had = _batches(ranks, history[0][1], target)
        if had is not None and made - had >= need:
            return max(seconds, end_t - t + 1.0)
    return max(seconds, end_t + 1.0)


def _window(job, base, live, until_verdict=False):
    """The measured window: the fault acts, the progress line shows the per-rank
    data-wait, Prometheus's firing alerts are collected, the ranks' counters are kept
    every second (the headline alert's SLI, findings.sli_alert). Returns (ranks now,
    fired, [(seconds, ranks)]). ``until_verdict``: past the duration, until the target has
    the batches a verdict needs in the last ``until_verdict`` seconds (True: the duration;
    EXTEND_MAX_S at most; drawn runs, lab/draws.py)."""
    t0 = time.monotonic()
    show = report.Progress(job.say, job.duration, job.target, live=live)
    fired = set()
    history = [(0.0, base)]
    moved = (0.0, None)  # (when the target's batch count last moved, that count)
    drawn = job.duration
    # the trailing window the verdict is judged on: ``until_verdict`` seconds, or the duration
    judged = drawn if until_verdict is True else float(until_verdict or 0.0)
    while True:
        elapsed = time.monotonic() - t0
        job.fault.tick(job, elapsed)
        job.check_alive()
        now = job.ranks()
        history.append((elapsed, now))
        show.update(elapsed, base, now)
        if job.prom is not None and elapsed >= ALERTS_FROM_S:
            fired |= findings.firing(job.prom)
        made = _batches(now, base, job.target)
        if made != moved[1]:
            moved = (elapsed, made)
        if elapsed >= drawn and (
                not until_verdict or made is None or elapsed >= drawn + EXTEND_MAX_S
                or elapsed - moved[0] >= STALLED_S
                or (_trailing(history, job.target, judged) or 0) >= EXTEND_BATCHES):
            break
        time.sleep(1.0 if elapsed >= drawn else min(1.0, drawn - elapsed))
    show.done()
    return now, fired, history
