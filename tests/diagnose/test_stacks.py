"""``diagnose --stacks`` on real DataLoaders whose workers sit in a known place: the
classification of each worker's stack, the stuck-rank verdict it supports, and the
failure paths (py-spy missing, ptrace denied) as one-line notes."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stallscope.processes.children import child_env
from stallscope.processes.servers import PrometheusProcess, free_port
from tests.helpers import TRAINERS
from tests.helpers.needs import as_nobody, need_prometheus, need_root

TRAINER = os.path.join(TRAINERS, "stack_trainer.py")
pytestmark = pytest.mark.slow
MODES = ("fetch", "read", "decode", "collate", "idle")


def diagnose(*args, env=None, user=None, timeout=60):
    cmd = [sys.executable, "-m", "stallscope", "diagnose", *args]
    if user is not None:
        assert user == 65534, "only nobody is supported (tests.helpers.needs.as_nobody)"
        cmd = as_nobody(cmd)
    p = subprocess.run(cmd, env=child_env(env), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def stuck(tmp_path_factory):
    """One agent; one trainer per mode, each a pod of its own; the FIFO held open for
    writing so the reading workers block in read(), not in open()."""
    pytest.importorskip("torch")
    from stallscope.processes.servers import AgentProcess
    d = tmp_path_factory.mktemp("stacks")
    agent = AgentProcess(args=["--node", "node-s"], workdir=str(d)).start()
    fifo = str(d / "shard.fifo")
    os.mkfifo(fifo)
    hold = os.open(fifo, os.O_RDWR)
    procs = {}
    prom = None
    try:
        need_prometheus()
        prom = PrometheusProcess([agent.url], workdir=str(d)).start()
        agent.prom = prom
        for mode in MODES:
            env = child_env({"STALLSCOPE_SOCKET": agent.socket, "STALLSCOPE_JOB": "sj",
                             "RANK": str(MODES.index(mode)), "POD_NAME": "st-" + mode,
                             "POD_NAMESPACE": "ml"})
            procs[mode] = subprocess.Popen([sys.executable, TRAINER, "--mode", mode, "--fifo", fifo],
                                           env=env, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ranks = {r["pod"]: r for r in agent.api("/api/v1/ranks")["ranks"]}
            # every stuck loop blocked in next() for longer than diagnose's 5 s line, and
            # the idle one past its first batch, in its step
            if len(ranks) == len(MODES) and all(len(r["worker_pids"]) == 2 for r in ranks.values()) \
                    and all(ranks["st-" + m]["blocked_in_next_seconds"] >= 6 for m in MODES if m != "idle") \
                    and ranks["st-idle"]["batches"] >= 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail("trainers did not register and block: %s" % agent.api("/api/v1/ranks"))
        yield agent
    finally:
        for p in procs.values():  # the workers never return: end the whole group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        os.close(hold)
        agent.stop()
        if prom is not None:
            prom.stop()


def stacks_of(agent, mode):
    rc, out, err = diagnose("st-" + mode, "--agent", agent.url, "--window", "30s", "--stacks", "--json")
    doc = json.loads(out)
    assert doc["stacks"] and not doc["stacks"].get("error"), (doc["stacks"], err)
    return rc, doc


@pytest.mark.parametrize("mode,expected", [("fetch", "fetch"), ("read", "fetch"),
                                           ("decode", "decode"), ("collate", "collate")])
def test_worker_stacks_are_classified(stuck, mode, expected):
    need_root()  # ptrace of another user's process; as root here
    rc, doc = stacks_of(stuck, mode)
    st = doc["stacks"]
    workers = [p for p in st["processes"] if p["role"] == "worker"]
    assert len(workers) == 2 and [p["class"] for p in workers] == [expected] * 2, st["processes"]
    assert st["workers"][expected] == 2
    # the loop is blocked in next() waiting for a batch from the workers
    assert st["main"] == "ipc_wait", st["processes"][0]
    # no batch ever arrived: the hook says the loop is blocked in next(), the stacks agree
    assert doc["verdict"] == "input_bound" and rc == 1, doc["reason"]
    assert "has been blocked in next() for" in doc["reason"] and doc["blocked_in_next_seconds"] >= 6
    if mode == "read":
        assert all(".read(" in p["line"] for p in workers)
    if mode == "fetch":
        assert all(p["where"].startswith("fetch_remote_shard") for p in workers)


def test_idle_workers_and_the_loop_outside_the_loader(stuck):
    need_root()
    _, doc = stacks_of(stuck, "idle")
    st = doc["stacks"]
    assert st["main"] == "outside_loader" and "train_step" in st["processes"][0]["where"]
    assert st["workers"]["idle"] == 2, st["processes"]


def test_text_report_shows_the_stacks(stuck):
    need_root()
    rc, out, _ = diagnose("st-decode", "--agent", stuck.url, "--window", "30s", "--stacks")
    assert rc == 1
    assert "Stacks (py-spy)" in out and "main: ipc_wait; workers: 2 decode" in out
    assert "decoding or transforming samples" in out


def test_py_spy_missing_is_a_note_not_a_failure(stuck):
    rc, out, err = diagnose("st-fetch", "--agent", stuck.url, "--window", "30s", "--stacks", "--json",
                            env={"STALLSCOPE_PY_SPY": "/nonexistent/py-spy"})
    doc = json.loads(out)
    assert doc["stacks"]["error"] == "py-spy not found at STALLSCOPE_PY_SPY=/nonexistent/py-spy"
    mentions = [line for line in err.splitlines() if "py-spy" in line]
    assert mentions == ["stallscope diagnose: warning: stacks: py-spy not found at "
                    "STALLSCOPE_PY_SPY=/nonexistent/py-spy"]
    # the verdict stands on the hook's report alone: blocked in next()
    assert doc["verdict"] == "input_bound" and rc == 1 and "Traceback" not in err


def test_ptrace_denied_says_how_to_grant_it(stuck):
    need_root()
    rc, out, err = diagnose("st-fetch", "--agent", stuck.url, "--window", "30s", "--stacks",
                            user=65534)  # nobody may not ptrace root's trainer
    assert "Traceback" not in err
    notes = [line for line in out.splitlines() if line.startswith("note: stacks:")]
    assert len(notes) == 1, out
    assert "ptrace not permitted for PID" in notes[0] and "SYS_PTRACE" in notes[0]
    assert rc == 1


def test_prometheus_alone_sees_a_loop_blocked_in_next(stuck):
    """The agent adds a wait in progress to both sums: in Prometheus a blocked rank waits
    ~100 % of a window without a batch, even when its agent cannot be asked."""
    closed = "http://127.0.0.1:%d" % free_port()
    rc, out, err = diagnose("st-read", "--prometheus", stuck.prom.url, "--agent", closed,
                            "--window", "5s", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["verdict"] == "input_bound", doc["reason"]
    assert doc["reason"].startswith("Rank 1 completed no batch in the last 5s and waited in next() all along")
    assert doc["data_wait_ratio"] > 0.9 and doc["pod"] == "st-read" and doc["node"] == "node-s"
    # with the agent found in Prometheus, the hook's own report says how long
    rc, out, _ = diagnose("st-read", "--prometheus", stuck.prom.url, "--window", "5s", "--json")
    doc = json.loads(out)
    assert rc == 1 and "has been blocked in next() for" in doc["reason"]
