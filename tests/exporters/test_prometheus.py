"""The exporters' series as a real Prometheus stores them (honor_labels, as deployed):
node-wide readings carry only ``node`` (their empty pod/job labels are absent), a
pod's readings carry the training job's labels, self-health one series per exporter."""
import subprocess
import sys

import pytest

from stallscope.exporters import registry
from tests.helpers.exporters import kill

TRAINER = ("import time, stallscope\n"
           "for _ in stallscope.watch(iter(range(10 ** 9)), job='pj', pod='p0', namespace='ml'):\n"
           "    time.sleep(0.02)\n")


@pytest.mark.slow
def test_label_contract_in_prometheus(agent_factory, hook_env, prometheus_factory):
    agent = agent_factory("--exporter.interval", "0.5")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], env=hook_env(agent))
    try:
        prom = prometheus_factory([agent.url])
        shm = prom.wait_for("stallscope_shm_size_bytes", lambda r: len(r) == 2, timeout=40)
        pod = [r["metric"] for r in shm if r["metric"].get("pod") == "p0"]
        node = [r["metric"] for r in shm if "pod" not in r["metric"]]
        assert pod and pod[0]["job"] == "pj" and pod[0]["namespace"] == "ml" and "rank" not in pod[0]
        assert node and set(node[0]) == {"__name__", "instance", "node"}
        psi = prom.query('stallscope_pressure_cpu_waiting_seconds_total{pod=""}')
        assert len(psi) == 1 and psi[0]["metric"]["node"] == node[0]["node"]
        health = prom.query("stallscope_exporter_success == 1")
        assert sorted(r["metric"]["exporter"] for r in health) == sorted(
            e.name for e in registry.EXPORTERS if e.default)
        rate = prom.wait_for('rate(stallscope_pressure_cpu_waiting_seconds_total{pod=""}[5s])',
                             lambda r: len(r) == 1, timeout=20)
        assert float(rate[0]["value"][1]) >= 0
    finally:
        kill(trainer)
