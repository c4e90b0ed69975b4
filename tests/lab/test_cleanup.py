"""Ctrl-C (SIGINT) and SIGTERM in the middle of a run remove everything it created:
processes, mounts (FUSE, the tiny /dev/shm in its namespace), cgroups, lab nodes (network
namespaces, veths, the bridge). Checked for real by looking at every process, every mount
namespace, the cgroup tree and the network devices afterwards."""
import os
import signal
import subprocess
import time

import pytest

from stallscope.lab import scenarios
from stallscope.processes import children, servers
from tests.helpers.lab import lab_cmd, leftovers, manifest

pytestmark = pytest.mark.slow


def _start(tmp_path, *args):
    workdir = tmp_path / "run"
    p = subprocess.Popen(lab_cmd("run", *args, "--workdir", workdir, "--no-prometheus"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=children.child_env())
    return p, str(workdir)


def _wait_running(p, workdir, timeout=150):
    """Until the measured window started (the first progress line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            raise AssertionError("run ended early: rc=%s %s" % (p.wait(), p.stderr.read()[-2000:]))
        if line.startswith("["):
            return manifest(workdir)
    raise AssertionError("no progress line in %ss" % timeout)


@pytest.mark.parametrize("name, sig", [("cpu-throttle", signal.SIGINT), ("dead-fuse", signal.SIGTERM),
                                       ("shm-exhaustion", signal.SIGINT),
                                       # lab nodes: CI's tests/lab/test_nodes.py checks that
                                       # its session leaves nothing; Ctrl-C here, make test-lab
                                       pytest.param("straggler-across-nodes", signal.SIGINT,
                                                    marks=pytest.mark.lab_variant)])
def test_a_signal_mid_run_removes_everything(name, sig, tmp_path):
    pytest.importorskip("torch")
    reason = scenarios.get(name).make_fault().missing()
    if reason:
        pytest.skip(reason)
    p, workdir = _start(tmp_path, name, "--duration", 60)
    try:
        made = _wait_running(p, workdir)
        time.sleep(1)
        # what the fault made is really there before the signal
        assert len(made["pgids"]) >= 3  # agent + 2 ranks (+ helpers)
        for cg in made["cgroups"]:
            assert os.path.isdir(cg)
        before = leftovers(workdir)  # the checker sees the live run: it can fail
        assert any(x.startswith("process group") for x in before), before
        assert all(any(cg in x for x in before) for cg in made["cgroups"]), before
        if name == "dead-fuse":
            assert any(x.startswith("mount ") and "fuse" in x for x in before), before
        if name == "straggler-across-nodes":  # lab nodes: 3 namespaces, 3 veths and a bridge
            assert sum(x.startswith("network namespace") for x in before) == 3, before
            assert sum(x.startswith("interface") for x in before) == 4, before
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + sig, err[-2000:]
    assert "interrupted by %s" % signal.Signals(sig).name in err
    assert err.strip().splitlines()[-1].startswith("stallscope lab: interrupted")
    assert leftovers(workdir) == []


def test_keep_serves_until_ctrl_c_then_cleans_up(tmp_path):
    pytest.importorskip("torch")
    p, workdir = _start(tmp_path, "too-few-workers", "--duration", 5, "--keep")
    try:
        deadline = time.monotonic() + 150
        seen = []
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            seen.append(line)
            if "agent" in line and "/metrics" in line:
                break
        url = line.split()[1].rsplit("/metrics", 1)[0]
        assert "stallscope_data_wait_seconds_count" in servers.http_get(url + "/metrics")
        time.sleep(2)
        assert p.poll() is None  # still up, still training
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130
    assert "too-few-workers" in "".join(seen)
    assert leftovers(workdir) == []
