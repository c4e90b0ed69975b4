"""A node-wide cause (a full /dev/shm) on one of two lab nodes with two of a job's three
ranks, named for that node's starved rank only, through Prometheus and through every
node's agent (one rule set, both paths): what the lab's single-target scenarios (the
scoreboard's shm-full-node, two-jobs-nodes, straggler-across-nodes) cannot say. Issue 35;
`make test-lab`."""
import time

import pytest

from stallscope.lab import faults, scenarios
from tests.helpers.lab import diagnose_json, lab_session, leftovers
from tests.helpers.needs import need_lab_nodes, need_prometheus

pytestmark = [pytest.mark.slow, pytest.mark.lab_variant]
WINDOW = "15s"


def both_paths(pod, prom, placed):
    """(rc, report) through Prometheus, then through every node's agent."""
    agents = [a for n in placed for a in ("--agent", n.agent.url)]
    return [diagnose_json(pod, "--prometheus", prom.url, window=WINDOW, prometheus=prom.url),
            diagnose_json(pod, *agents, window=WINDOW)]


@pytest.fixture
def lab(tmp_path):
    pytest.importorskip("torch")
    need_prometheus()
    need_lab_nodes()
    workdir = tmp_path / "lab"
    with lab_session(workdir) as session:
        yield session
    assert leftovers(workdir) == []


def test_a_full_shm_on_one_node_is_named_for_its_ranks_only(lab):
    placed = [lab.add_node(name, window=120) for name in ("node-a", "node-b")]
    prom = lab.start_prometheus()
    scenario = scenarios.Scenario(
        "node-shm", "node-b's /dev/shm is tiny and mostly held; ranks 1 and 2 run there.",
        cause="shm_exhaustion", real=scenarios.RealRun(fault=faults.NodeShm, ranks=3))
    job = lab.start_job(scenario, ranks=3, name="nj", pod_prefix="nj-",
                        placement=[placed[0], placed[1], placed[1]], duration=120)
    job.wait_ready()
    time.sleep(18)
    # node-b's two ranks share what is left of its /dev/shm: whichever is starved is input-
    # bound on it, its /dev/shm full (the other may keep up and wait for it in the all_reduce)
    bound = []
    for pod in ("nj-1", "nj-2"):
        for _, doc in both_paths(pod, prom, placed):
            assert doc["node"] == "node-b", doc
            if doc["verdict"] == "input_bound":
                bound.append(pod)
                assert doc["causes"][0]["cause"] == "shm_exhaustion", (pod, doc["causes"][:2])
                shm = [r for r in doc["evidence"] if r["signal"] == "shm_used_ratio"]
                assert shm and shm[0]["value"] > 0.9, (pod, doc["evidence"])
            else:
                assert (doc["verdict"], doc["straggler"]["node"]) == ("not_input_bound", "node-b"), doc
    assert bound, "no rank on node-b starved"
    for rc, doc in both_paths("nj-0", prom, placed):
        assert (rc, doc["verdict"], doc["node"]) == (1, "not_input_bound", "node-a"), doc["reason"]
        assert doc["straggler"]["node"] == "node-b", doc["straggler"]
        assert "shm_exhaustion" not in [c["cause"] for c in doc["causes"]], doc["causes"]
