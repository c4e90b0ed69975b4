"""End to end on real parts: a real DataLoader with worker processes in its own process,
the agent in another, and a real Prometheus scraping the agent."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, TRAINERS, wait_until
from tests.helpers.agent import metric

TRAINER = os.path.join(TRAINERS, "simple_trainer.py")
pytestmark = pytest.mark.slow


def train(env, out, *args, wait=True):
    cmd = [sys.executable, TRAINER, "--out", str(out), *map(str, args)]
    p = subprocess.Popen(cmd, env=env)
    if wait:
        assert p.wait(timeout=180) == 0
        return json.loads(out.read_text())
    return p


def test_agent_sums_match_the_injected_sleep_and_compute(agent, hook_env, tmp_path):
    pytest.importorskip("torch")
    samples, sleep, batch, workers, compute = 160, 0.02, 4, 2, 0.01
    stats = train(hook_env(agent, RANK=0, STALLSCOPE_JOB="e2e"), tmp_path / "s.json",
                  "--samples", samples, "--sample-sleep", sleep, "--batch-size", batch,
                  "--workers", workers, "--compute", compute)
    n = samples // batch
    text = wait_until(lambda: (lambda t: t if metric(t, "stallscope_data_wait_seconds_count",
                                                     job="e2e") == n else None)(agent.metrics()), 15)
    wait_sum = metric(text, "stallscope_data_wait_seconds_sum", job="e2e")
    step_sum = metric(text, "stallscope_step_seconds_sum", job="e2e")
    ep = stats["epochs"][0]
    # The hook's intervals tile the span from the first next() to the last batch, which
    # the loop measured with the same clock: they agree to within timer overhead.
    assert step_sum == pytest.approx(ep["elapsed_s"], rel=0.01, abs=0.005)
    # Within that span the loop either computed (measured by the loop) or waited.
    # The rest is loop overhead: well under 1 ms per batch.
    outside_compute = ep["elapsed_s"] - ep["compute_in_span_s"]
    assert outside_compute - n * 0.001 <= wait_sum <= outside_compute
    # Each worker sleeps batch*sleep per batch and handles n/workers batches, so the span
    # lasts at least n/workers*batch*sleep: the loop waited at least that minus its compute.
    floor = (n / workers) * batch * sleep
    assert wait_sum >= floor - ep["compute_in_span_s"] - 0.005
    assert ep["elapsed_s"] >= floor * 0.99
    # loader config and the worker PIDs reached the agent
    info = [line for line in text.splitlines() if line.startswith("stallscope_loader_info{")]
    assert len(info) == 1 and 'num_workers="2"' in info[0] and 'batch_size="4"' in info[0]


def test_prometheus_max_rank_sli_names_the_slow_rank(agent, hook_env, prometheus_factory, tmp_path):
    pytest.importorskip("torch")
    prom = prometheus_factory([agent.url])
    # one epoch outlasts the run: no worker restarts
    common = ["--duration", 16, "--batch-size", 4, "--workers", 2, "--compute", 0.25, "--samples", 4000]
    fast = train(hook_env(agent, RANK=0, STALLSCOPE_JOB="pj"), tmp_path / "f.json", *common, wait=False)
    # fast: a prefetched batch still costs ~1.2 ms of IPC here (tensor over shared
    # memory; a few ms on a loaded machine), about 1 % of a 250 ms step at worst. slow:
    # each worker needs 4 x 150 ms = 600 ms a batch, two give one per 300 ms against
    # 250 ms of compute: the loop waits ~50 ms of every ~300 ms step (ratio ~0.17)
    slow = train(hook_env(agent, RANK=1, STALLSCOPE_JOB="pj"), tmp_path / "s.json", *common,
                 "--sample-sleep", 0.15, wait=False)
    try:
        sli = "rate(stallscope_data_wait_seconds_sum[6s]) / rate(stallscope_step_seconds_sum[6s])"
        prom.wait_for("count(%s)" % sli, lambda r: r and float(r[0]["value"][1]) == 2, timeout=40)
        time.sleep(7)  # both ranks past start-up: the 6 s window holds only steady state
        top = prom.query("max by (job) (%s)" % sli)
        per_rank = {r["metric"]["rank"]: float(r["value"][1]) for r in prom.query(sli)}
    finally:
        assert fast.wait(timeout=120) == 0 and slow.wait(timeout=120) == 0
    assert len(top) == 1 and top[0]["metric"]["job"] == "pj"
    assert float(top[0]["value"][1]) == pytest.approx(per_rank["1"])
    assert per_rank["1"] > 0.08, per_rank  # expected ~0.17; well above the 0.02 alert line
    assert per_rank["0"] < 0.02, per_rank


def test_no_agent_loop_runs_and_counts_drops(tmp_path):
    env = dict(os.environ, STALLSCOPE_SOCKET=str(tmp_path / "nobody.sock"),
               PYTHONPATH=ROOT)
    code = ("import time, stallscope\n"
            "from stallscope.hook import channel\n"
            "w = stallscope.watch(range(200000))\n"
            "t = time.perf_counter(); n = sum(1 for _ in w); t = time.perf_counter() - t\n"
            "channel.get().flush()\n"
            "print(n, channel.get().dropped, t)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    n, dropped = int(out[0]), int(out[1])
    assert n == 200000
    assert dropped == 200000  # every event counted: none delivered, none lost silently


def test_agent_killed_and_restarted_mid_run(agent_factory, hook_env, tmp_path):
    first = agent_factory()
    env = hook_env(first, RANK=0, STALLSCOPE_JOB="kr")
    # 2 ms compute per batch over a plain list, for 8 s
    p = train(env, tmp_path / "k.json", "--plain", "--samples", 10**7, "--compute", 0.002,
              "--duration", 8, wait=False)
    try:
        wait_until(lambda: metric(first.metrics(), "stallscope_data_wait_seconds_count", job="kr"))
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        time.sleep(1.5)  # the loop runs on with no agent: these events are dropped
        # a new agent on the same socket path (the stale socket file is replaced)
        from stallscope.processes.servers import AgentProcess
        second = AgentProcess(workdir=first.dir)
        second.socket = first.socket
        second.start()
        try:
            wait_until(lambda: metric(second.metrics(), "stallscope_data_wait_seconds_count", job="kr"), 10)
            dropped = wait_until(
                lambda: metric(second.metrics(), "stallscope_hook_dropped_events_total", job="kr"), 10)
            assert dropped > 0
        finally:
            assert p.wait(timeout=60) == 0
            final = second.metrics()
            second.stop()
    finally:
        if p.poll() is None:
            p.kill()
    stats = json.loads((tmp_path / "k.json").read_text())
    delivered_later = metric(final, "stallscope_data_wait_seconds_count", job="kr")
    dropped = metric(final, "stallscope_hook_dropped_events_total", job="kr")
    # the loop never waited on the agent: no batch took longer than a fraction of a second
    assert stats["max_gap_s"] < 0.25, stats["max_gap_s"]
    # nothing vanished silently: events after the restart were delivered, the batches
    # while no agent listened were counted, and the first agent got the rest
    assert delivered_later + dropped <= stats["batches"]
    assert delivered_later > 0 and dropped > 0


def test_stopped_agent_never_blocks_the_loop(agent_factory, hook_env, tmp_path):
    agent = agent_factory("--rank-exit-grace", "0")
    env = hook_env(agent, RANK=0, STALLSCOPE_JOB="st")
    p = train(env, tmp_path / "st.json", "--plain", "--samples", 10**7, "--compute", 0.001,
              "--duration", 6, wait=False)
    wait_until(lambda: metric(agent.metrics(), "stallscope_data_wait_seconds_count", job="st"))
    agent.proc.send_signal(signal.SIGSTOP)  # alive but not reading: its buffers fill up
    try:
        time.sleep(3)
    finally:
        agent.proc.send_signal(signal.SIGCONT)
    assert p.wait(timeout=60) == 0
    stats = json.loads((tmp_path / "st.json").read_text())
    assert stats["max_gap_s"] < 0.25, stats["max_gap_s"]
    text = wait_until(lambda: (lambda t: t if metric(t, "stallscope_agent_rank_evictions_total",
                                                     reason="exited") == 1 else None)(agent.metrics()))
    # A slow agent costs nothing but latency: the events waited in the hook (bounded)
    # and every one of them arrived once the agent ran again.
    assert metric(text, "stallscope_agent_events_total") == stats["batches"]


def test_a_rank_hung_in_next_shows_as_waiting_before_its_batch_arrives(agent, hook_env, tmp_path):
    code = ("import time, stallscope\n"
            "def data():\n"
            "    for i in range(20):\n"
            "        if i == 10:\n"
            "            time.sleep(4.0)  # a hung read: the loop blocks inside next()\n"
            "        yield i\n"
            "for _ in stallscope.watch(data()):\n"
            "    time.sleep(0.01)\n"
            "time.sleep(0.6)\n")  # the exited rank's series stay for --rank-exit-grace
    p = subprocess.Popen([sys.executable, "-c", code], env=hook_env(agent, RANK=0, STALLSCOPE_JOB="hung"))
    try:
        def hung_for_a_while():
            t = agent.metrics()
            s = metric(t, "stallscope_data_wait_seconds_sum", job="hung")
            return t if s is not None and s >= 1.5 else None
        text = wait_until(hung_for_a_while, 10)
        # the sum grew while no batch arrived: 10 batches counted, the 11th still pending
        assert metric(text, "stallscope_data_wait_seconds_count", job="hung") == 10
        assert metric(text, "stallscope_step_seconds_sum", job="hung") >= 1.5
        assert agent.api("/api/v1/ranks")["ranks"][0]["blocked_in_next_seconds"] >= 1.5
    finally:
        assert p.wait(timeout=60) == 0
    text = wait_until(lambda: (lambda t: t if metric(t, "stallscope_data_wait_seconds_count",
                                                     job="hung") == 20 else None)(agent.metrics()), 10)
    # settled: the sum is the real wait (4 s of it in one batch), not counted twice
    assert 4.0 <= metric(text, "stallscope_data_wait_seconds_sum", job="hung") < 4.5


ACKED_TRAINER = r"""
import json, time
import stallscope
from stallscope.hook import channel
n = 0
end = time.monotonic() + float(__import__("sys").argv[1])
for _ in stallscope.watch(range(10**8)):
    time.sleep(0.002)
    n += 1
    if time.monotonic() > end:
        break
ch = channel.get()
for _ in range(3):  # deliver what is left, then read the agent's acknowledgements
    ch.flush()
    time.sleep(0.6)
print(json.dumps({"batches": n, "acked": ch.acked_events, "dropped": ch.dropped,
                  "unacked": sum(k for _, k in ch.unacked)}))
"""


def test_an_agent_killed_with_reports_in_its_queue_leaves_no_uncounted_event(agent_factory, hook_env):
    # Issue 33: the reports sitting in a killed agent's socket queue were lost uncounted
    # (50 events a rank in the kill/restart probe). Now the agent acknowledges what it
    # takes, and the hook counts what no acknowledgement covered as dropped.
    first = agent_factory()
    env = hook_env(first, RANK=0, STALLSCOPE_JOB="ack")
    p = subprocess.Popen([sys.executable, "-c", ACKED_TRAINER, "9"], env=env, stdout=subprocess.PIPE,
                         text=True)
    try:
        wait_until(lambda: metric(first.metrics(), "stallscope_data_wait_seconds_count", job="ack"), 15)
        first.proc.send_signal(signal.SIGSTOP)  # reports pile up in its queue, unread
        time.sleep(2.5)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        from stallscope.processes.servers import AgentProcess
        second = AgentProcess(workdir=first.dir)
        second.socket = first.socket
        second.start()
        try:
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0
            final = second.metrics()
        finally:
            second.stop()
    finally:
        if p.poll() is None:
            p.kill()
    hook = json.loads(out)
    # every batch the loop made was either taken by an agent (acknowledged) or counted
    assert hook["unacked"] == 0
    assert hook["acked"] + hook["dropped"] == hook["batches"], hook
    # what sat in the killed agent's queue is among the dropped: at least 1 s of batches
    # (the flush thread sends once a second, at most 500 batches a second here)
    assert hook["dropped"] >= 100, hook
    # and the second agent was told the hook's count of them
    assert metric(final, "stallscope_hook_dropped_events_total", job="ack") == hook["dropped"]
