"""slow_worker (issue 18, item 2): one slow loader worker among four, for real (the lab's
trainer with a real DataLoader whose worker 2 waits 100 ms more per sample, a real agent),
and the replay of the DataLoader's queue that prices in_order=False."""
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from stallscope.correlate import slow_worker
from stallscope.correlate.trace import RankTrace
from stallscope.lab import scenarios, synth
from tests.helpers.lab import lab_session

SEC = synth.SEC


def get(agent, path):
    try:
        with urllib.request.urlopen(agent.url + path, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_replay_in_order_waits_behind_the_slow_worker_and_out_of_order_does_not():
    compute = np.full(50, 0.15)
    fast, slow = np.full(20, 0.016), np.full(20, 0.816)
    # in order: a round of 4 batches every 0.816 s against 4 x 0.15 s of compute
    in_order = slow_worker.replay([fast, fast, slow, fast], compute, 2, True)
    assert in_order == pytest.approx(1 - 0.6 / 0.816, abs=0.03)
    # out of order the three fast workers alone deliver a batch every ~5 ms
    assert slow_worker.replay([fast, fast, slow, fast], compute, 2, False) < 0.01
    # equal workers: the order changes nothing
    even = [np.full(20, 0.8)] * 4
    assert slow_worker.replay(even, compute, 2, False) == pytest.approx(
        slow_worker.replay(even, compute, 2, True), abs=0.02)


def _slow_worker_trace(reported=None, skip=0, every=16.0, batches=150):
    """30 s of a loop behind worker 2 of 4 (0.8 s a batch against 0.02 s, 0.15 s of
    compute); each worker reports every ``every`` s on its own beat, the times it sent
    its reports in the trace (worker_report_pid) as the agent keeps them; ``reported``:
    per worker, the seconds from its newest report to the window's end (its batches
    since then not yet in the trace; more than ``every``: it stopped reporting);
    ``skip``: the window begins that many batches into the run, with batches finished
    before it, ready, that the window's completions do not hold."""
    done = []
    events, _ = synth.simulate(batches + skip, 4, lambda k, t: 0.8 if k % 4 == 2 else 0.02,
                               lambda k, t: 0.15, completions=done)
    events = events[skip:]
    start, end = events[0][0] - events[0][2], events[-1][0]
    lag = reported or {}
    newest = {w: end - int(lag.get(w, 0.0) * SEC) for w in range(4)}
    kept = [(t, w, took) for t, w, took in done if t <= newest[w]]
    sent = sorted((t, 100 + w) for w in range(4)
                  for t in range(newest[w], start, -int(every * SEC)))
    signals = {"batch_load_seconds": [[t, took] for t, _, took in kept],
               "batch_worker_pid": [[t, 100 + w] for t, w, _ in kept],
               "worker_report_pid": [[t, p] for t, p in sent]}
    return RankTrace.from_timeline(synth.body(events, workers=4, signals=signals))


def test_the_slow_workers_share_of_the_wait_counts_only_waits_every_worker_has_reported():
    whole = _slow_worker_trace()
    steady = whole.interval != whole.wait
    told = slow_worker.analyse(whole, steady)
    # every steady wait is for worker 2's batch: the others' are ready long before
    assert told.pid == 102 and told.wait_share > 0.95
    # the slow worker's newest 14 s not yet reported, the others' 1-9 s: before, the waits
    # of those seconds had no batch to end them and went to no worker (~half the share)
    late = _slow_worker_trace({0: 3.0, 1: 9.0, 2: 14.0, 3: 1.0})
    found = slow_worker.analyse(late, late.interval != late.wait)
    assert found.pid == 102
    assert found.wait_share == pytest.approx(told.wait_share, abs=0.05)
    assert slow_worker.score(late, late.interval != late.wait).score > 0.9
    # until the slow worker's newest report, 14 s before the end
    end = late.t_end[-1]
    assert end - 14 * SEC - SEC < slow_worker.reported_until(late) <= end - 14 * SEC
    # a worker whose reports stopped longer ago than their spacing (16 s) holds back no one
    silent = _slow_worker_trace({0: 21.0, 2: 1.0})
    assert slow_worker.reported_until(silent) == silent.t_end[-1] - 1 * SEC


def test_the_report_cadence_is_read_from_the_trace_not_assumed():
    """Issue 50: the analysis reasons from the times the reports were sent, whatever the
    hook's cadence: a worker 9 s behind has stopped where the workers report every 4 s,
    and is only late where they report every 30 s (its batches still to come)."""
    fast = _slow_worker_trace({0: 9.0, 1: 3.0, 2: 2.0}, every=4.0)
    assert slow_worker.reported_until(fast) == fast.t_end[-1] - 3 * SEC
    slow = _slow_worker_trace({0: 9.0, 1: 3.0, 2: 2.0}, every=30.0, batches=400)
    assert slow_worker.reported_until(slow) == slow.t_end[-1] - 9 * SEC
    # and at 30 s a worker 40 s behind has stopped
    gone = _slow_worker_trace({0: 40.0, 1: 3.0, 2: 25.0}, every=30.0, batches=400)
    assert slow_worker.reported_until(gone) == gone.t_end[-1] - 25 * SEC
    # the slow worker named with its share of the wait, whatever the cadence: the waits
    # its reports have not reached yet (25 s of 80) are not counted against anyone
    whole = _slow_worker_trace(batches=400)
    told = slow_worker.analyse(whole, whole.interval != whole.wait)
    found = slow_worker.analyse(gone, gone.interval != gone.wait)
    assert found.pid == told.pid == 102
    assert found.wait_share == pytest.approx(told.wait_share, abs=0.05)
    # without the report times (a recording from before they were kept), no worker is
    # judged stopped: until the oldest of the workers' newest batches
    bare = _slow_worker_trace({0: 40.0, 1: 3.0}, every=30.0, batches=400)
    del bare.signals["worker_report_pid"]
    assert slow_worker.reported_until(bare) <= bare.t_end[-1] - 40 * SEC


def test_batches_held_behind_the_slow_one_are_counted_when_the_window_begins_mid_run():
    # at each wait for worker 2's batch the 3 fast workers' next 6 are ready (prefetch 2);
    # the window begins mid-run, its first takes finished before it: the count of those
    # comes from the takes that left fewest ready (3, before worker 2's next batch)
    for skip in (0, 41, 102):
        tr = _slow_worker_trace({0: 3.0, 1: 9.0, 2: 14.0, 3: 1.0}, skip=skip)
        found = slow_worker.analyse(tr, tr.interval != tr.wait)
        assert found.wait_share > 0.95 and found.held_share > 0.95, (skip, found)
    # equal workers too slow for the compute: a take often leaves none ready, nothing is held
    done = []
    events, _ = synth.simulate(250, 4, lambda k, t: 0.8, lambda k, t: 0.15, completions=done)
    signals = {"batch_load_seconds": [[t, took] for t, _, took in done],
               "batch_worker_pid": [[t, 100 + w] for t, w, _ in done]}
    even = RankTrace.from_timeline(synth.body(events[60:], workers=4, signals=signals))
    _, held, total = slow_worker.attribute(even, even.interval != even.wait)
    assert total > 0 and sum(held.values()) < 0.05 * total, (held, total)


@pytest.mark.slow
def test_one_slow_worker_among_four_is_named_with_its_pid(tmp_path):
    pytest.importorskip("torch")
    s = scenarios.get("slow-worker")
    plan = s.real.target
    with lab_session(tmp_path / "lab") as session:
        agent = session.start_agent(30, ["--correlate.interval", "1", "--correlate.window", "30"])
        job = session.start_job(s, ranks=1)
        job.wait_ready()
        deadline = time.monotonic() + 90
        body = {}
        while time.monotonic() < deadline:
            session.check_alive()
            status, body = get(agent, "/api/v1/diagnosis?rank=0&job=%s" % job.job)
            if status == 200 and body["batches"] >= 60 and body["verdict"] != "unknown":
                break
            time.sleep(1)
        status, ranks = get(agent, "/api/v1/ranks")
        _, timeline = get(agent, "/api/v1/timeline?rank=0&job=%s&seconds=30" % job.job)
    assert body.get("verdict") == "input_bound", body
    top = body["causes"][0]
    assert top["cause"] == "slow_worker", json.dumps(body["causes"], indent=1)
    w = top["worker"]
    # the worker the plan slowed: the loader's worker 2, as the rank reported its workers
    (rank,) = [r for r in ranks["ranks"] if r["job"] == job.job]
    assert w["pid"] == rank["worker_pids"][plan["slow_worker_id"]], (w, rank["worker_pids"])
    # the times each worker's reports were sent, as the analysis reads them: every worker's,
    # each batch in a report sent after it
    sent = timeline["signals"]["worker_report_pid"]
    assert {int(p) for _, p in sent} == set(rank["worker_pids"]), (sent, rank["worker_pids"])
    for pid in rank["worker_pids"]:
        done = [t for (t, p) in timeline["signals"]["batch_worker_pid"] if int(p) == pid]
        assert max(done) <= max(t for t, p in sent if int(p) == pid)
    # 8 samples x (100 + 2) ms for the slow one, 8 x 2 ms for the others; a loaded
    # machine only stretches sleeps
    assert 0.8 * 0.816 < w["load_seconds"] < 1.6, w
    assert w["others_load_seconds"] < 0.25, w
    assert w["workers_seen"] == 4 and w["consistent"], w
    # most of the wait is for its batches, with other batches ready meanwhile
    assert w["wait_share"] > 0.5 and w["held_share"] > 0.5, w
    assert w["in_order_false_removes"] > 0.8, w
    assert str(w["pid"]) in top["summary"] and "in_order=False" in top["summary"]
    pred = top["prediction"]
    assert pred["settings"] == {"in_order": False}
    assert pred["predicted_data_wait_ratio"] < body["data_wait_ratio"] / 2, (pred, body["data_wait_ratio"])
