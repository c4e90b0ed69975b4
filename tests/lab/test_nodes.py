"""Lab nodes (issue 35): three "nodes", each a network, UTS and mount namespace with its
own agent, a job whose three ranks run one a node in lockstep (gloo over the veths), the
straggler on node-c. Diagnosed through Prometheus (scraping the agents through the lab's
bridge), through every node's agent, and through node-a's agent alone; then with node-c's
agent down; then nothing of the nodes is left.

The partial-view check is the one that needs nodes: with the three ranks beside one
agent (the lab before nodes), node-a's agent sees the whole job and the victim's
`unknown` below would be `not_input_bound` (the closing note of issue 35 shows it)."""
import os
import subprocess
import time

import pytest

from stallscope.lab import scenarios
from tests.helpers.lab import diagnose_json, lab_session, leftovers
from tests.helpers.needs import need_lab_nodes, need_prometheus

# a long multi-node scenario (~55 s): `make test-lab`, not CI; each node's parts run in CI
pytestmark = [pytest.mark.slow, pytest.mark.lab_variant]
WINDOW = "15s"
NODES = ("node-a", "node-b", "node-c")


def diagnose(*args, prometheus=None):
    return diagnose_json(*args, window=WINDOW, prometheus=prometheus)


def _hostname(node):
    out = subprocess.run(node.enter() + ["hostname"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_straggler_on_one_node_named_from_the_others(tmp_path):
    pytest.importorskip("torch")
    need_prometheus()
    need_lab_nodes()
    workdir = tmp_path / "lab"
    with lab_session(workdir) as session:
        placed = [session.add_node(name, window=120) for name in NODES]
        prom = session.start_prometheus()
        job = session.start_job(scenarios.get("too-few-workers"), ranks=3, name="xj", pod_prefix="xj-",
                                placement=placed, duration=120)
        job.wait_ready()
        sent = [n.rx_bytes() for n in placed]
        time.sleep(18)  # the window holds steady state only
        # each node is its own: hostname (UTS namespace), /dev/shm (its tmpfs, not the
        # host's), address; and the ranks' all_reduce crossed every node's veth
        assert [_hostname(n) for n in placed] == list(NODES)
        shm = {os.stat("/proc/%d/root/dev/shm" % n.holder.pid).st_dev for n in placed}
        assert len(shm) == 3 and os.stat("/dev/shm").st_dev not in shm
        assert all(n.rx_bytes() - before > 10_000 for n, before in zip(placed, sent)), (
            [n.rx_bytes() - b for n, b in zip(placed, sent)])
        agents = [a for n in placed for a in ("--agent", n.agent.url)]
        found = node_c_says = None
        for pod, node in (("xj-0", "node-a"), ("xj-1", "node-b"), ("xj-2", "node-c")):
            via_prom = diagnose(pod, "--prometheus", prom.url, prometheus=prom.url)
            via_agents = diagnose(pod, *agents)
            for rc, doc in (via_prom, via_agents):
                assert doc["node"] == node and doc["job_ranks"] == 3, doc
                assert {k: doc["straggler"][k] for k in ("rank", "pod", "node")} == {
                    "rank": 2, "pod": "xj-2", "node": "node-c"}, doc["straggler"]
                if pod == "xj-2":
                    assert (rc, doc["verdict"]) == (1, "input_bound"), doc["reason"]
                    found = found or doc["causes"][0]["cause"]
                    assert doc["causes"][0]["cause"] == found, (doc["causes"][:2], found)
                else:
                    assert (rc, doc["verdict"]) == (1, "not_input_bound"), doc["reason"]
                    assert "pod xj-2 on node node-c" in doc["reason"], doc["reason"]
        # the cause named on node-a is the one node-c's own agent found
        node_c_says = placed[2].agent.api("/api/v1/diagnosis?job=xj&rank=2")
        assert found == "too_few_workers" and node_c_says["causes"][0]["cause"] == found, node_c_says
        # node-a's agent alone: it knows the job has 3 ranks and sees 1
        rc, alone = diagnose("xj-0", "--agent", placed[0].agent.url)
        assert (rc, alone["verdict"], alone["job_ranks"]) == (2, "unknown", 1), alone["reason"]
        assert "sees 1 of the job's 3 ranks" in alone["reason"], alone["reason"]
        assert any(w.startswith("partial view") for w in alone["warnings"]), alone["warnings"]
        # node-c's agent goes down: Prometheus loses its ranks' series, StallscopeAgentDown
        # fires, and a victim on node-a is not called healthy on what is left
        placed[2].agent.stop()
        down = time.monotonic()
        instance = "%s:%d" % (placed[2].ip, placed[2].agent.port)
        deadline = time.monotonic() + 60
        while not [a for a in prom.alerts() if a["labels"]["alertname"] == "StallscopeAgentDown"
                   and a["state"] == "firing" and a["labels"].get("instance") == instance]:
            assert time.monotonic() < deadline, prom.alerts()
            time.sleep(0.5)
        time.sleep(max(0.0, down + 16 - time.monotonic()))  # its last samples out of the window
        rc, blind = diagnose("xj-0", "--prometheus", prom.url, prometheus=prom.url)
        assert (rc, blind["verdict"], blind["job_ranks"]) == (2, "unknown", 2), blind["reason"]
        assert "rank 2 (pod xj-2 on node node-c)" in blind["reason"] and instance in blind["reason"], (
            blind["reason"])
        assert any(w.startswith("partial view: 1 of the job's 3 ranks") for w in blind["warnings"]), (
            blind["warnings"])
        # ... and through every node's agent, node-c's unreachable: the same verdict
        rc, blind = diagnose("xj-0", *agents)
        assert (rc, blind["verdict"], blind["job_ranks"]) == (2, "unknown", 2), blind["reason"]
        gone = "agent unreachable at %s" % placed[2].agent.url
        assert any(w.startswith(gone) for w in blind["warnings"]), blind["warnings"]
        made = leftovers(workdir)  # the checker sees the live nodes: it can fail
        assert sum(x.startswith("network namespace") for x in made) == 3, made
        assert sum(x.startswith("interface") for x in made) == 4, made  # 3 veths + the bridge
    assert leftovers(workdir) == []
