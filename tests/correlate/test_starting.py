"""A rank over the line only by its process's first batch is starting, not input-bound
(correlate/rules.py; issue 15: a healthy job's verdicts flipped in its first seconds)."""
import random

import numpy as np
import pytest

from stallscope.correlate import diagnosis, rules
from stallscope.correlate.trace import RankTrace
from stallscope.lab import synth
from stallscope.vocabulary import DATA_WAIT_LINE
from tests.helpers.correlate import simulated, trace_of, wire

FLOOR_S = 0.001   # each batch's transfer: a 1 % floor at 0.1 s steps, as on the lab's node


def healthy_start(seed, first_extra_s, n=800):
    """Events of a healthy rank whose first batch waited ``first_extra_s`` more for its
    workers' first start."""
    events, _ = simulated(seed, 4, load=0.15, compute=0.1, n=n,
                          extra=lambda k, t: first_extra_s if k == 0 else 0.0,
                          transfer=lambda k, t: FLOOR_S)
    return events


def grown(events, m, rank, started):
    """The agent's view after ``m`` batches: its window holds the run from its start."""
    t = trace_of(events[:m], rank=rank, job="j")
    if started:
        t.first_batch_ns = int(events[0][0])
    return t


def verdicts_as_the_job_grows(started):
    ranks = {0: healthy_start(1, 0.6), 1: healthy_start(2, 0.2)}
    out = {0: [], 1: []}
    for m in range(20, 801, 20):
        traces = {r: grown(ev, m, r, started) for r, ev in ranks.items()}
        for r, t in traces.items():
            out[r].append(wire(diagnosis.analyse(t, list(traces.values())))["verdict"])
    return out


def changes(seq):
    return sum(a != b for a, b in zip(seq, seq[1:]))


def test_a_healthy_jobs_start_reads_starting_then_healthy_without_a_flip():
    seen = verdicts_as_the_job_grows(started=True)
    for rank, seq in seen.items():
        assert set(seq) <= {"unknown", "healthy"}, (rank, seq)
        assert seq[0] == "unknown" and seq[-1] == "healthy" and changes(seq) == 1, (rank, seq)
    # rank 0's start (0.6 s) outweighs rank 1's: it is starting for longer
    assert seen[0].index("healthy") > seen[1].index("healthy")


def test_the_same_start_without_the_first_batch_known_flips_the_verdicts():
    # what the agent said before: input_bound over the start, victims beside it, then healthy
    seen = verdicts_as_the_job_grows(started=False)
    assert seen[0][0] == "input_bound" and seen[0][-1] == "healthy"
    assert "not_input_bound" in seen[1] and seen[1][-1] == "healthy"


def test_a_starting_rank_reports_its_share_after_the_start_and_names_no_cause():
    ev = healthy_start(3, 0.6)
    t = grown(ev, 150, 0, True)
    d = wire(diagnosis.analyse(t))
    after = float(t.wait[1:].sum()) / float(t.interval[1:].sum())
    assert d["verdict"] == "unknown" and "starting" in d["reason"] and "first batch" in d["reason"]
    assert d["data_wait_ratio"] >= DATA_WAIT_LINE > after
    assert d["data_wait_ratio_after_start"] == pytest.approx(after, abs=1e-6)
    # the hook's 1 ms transfer on ~100 ms steps, within the simulation's jitter
    assert after == pytest.approx(FLOOR_S / 0.1, rel=0.3)
    assert d["causes"] == [] and d["straggler"]["rank"] is None


def test_a_detected_stall_is_judged_on_its_segment_whatever_start_it_holds():
    t = grown(healthy_start(3, 0.6), 150, 0, True)
    d = wire(diagnosis.analyse(t, since_ns=int(t.t_end[0]) - 1))
    assert d["verdict"] == "input_bound" and "data_wait_ratio_after_start" not in d


def test_a_stall_from_the_start_is_input_bound_however_slow_its_start():
    # steady waits over the line on their own: the start does not hold the verdict back
    events, _ = simulated(4, 2, load=0.3, compute=0.1, n=150, extra=lambda k, t: 1.0 if k == 0 else 0.0)
    t = grown(events, 150, 0, True)
    d = wire(diagnosis.analyse(t))
    assert d["verdict"] == "input_bound"
    assert d["data_wait_ratio_after_start"] >= DATA_WAIT_LINE


def test_an_epoch_start_is_no_run_start():
    # the same slow first batch, but the agent saw the process's first batch earlier
    # (it left the window): an epoch's restart, counted as the alert counts it
    ev = healthy_start(3, 0.6)
    t = grown(ev, 150, 0, False)
    t.first_batch_ns = int(ev[0][0]) - 60 * synth.SEC
    assert t.run_start() is None
    assert wire(diagnosis.analyse(t))["verdict"] == "input_bound"


def test_run_start_finds_the_first_batch_inside_the_trace_and_only_an_iterator_start():
    ev = healthy_start(5, 0.6, n=100)
    t = trace_of(ev)
    t.first_batch_ns = int(ev[40][0])
    assert t.run_start() is None  # a steady batch (interval != wait): no workers started there
    t.interval[40] = t.wait[40]
    assert t.run_start() == 40
    assert t.since(int(ev[50][0])).run_start() is None
    # a stored trace's number outside int64 matches no batch (and raises nothing)
    for far in (2**70, -2**70):
        t.first_batch_ns = far
        assert t.run_start() is None


@pytest.mark.parametrize("value, kept", [(123, 123), (None, None), (True, None), ("123", None), (1.5, None)])
def test_the_timeline_body_carries_the_first_batch_as_an_integer_only(value, kept):
    body = synth.body(healthy_start(5, 0.1, n=30))
    body["first_batch_ns"] = value
    assert RankTrace.from_timeline(body).first_batch_ns == kept


def test_the_rules_never_judge_a_rank_by_its_start():
    rng = random.Random(15)
    checked = 0
    for _ in range(20000):
        job = []
        for i in range(rng.choice((1, 2, 4, 8))):
            ratio = rng.choice((rng.uniform(0, 0.05), rng.uniform(0.015, 0.03), rng.uniform(0, 0.5)))
            after = rng.choice((None, ratio * rng.uniform(0.2, 1.0)))
            job.append(rules.RankWait(i, "p%d" % i, "n", ratio, after))
        judged = [r for r in job if not r.starting]
        for me in job:
            j = rules.judge(me, job)
            if me.starting:
                checked += 1
                assert j.verdict in ("unknown", "not_input_bound"), (me, job)
                assert j.straggler is None or j.straggler.rank != me.rank
            # the headline's expression over the ranks judged: never healthy then
            if judged and max(r.ratio for r in judged) > DATA_WAIT_LINE:
                assert j.verdict != "healthy", (me, job)
            if j.verdict == "healthy":
                assert not rules.over(me.ratio)
    assert checked > 3000


def test_the_agent_and_diagnose_agree_on_a_starting_rank():
    from stallscope.correlate import codec
    from stallscope.diagnose import verdict as cli_verdict
    from stallscope.diagnose.document import JobRank
    from tests.helpers.diagnose import info, progress, subject
    t = grown(healthy_start(3, 0.6), 150, 0, True)
    d = codec.decode(wire(diagnosis.analyse(t)))  # what diagnose reads from the agent
    after = d.loop.data_wait_ratio_after_start
    r = JobRank(0, d.who.pod, d.who.node, d.data_wait_ratio, after)
    me = subject(r, job_scope="node", data_wait_ratio_after_start=after,
                 progress=progress(150, 0.1, 0.1), rank_info=info(last_seen_seconds_ago=0.5))
    v, reason = cli_verdict.decide(me, None, d)
    assert (v, reason) == (d.verdict, d.reason)
    assert cli_verdict.starting(r)
    assert np.isclose(after, wire(diagnosis.analyse(t))["data_wait_ratio_after_start"])


def test_a_stall_just_dated_waits_for_its_batches_and_only_a_hang_is_judged_on_the_window():
    """A stall the detector dated a few batches ago is judged on its own batches once it
    has them ("unknown" before: judged on the whole window with its healthy stretch, a
    10 % stall read "come and go" and led with unexplained, tests/correlate/test_e2e.py);
    a rank blocked in next() far longer than its steps (a hang) is judged on the window
    that ends in its open wait at once (issue 30)."""
    from tests.helpers.correlate import events_from_waits

    SEC = synth.SEC
    events = events_from_waits([0.001] * 100 + [0.03] * 5, compute_s=0.15)
    since = int(events[-5][0] - events[-5][1])
    body = synth.body(events, workers=2)
    d = diagnosis.analyse(RankTrace.from_timeline(body), since_ns=since)
    assert d.verdict == "unknown" and "Only 5 batches" in d.reason, (d.verdict, d.reason)
    # the same rank now blocked in next() for 3 s (20 of its steps)
    last = events[-1][0]
    hung = dict(body, open_wait={"t_end_ns": last + 3 * SEC, "wait_ns": 3 * SEC, "interval_ns": 3 * SEC})
    trace = RankTrace.from_timeline(hung)
    assert diagnosis.hung(trace)
    d = diagnosis.analyse(trace, since_ns=since)
    assert d.verdict == "input_bound" and d.batches == trace.n, (d.verdict, d.reason)
    # blocked for as long as a step or two: not a hang
    brief = dict(body, open_wait={"t_end_ns": last + SEC // 5, "wait_ns": SEC // 5, "interval_ns": SEC // 5})
    assert not diagnosis.hung(RankTrace.from_timeline(brief))
