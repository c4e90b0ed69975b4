"""End to end: real DataLoaders (the lab's trainer) report to a real agent, whose
correlator diagnoses them: a starved loader (the table's too-few-workers scenario on one
rank) and a compute-bound one (its compute-bound scenario)."""
import json
import time
import urllib.error
import urllib.request

import pytest

from stallscope.correlate import epochs
from stallscope.lab import scenarios
from tests.helpers.lab import lab_session


def get(agent, path):
    try:
        with urllib.request.urlopen(agent.url + path, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def expected_wait_ratio(scenario):
    """What the plan implies: W workers each load a batch in batch_size x per-sample time,
    so a batch arrives every that / W, against compute_s of compute per step."""
    from stallscope.lab.job import BASE

    plan = dict(BASE, **scenario.real.everyone, **scenario.real.target)
    per_batch = plan["batch_size"] * plan["sample_sleep_s"] / plan["workers"]
    return 1 - plan["compute_s"] / per_batch, plan


@pytest.mark.slow
def test_agent_diagnoses_a_starved_loader_and_a_healthy_one(tmp_path):
    pytest.importorskip("torch")
    starved, fine = scenarios.get("too-few-workers"), scenarios.get("compute-bound")
    want, plan = expected_wait_ratio(starved)
    with lab_session(tmp_path / "lab") as session:
        agent = session.start_agent(30, ["--correlate.interval", "1", "--correlate.window", "30"])
        # each its own pods: as root each lab pod has a cgroup of its own, and a pod name
        # belongs to the first domain that reports it (the other job's would be refused)
        slow_job = session.start_job(starved, ranks=1, name="slow", pod_prefix="slow-")
        fine_job = session.start_job(fine, ranks=1, name="fine", pod_prefix="fine-")
        slow_job.wait_ready()
        fine_job.wait_ready()
        # the stalls start with the first worker round: wait for enough batches
        deadline = time.monotonic() + 60
        body = {}
        while time.monotonic() < deadline:
            session.check_alive()
            status, body = get(agent, "/api/v1/diagnosis?rank=0&job=slow")
            if status == 200 and body["batches"] >= 30 and body["verdict"] != "unknown":
                break
            time.sleep(1)
        assert body.get("verdict") == "input_bound", body
        # 8 x 60 ms per batch per worker, 2 workers: a batch every 240 ms against 150 ms of
        # compute, so ~37% of each step waits; a loaded machine only makes loading slower
        assert 0.7 * want < body["data_wait_ratio"] < 0.95, (want, body["data_wait_ratio"])
        assert body["causes"][0]["cause"] == starved.cause, json.dumps(body)
        assert body["stall_period_steps"] == plan["workers"]
        assert body["loader"]["num_workers"] == plan["workers"]
        status, fine_body = get(agent, "/api/v1/diagnosis?rank=0&job=fine")
        assert status == 200 and fine_body["verdict"] in ("healthy", "unknown"), json.dumps(fine_body)
        assert fine_body["causes"] == []
        metrics = agent.metrics()
        assert 'stallscope_stall_cause_score{cause="too_few_workers",job="slow"' in metrics
        assert any(line.startswith("stallscope_stall_period_steps{") and 'job="slow"' in line
                   and line.endswith(" %.1f" % plan["workers"]) for line in metrics.splitlines())
        assert get(agent, "/api/v1/diagnosis?pod=nope")[0] == 404
        status, err = get(agent, "/api/v1/diagnosis?rank=x")
        assert status == 400 and "bad value" in err["error"]


def _stepped(path):
    """One rank whose per-sample sleep is read from ``path`` (lab/trainer.py)."""
    return scenarios.Scenario("stepped", "Per-sample cost set from a file mid-run.", cause=None,
                              real=scenarios.RealRun(target={"sample_sleep_file": str(path)}))


def per_sample_for(share, plan):
    """The per-sample sleep that makes the loop wait ``share`` of its steps: W workers
    deliver a batch every batch_size x sleep / W, against compute_s a step."""
    return plan["workers"] * plan["compute_s"] / (1 - share) / plan["batch_size"]


@pytest.mark.slow
def test_a_stall_starting_mid_run_is_named_within_seconds(tmp_path):
    """A 10 % stall (the smallest the detector is held to) after a healthy stretch: found
    within seconds by the change-point test, with the loader named (its batch load time
    rose with the stall), and cleared when it ends. The benchmark (bench_agent.py) gives
    the figures for 10 %, 20 % and 50 %."""
    pytest.importorskip("torch")
    from stallscope.lab.job import BASE

    control = tmp_path / "sample_sleep"
    control.write_text(str(BASE["sample_sleep_s"]))
    with lab_session(tmp_path / "lab") as session:
        agent = session.start_agent(120)
        job = session.start_job(_stepped(control), ranks=1, name="stepped")
        job.wait_ready()
        time.sleep(20)  # a healthy stretch
        for share in (0.1,):
            assert get(agent, "/api/v1/diagnosis?rank=0&job=stepped")[1]["detection"]["stalled"] is False
            control.write_text(str(per_sample_for(share, BASE)))
            changed = time.monotonic()
            body = {}
            while time.monotonic() - changed < 40:
                session.check_alive()
                body = get(agent, "/api/v1/diagnosis?rank=0&job=stepped")[1]
                if body.get("detection", {}).get("stalled") is True and body["verdict"] == "input_bound":
                    break
                time.sleep(0.25)
            latency = time.monotonic() - changed
            assert body["detection"]["stalled"] is True, (share, body.get("detection"))  # JSON true
            # 10 s is the goal; a loaded 2-core machine gets the slack.
            assert latency < 15, (share, latency)
            assert body["causes"][0]["cause"] == "too_few_workers", (share, body["causes"][:2])
            control.write_text(str(BASE["sample_sleep_s"]))
            deadline = time.monotonic() + 40
            while get(agent, "/api/v1/diagnosis?rank=0&job=stepped")[1]["detection"]["stalled"] is not False:
                assert time.monotonic() < deadline, "the stall did not clear"
                time.sleep(0.5)


@pytest.mark.slow
def test_a_wait_that_is_transfer_is_named_transfer_cost_and_slow_workers_stay_too_few(tmp_path):
    """Real DataLoaders, a real agent, the hook's split of each wait (hook/transfer.py):
    the transfer-cost scenario's rank gets 256 tensors a sample from workers that do no
    work, so its wait is taking over their shared-memory tensors, not waiting for them;
    the too-few-workers scenario's rank waits for its workers, with one tensor a batch to
    take over."""
    pytest.importorskip("torch")
    moved, starved = scenarios.get("transfer-cost"), scenarios.get("too-few-workers")
    with lab_session(tmp_path / "lab") as session:
        agent = session.start_agent(30, ["--correlate.interval", "1", "--correlate.window", "30"])
        # each its own pods: a pod name belongs to the first domain that reports it
        jobs = {"moved": session.start_job(moved, ranks=1, name="moved", pod_prefix="moved-"),
                "slow": session.start_job(starved, ranks=1, name="slow", pod_prefix="slow-")}
        for job in jobs.values():
            job.wait_ready()
        bodies = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(bodies) < 2:
            session.check_alive()
            for name in jobs:
                status, body = get(agent, "/api/v1/diagnosis?rank=0&job=%s" % name)
                if status == 200 and body["batches"] >= 30 and body["verdict"] != "unknown":
                    bodies[name] = body
            time.sleep(1)
        body = bodies.get("moved", {})
        assert body.get("verdict") == "input_bound", json.dumps(body)
        top = body["causes"][0]
        assert top["cause"] == "transfer_cost", json.dumps(body["causes"])
        evidence = {e["signal"]: e["during_stalls"] for e in top["evidence"]}
        # the workers sleep 0 s a sample and keep the queue full: the wait is transfer. The
        # score is that share less what the workers' CPU shortage may explain: on a loaded
        # machine the run queue makes it nonzero (CI, with another test run beside it:
        # share 0.998, cpu_throttle 0.27, score 0.73), never the larger part
        starved = evidence.get("cpu_throttle_score", 0.0)
        assert evidence["transfer_wait_ratio"] >= 0.8 and starved < 0.5, evidence
        # and judged on the steady batches, it explains at most their share of the whole
        # wait (epochs.steady_part): on a loaded machine the workers' start-up can hold a
        # good part of a short window's wait (CI: epoch_start 0.27, score 0.728 of a 0.998
        # share)
        started = next((c["score"] for c in body["causes"] if c["cause"] == "epoch_start"), 0.0)
        assert started < top["score"], json.dumps(body["causes"])
        steady = 1.0 - started if started >= epochs.STEADY_EXACT else 1.0
        assert top["score"] == pytest.approx(
            evidence["transfer_wait_ratio"] * (1 - starved) * steady, abs=0.002), json.dumps(body["causes"])
        assert evidence["ready_wait_ratio"] < 0.2 * body["data_wait_ratio"], evidence
        slow = bodies.get("slow", {})
        assert slow.get("verdict") == "input_bound", json.dumps(slow)
        assert slow["causes"][0]["cause"] == "too_few_workers", json.dumps(slow["causes"])
        # 2 workers at 480 ms a batch: ~90 ms of each wait is for a ready batch
        cost = next(c for c in slow["causes"] if c["cause"] == "transfer_cost")
        assert cost["score"] < 0.2, cost
        print("transfer share: %.3f (transfer-cost rank), %.3f (too-few-workers rank)" % (
            top["score"], cost["score"]))
        metrics = agent.metrics()
        for name in jobs:
            assert any(line.startswith("stallscope_data_transfer_seconds_total{")
                       and 'job="%s"' % name in line for line in metrics.splitlines()), name
        assert 'stallscope_stall_cause_score{cause="transfer_cost",job="moved"' in metrics
        status, timeline = get(agent, "/api/v1/timeline?rank=0&job=moved&seconds=10")
        assert status == 200 and all("ready_wait_ns" in b for b in timeline["batches"])
