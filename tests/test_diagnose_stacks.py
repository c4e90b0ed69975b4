"""``diagnose --stacks`` on real DataLoaders whose workers sit in a known place: the
classification of each worker's stack, the stuck-rank verdict it supports, and the
failure paths (py-spy missing, ptrace denied) as one-line notes."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from stallscope.lab.procs import child_env
from tests.conftest import need_root

TRAINER = os.path.join(os.path.dirname(__file__), "trainers", "stack_trainer.py")
pytestmark = pytest.mark.slow
MODES = ("fetch", "read", "decode", "collate", "idle")


def diagnose(*args, env=None, user=None, timeout=60):
    cmd = [sys.executable, "-m", "stallscope", "diagnose", *args]
    if user is not None:
        cmd = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups"] + cmd
    p = subprocess.run(cmd, env=child_env(env), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def stuck(tmp_path_factory):
    """One agent; one trainer per mode, each a pod of its own; the FIFO held open for
    writing so the reading workers block in read(), not in open()."""
    pytest.importorskip("torch")
    from stallscope.lab.procs import AgentProcess
    d = tmp_path_factory.mktemp("stacks")
    agent = AgentProcess(args=["--node", "node-s"], workdir=str(d)).start()
    fifo = str(d / "shard.fifo")
    os.mkfifo(fifo)
    hold = os.open(fifo, os.O_RDWR)
    procs = {}
    try:
        for mode in MODES:
            env = child_env({"STALLSCOPE_SOCKET": agent.socket, "STALLSCOPE_JOB": "sj",
                             "RANK": str(MODES.index(mode)), "POD_NAME": "st-" + mode,
                             "POD_NAMESPACE": "ml"})
            procs[mode] = subprocess.Popen([sys.executable, TRAINER, "--mode", mode, "--fifo", fifo],
                                           env=env, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ranks = agent.api("/api/v1/ranks")["ranks"]
            if len(ranks) == len(MODES) and all(len(r["worker_pids"]) == 2 for r in ranks):
                break
            time.sleep(0.5)
        else:
            pytest.fail("trainers did not register with their workers: %s" % agent.api("/api/v1/ranks"))
        time.sleep(3)  # workers past start-up and into their dataset code
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
    # no batch ever arrived: stuck, and the stacks put it inside the DataLoader
    assert doc["verdict"] == "input_bound" and rc == 1, doc["reason"]
    assert "stuck in next()" in doc["reason"]
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
    line = [l for l in err.splitlines() if "py-spy" in l]
    assert line == ["stallscope diagnose: warning: stacks: py-spy not found at "
                    "STALLSCOPE_PY_SPY=/nonexistent/py-spy"]
    # without the stacks a stuck loop cannot be placed: honest "unknown"
    assert doc["verdict"] == "unknown" and rc == 2 and "Traceback" not in err


def test_ptrace_denied_says_how_to_grant_it(stuck):
    need_root()
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux)")
    rc, out, err = diagnose("st-fetch", "--agent", stuck.url, "--window", "30s", "--stacks",
                            user=65534)  # nobody may not ptrace root's trainer
    assert "Traceback" not in err
    notes = [l for l in out.splitlines() if l.startswith("note: stacks:")]
    assert len(notes) == 1, out
    assert "ptrace not permitted for PID" in notes[0] and "SYS_PTRACE" in notes[0]
    assert rc == 2
