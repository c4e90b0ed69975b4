"""Both diagnose paths give the same steady wait (issue 29): on the lab's epoch-start run
most of the wait is each epoch's first batch (its workers forked again), and the loader's
steady pace is the rest. The Prometheus path reported 5.1 % where the agent and the loop
measured 1.2 %; it now reads the same quantity from the agent's counter of iterator-start
waits (stallscope_iterator_start_wait_seconds_total, promql.steady_data_wait_ratio)."""
import json
import subprocess
import sys
import time

import pytest

from stallscope.lab import scenarios
from stallscope.lab.findings import NAMESPACE
from stallscope.processes.children import child_env
from tests.helpers.lab import lab_session
from tests.helpers.needs import need_prometheus

pytestmark = pytest.mark.slow
WINDOW = "20s"


def diagnose(*args):
    p = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", *args, "--window", WINDOW,
                        "--json"], env=child_env(), capture_output=True, text=True, timeout=90)
    assert "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


def test_both_paths_give_the_steady_wait_of_an_epoch_start_run(tmp_path):
    pytest.importorskip("torch")
    need_prometheus()
    with lab_session(tmp_path / "lab") as session:
        agent = session.start_agent(60)
        prom = session.start_prometheus(rule_files=[])
        job = session.start_job(scenarios.get("epoch-start"), ranks=1, name="epochs")
        job.wait_ready()
        time.sleep(24)  # a full window: ~4 epochs of ~4.5 s
        session.check_alive()
        pod = job.pod(0)
        via_prom = diagnose(pod, "-n", NAMESPACE, "--prometheus", prom.url, "--agent", "http://127.0.0.1:9")
        via_agent = diagnose(pod, "-n", NAMESPACE, "--agent", agent.url)
    # the Prometheus path got no agent (port 9 answers nothing): its numbers are its own
    assert via_prom["agent_verdict"] is None and any(s["name"] == "prometheus" and s["ok"]
                                                     for s in via_prom["sources"])
    full_p, steady_p = via_prom["data_wait_ratio"], via_prom["steady_data_wait_ratio"]
    full_a, steady_a = via_agent["data_wait_ratio"], via_agent["steady_data_wait_ratio"]
    # most of the wait is at the epochs' starts on both paths ...
    assert full_p > 0.1 and full_a > 0.1, (full_p, full_a)
    assert steady_p < 0.5 * full_p and steady_a < 0.5 * full_a, (steady_p, full_p, steady_a, full_a)
    # ... and the steady wait left is the same, within a point
    print("epoch-start run: data-wait %.1f%% (prometheus) / %.1f%% (agent), steady %.2f%% / %.2f%%" % (
        100 * full_p, 100 * full_a, 100 * steady_p, 100 * steady_a))
    assert abs(steady_p - steady_a) <= 0.01, (steady_p, steady_a)
    rows = {r["signal"]: r for r in via_prom["evidence"]}
    assert rows["steady_data_wait_ratio"]["source"] == "prometheus"
