"""Pod identity from Kubernetes (issue 33): a real agent process checks the pod name a
report claims against its node's pods, listed and watched from a fake API server that
speaks the real wire format (tests/helpers/kubeapi.py), for senders in real cgroups
whose paths are those pods' (so the kernel, not the message, names their pod UID)."""
import json
import os
import subprocess
import sys
import time

import pytest

from stallscope.processes.children import child_env
from stallscope.processes.servers import http_get
from tests.agent.test_hostile import batch, connect, rejected, report, samples, wait_until
from tests.helpers.kubeapi import FakeApiServer, PodCgroup, make_cert

NODE = "node-a"
UID_A = "0a0a0a0a-1111-2222-3333-444444444444"
UID_B = "0b0b0b0b-1111-2222-3333-444444444444"
UID_ELSEWHERE = "0c0c0c0c-1111-2222-3333-444444444444"  # a pod of another node
UID_LATE = "0d0d0d0d-1111-2222-3333-444444444444"

SENDER = r"""
import json, os, socket, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))  # into the pod's cgroup before connecting
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[2])
for m in json.loads(sys.argv[3]):
    m["pid"] = os.getpid()
    s.send(json.dumps(m).encode())
print("sent", flush=True)
sys.stdin.read()
"""


def claim(pod, namespace, rank=0, job="train"):
    m = json.loads(report(rank=rank, job=job, pod=pod, events=[batch(0.002, 0.1)]))
    m["id"]["namespace"] = namespace
    return m


@pytest.fixture
def pods(tmp_path):
    api = FakeApiServer(str(tmp_path)).start()
    api.add(UID_A, "team-a", "trainer-a", NODE)
    api.add(UID_B, "team-b", "trainer-b", NODE)
    api.add(UID_ELSEWHERE, "team-c", "trainer-c", "node-b")
    made, senders = {}, []

    def send(uid, agent, *msgs):
        cg = made.get(uid) or made.setdefault(uid, PodCgroup(uid))
        p = subprocess.Popen([sys.executable, "-c", SENDER, cg.procs, agent.socket, json.dumps(list(msgs))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
        senders.append(p)
        assert p.stdout.readline().strip() == "sent"
        return p
    api.send = send
    yield api
    for p in senders:
        p.kill()
        p.wait()
    for cg in made.values():
        cg.remove()
    api.stop()


def kube_agent(agent_factory, api, ca=None):
    return agent_factory("--node", NODE, "--kubernetes.api-server", api.url,
                         "--kubernetes.token-file", api.token_file, "--kubernetes.ca-file", ca or api.ca)


def accepted(agent, **labels):
    return samples(agent, "stallscope_data_wait_seconds_count", **labels)


def test_a_report_naming_another_pod_is_refused_and_a_real_one_accepted(agent_factory, pods):
    agent = kube_agent(agent_factory, pods)
    wait_until(lambda: samples(agent, "stallscope_agent_pod_identity_up") == [1])
    assert http_get(agent.url + "/healthz") == "ok\n"
    # The agent listed and watched this node's pods only, with its token.
    asked = [(q, auth) for path, q, auth in pods.requests if path == "/api/v1/pods"]
    assert asked and all(q["fieldSelector"] == "spec.nodeName=" + NODE and auth == "Bearer fake-token"
                         for q, auth in asked)
    wait_until(lambda: any(q.get("watch") == "true" for q, _ in asked) or
               any(q.get("watch") == "true" for _, q, _ in pods.requests))
    # From pod A: another pod of the node, then its own name, then no name at all.
    pods.send(UID_A, agent, claim("trainer-b", "team-b"), claim("trainer-a", "team-a", rank=1),
              claim("", "", rank=2))
    wait_until(lambda: rejected(agent, "pod_mismatch") == 1 and len(accepted(agent)) == 2)
    assert accepted(agent, pod="trainer-a", namespace="team-a", rank="1") == [1]
    assert accepted(agent, pod="trainer-a", namespace="team-a", rank="2") == [1]  # its real name
    assert accepted(agent, pod="trainer-b") == []
    # From a pod the API server does not place on this node: refused.
    pods.send(UID_ELSEWHERE, agent, claim("trainer-c", "team-c"))
    wait_until(lambda: rejected(agent, "pod_unknown") == 1)
    # From a host process (no pod): not in a pod's name; its own names by the domain rule.
    s = connect(agent.socket)
    s.send(json.dumps(claim("trainer-b", "team-b", rank=5)).encode())
    s.send(json.dumps(claim("host-job", "", rank=6)).encode())
    wait_until(lambda: rejected(agent, "pod_mismatch") == 2 and accepted(agent, pod="host-job") == [1])
    s.close()
    assert accepted(agent, pod="trainer-b") == []
    # A pod the watch brings after the list: its name is known, another's refused.
    pods.add(UID_LATE, "team-d", "trainer-d", NODE)
    time.sleep(0.5)
    pods.send(UID_LATE, agent, claim("trainer-a", "team-a", rank=9), claim("", "", rank=9))
    wait_until(lambda: rejected(agent, "pod_mismatch") == 3 and
               accepted(agent, pod="trainer-d", namespace="team-d") == [1])


def test_an_outage_of_the_api_server_degrades_to_the_domain_rule_and_recovers(agent_factory, pods):
    agent = kube_agent(agent_factory, pods)
    wait_until(lambda: samples(agent, "stallscope_agent_pod_identity_up") == [1])
    pods.set_down(True)
    wait_until(lambda: samples(agent, "stallscope_agent_pod_identity_up") == [0])
    # 200: degraded, not failing (said by the health responder within a beat of the
    # agent's jobs, agent/healthd.py)
    health = wait_until(lambda: (lambda h: h if h.startswith("ok (") else None)(
        http_get(agent.url + "/healthz")))
    assert health.startswith("ok (pod identity unavailable: OSError: the API server answered 503")
    time.sleep(3.5)  # several failed attempts (1 s, 2 s backoff): said once
    with open(agent.log) as f:
        lines = [x for x in f if "pod identity unavailable" in x]
    assert len(lines) == 1, lines
    # Trainers are not refused meanwhile: the domain rule holds (even an empty name).
    pods.send(UID_A, agent, claim("trainer-a", "team-a"), claim("renamed", "team-a", rank=1))
    wait_until(lambda: len(accepted(agent)) == 2)
    assert rejected(agent, "pod_mismatch") == rejected(agent, "pod_unknown") == 0
    pods.set_down(False)
    wait_until(lambda: samples(agent, "stallscope_agent_pod_identity_up") == [1], timeout=20)
    wait_until(lambda: http_get(agent.url + "/healthz") == "ok\n")
    pods.send(UID_A, agent, claim("trainer-b", "team-b", rank=3))
    wait_until(lambda: rejected(agent, "pod_mismatch") == 1)


def test_the_api_servers_certificate_is_verified(pods, tmp_path):
    from stallscope.processes.servers import AgentProcess

    other = tmp_path / "other"
    other.mkdir()
    wrong_ca, _ = make_cert(str(other), "someone-else")
    a = AgentProcess(args=("--node", NODE, "--kubernetes.api-server", pods.url, "--kubernetes.token-file",
                           pods.token_file, "--kubernetes.ca-file", wrong_ca), workdir=str(tmp_path / "a"))
    os.makedirs(a.dir)
    try:
        with pytest.raises(TimeoutError):  # its /healthz never says a plain "ok"
            a.start(timeout=4)
        health = http_get(a.url + "/healthz")
        assert health.startswith("ok (pod identity unavailable: SSLCertVerificationError") and \
            "CERTIFICATE_VERIFY_FAILED" in health
        assert samples(a, "stallscope_agent_pod_identity_up") == [0]
        assert not [r for r in pods.requests if r[0] == "/api/v1/pods"]  # no token went out
    finally:
        a.stop()
