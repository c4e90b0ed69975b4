"""End to end: real DataLoaders report to a real agent, whose correlator diagnoses them."""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import ROOT

TRAINER = os.path.join(ROOT, "scripts", "record_trace.py")


def get(agent, path):
    try:
        with urllib.request.urlopen(agent.url + path, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_agent_diagnoses_a_starved_loader_and_a_healthy_one(agent_factory, hook_env):
    agent = agent_factory("--correlate.interval", "1", "--correlate.window", "30")
    env = hook_env(agent)
    common = [sys.executable, "-W", "ignore", TRAINER, "--trainer", "--duration", "30",
              "--batch-size", "8"]
    # 2 workers at 8 x 50 ms per batch: a round of 2 batches every 0.4 s vs 0.1 s of compute
    slow = subprocess.Popen(common + ["--job", "slow", "--workers", "2", "--sample-sleep", "0.05",
                                      "--compute", "0.05"], env=env)
    # compute-bound: 200 ms per step, a worker with nothing to do but collate
    fine = subprocess.Popen(common + ["--job", "fine", "--workers", "1", "--compute", "0.2"], env=env)
    try:
        # torch's import and the workers' start take seconds on a loaded machine: wait
        # for enough batches (the stalls start with the first worker round)
        deadline = time.monotonic() + 45
        body = {}
        while time.monotonic() < deadline:
            status, body = get(agent, "/api/v1/diagnosis?rank=0&job=slow")
            if status == 200 and body["batches"] >= 30 and body["verdict"] != "unknown":
                break
            time.sleep(1)
        assert body.get("verdict") == "input_bound", body
        assert body["data_wait_ratio"] > 0.3
        assert body["causes"][0]["cause"] == "too_few_workers", json.dumps(body)
        assert body["stall_period_steps"] == 2
        assert body["loader"]["num_workers"] == 2
        status, fine_body = get(agent, "/api/v1/diagnosis?rank=0&job=fine")
        assert status == 200 and fine_body["verdict"] in ("healthy", "unknown"), json.dumps(fine_body)
        assert fine_body["causes"] == []
        metrics = agent.metrics()
        assert 'stallscope_stall_cause_score{cause="too_few_workers",job="slow"' in metrics
        assert any(line.startswith("stallscope_stall_period_steps{") and 'job="slow"' in line
                   and line.endswith(" 2.0") for line in metrics.splitlines())
        assert get(agent, "/api/v1/diagnosis?pod=nope")[0] == 404
        status, err = get(agent, "/api/v1/diagnosis?rank=x")
        assert status == 400 and "bad value" in err["error"]
    finally:
        for p in (slow, fine):
            p.kill()
            p.wait()
