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
from stallscope.lab import scenarios
from tests.helpers.lab import lab_session


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
    assert body.get("verdict") == "input_bound", body
    top = body["causes"][0]
    assert top["cause"] == "slow_worker", json.dumps(body["causes"], indent=1)
    w = top["worker"]
    # the worker the plan slowed: the loader's worker 2, as the rank reported its workers
    (rank,) = [r for r in ranks["ranks"] if r["job"] == job.job]
    assert w["pid"] == rank["worker_pids"][plan["slow_worker_id"]], (w, rank["worker_pids"])
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
