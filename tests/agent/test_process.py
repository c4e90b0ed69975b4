"""The agent as a real process: HTTP API, hostile input over the real socket, rank
expiry, one-line errors and clean shutdown."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from stallscope.processes.servers import free_port, http_get
from tests.helpers import wait_until
from tests.helpers.agent import metric, report, send


def test_api_and_rejects_over_the_real_socket(agent):
    t_end = time.monotonic_ns()
    conns = [send(agent.socket, report(rank=3, events=[(t_end, 10**6, 2 * 10**6)]))]
    conns.append(send(agent.socket, b"\x00garbage"))
    conns.append(send(agent.socket, b"{" * 70000))  # oversize
    conns.append(send(agent.socket, report(rank=4) | {"id": {"job": "", "rank": 1}}))
    ranks = wait_until(lambda: agent.api("/api/v1/ranks")["ranks"])
    assert ranks[0]["rank"] == 3 and ranks[0]["pid"] == os.getpid() and ranks[0]["batches"] == 1
    text = wait_until(lambda: (lambda t: t if metric(t, "stallscope_agent_rejected_messages_total",
                                                     reason="bad_label") else None)(agent.metrics()))
    assert metric(text, "stallscope_agent_rejected_messages_total", reason="bad_json") == 1
    assert metric(text, "stallscope_agent_rejected_messages_total", reason="oversize") == 1
    assert metric(text, "stallscope_data_wait_seconds_count", rank="3", job="j") == 1
    assert metric(text, "stallscope_data_wait_seconds_sum", rank="3") == pytest.approx(0.001)
    assert metric(text, "stallscope_step_seconds_sum", rank="3") == pytest.approx(0.002)
    # the timeline API and its errors
    tl = agent.api("/api/v1/timeline?rank=3&seconds=86400")
    assert tl["batches"] == [{"t_end_ns": t_end, "wait_ns": 10**6, "interval_ns": 2 * 10**6}]
    for bad, code in [("/api/v1/timeline", 400), ("/api/v1/timeline?rank=x", 400),
                      ("/api/v1/timeline?rank=3&seconds=-1", 400), ("/api/v1/timeline?rank=9", 404),
                      ("/api/v1/ranks?color=red", 400), ("/api/v1/nothing", 404)]:
        with pytest.raises(Exception) as e:
            http_get(agent.url + bad)
        assert getattr(e.value, "code", None) == code, bad
        assert "error" in json.loads(e.value.read())
    for c in conns:
        c.close()


def test_rank_cap_and_silent_expiry(agent_factory):
    a = agent_factory("--max-ranks", "2", "--rank-ttl", "1")
    conns = [send(a.socket, report(rank=r)) for r in range(3)]
    wait_until(lambda: metric(a.metrics(), "stallscope_agent_rejected_messages_total", reason="rank_limit"))
    assert len(a.api("/api/v1/ranks")["ranks"]) == 2
    # nothing more is sent: the ranks go silent and are evicted after the 1 s TTL
    wait_until(lambda: metric(a.metrics(), "stallscope_agent_rank_evictions_total", reason="silent") == 2)
    assert a.api("/api/v1/ranks")["ranks"] == []
    assert "stallscope_data_wait_seconds_count{" not in a.metrics()
    for c in conns:
        c.close()


def test_exited_process_is_kept_for_the_grace_then_evicted(agent_factory, hook_env, tmp_path):
    agent = agent_factory("--rank-exit-grace", "3")
    env = hook_env(agent, RANK=7)
    subprocess.run([sys.executable, "-c", "import stallscope; list(stallscope.watch(range(5)))"],
                   env=env, check=True, timeout=60)
    # the process is gone; its last flush at exit delivered the batches, and its series
    # stay for the grace period so that a scrape gets them
    ranks = wait_until(lambda: [r for r in agent.api("/api/v1/ranks")["ranks"] if r["exited"]])
    assert ranks[0]["batches"] == 5
    assert metric(agent.metrics(), "stallscope_data_wait_seconds_count", rank="7") == 5
    wait_until(lambda: metric(agent.metrics(), "stallscope_agent_rank_evictions_total", reason="exited") == 1)
    assert metric(agent.metrics(), "stallscope_agent_events_total") == 5
    assert metric(agent.metrics(), "stallscope_data_wait_seconds_count", rank="7") is None


def run_agent(*args, timeout=20):
    return subprocess.run([sys.executable, "-m", "stallscope", "agent", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_agent("--listen", "127.0.0.1:%d" % port, "--socket", str(tmp_path / "s.sock"))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "cannot listen on 127.0.0.1:%d" % port in r.stderr and "in use" in r.stderr
    assert not (tmp_path / "s.sock").exists()  # nothing left behind


def test_unbindable_socket_path_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = run_agent("--listen", "127.0.0.1:0", "--socket", str(blocker / "hook.sock"))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "cannot" in r.stderr and str(blocker) in r.stderr
    r = run_agent("--listen", "127.0.0.1:0", "--socket", str(blocker))  # a regular file in the way
    assert r.returncode == 1 and "non-socket file" in r.stderr
    r = run_agent("--listen", "nonsense", "--socket", str(tmp_path / "s.sock"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr


def test_second_agent_on_same_socket_refuses(agent):
    r = run_agent("--listen", "127.0.0.1:%d" % free_port(), "--socket", agent.socket)
    assert r.returncode == 1 and "another agent" in r.stderr
    assert http_get(agent.url + "/healthz") == "ok\n"  # the first one is untouched


def test_sigterm_stops_cleanly(agent):
    # and, started, it may open as many files as its hard limit allows: it keeps the /proc
    # files of every loader task it reads open (main.raise_open_files)
    with open("/proc/%d/limits" % agent.proc.pid) as f:
        [line] = [ln for ln in f if ln.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    assert soft == hard, line
    assert agent.stop(signal.SIGTERM) == 0
    assert not os.path.exists(agent.socket)


def test_sigusr1_writes_every_thread_s_stack_to_the_log_and_the_agent_goes_on(agent):
    """What a stop or a stuck collection waits on, from outside: SIGUSR1 (faulthandler)
    writes each thread's Python stack to stderr, the log, and changes nothing else."""
    os.kill(agent.proc.pid, signal.SIGUSR1)

    def dumped():
        with open(agent.log, errors="replace") as f:
            text = f.read()
        return text if text.count("Thread 0x") >= 3 else None

    text = wait_until(dumped)
    assert "ingest.py" in text and "serve_forever" in text  # the ingest loop, the HTTP loop
    assert http_get(agent.url + "/healthz") == "ok\n"
    assert agent.stop(signal.SIGTERM) == 0
