"""Loader workers that died, on diagnose's Prometheus path (issue 18): a real rank (the
lab's trainer, alone) whose workers really die of SIGBUS on a full tmpfs /dev/shm (its
own mount namespace) and which restarts its loader each time; a real agent, scraped by a
real Prometheus. ``stallscope diagnose --prometheus`` must count the pod's exits by
reason as the kernel reported them (torch's own "killed by signal: Bus error" lines, from
its waitid) and rank shm_exhaustion first from them, as the agent's correlator does with
its own timelines; then with the agent gone, from Prometheus alone."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from stallscope.processes.children import child_env
from stallscope.processes.servers import AgentProcess, PrometheusProcess
from tests.helpers.needs import need_prometheus, need_root

pytestmark = pytest.mark.slow
WINDOW = "120s"  # the whole run: every death the kernel reported is in it
PLAN = {"rank": 0, "world_size": 1, "workers": 2, "batch_size": 8, "prefetch_factor": 2,
        "compute_s": 0.15, "sample_sleep_s": 0.002, "sample_bytes": 4096, "max_s": 150,
        "worker_shm_cache_bytes": 64 << 10, "restart_on_worker_death": True, "worker_start_s": 0.5}
# 128 MiB of /dev/shm, 112 MiB held: each worker keeps 64 KiB a sample until it dies
SHM = ("mount -t tmpfs -o size=128m,mode=1777 t /dev/shm && "
       "head -c %d /dev/zero > /dev/shm/leftover && exec \"$@\"" % (112 << 20))
BUS = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: Bus error")


def diagnose(prom, *more):
    p = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", "shm-0", "-n", "ml",
                        "--prometheus", prom.url, "--window", WINDOW, "--json", *more],
                       env=child_env(), capture_output=True, text=True, timeout=90)
    assert "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


def exits(prom, reason):
    r = prom.query('sum(stallscope_loader_worker_exits_total{pod="shm-0",reason="%s"})' % reason)
    return float(r[0]["value"][1]) if r else 0.0


def test_deaths_counted_and_ranked_from_prometheus_as_by_the_agent(tmp_path):
    need_root()
    need_prometheus()
    pytest.importorskip("torch")
    agent = AgentProcess(args=["--node", "n1", "--exporter.interval", "1", "--correlate.interval", "2",
                               "--correlate.window", "120"], workdir=str(tmp_path)).start()
    prom = trainer = None
    try:
        prom = PrometheusProcess([agent.url], workdir=str(tmp_path)).start()
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(PLAN))
        log = open(tmp_path / "rank.log", "w")
        env = child_env({"STALLSCOPE_SOCKET": agent.socket, "STALLSCOPE_JOB": "dj", "RANK": "0",
                         "POD_NAME": "shm-0", "POD_NAMESPACE": "ml", "OMP_NUM_THREADS": "1"})
        trainer = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", SHM, "sh",
                                    sys.executable, "-m", "stallscope.lab.trainer", str(plan)],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 150
        while exits(prom, "shm_exhaustion") < 3 and time.monotonic() < deadline:
            assert trainer.poll() is None, (tmp_path / "rank.log").read_text()[-2000:]
            time.sleep(1)
        assert exits(prom, "shm_exhaustion") >= 3, (tmp_path / "rank.log").read_text()[-2000:]

        # frozen: no death after the log is read; the scrapes catch up with the last ones.
        # The trainer logs a death once its exits are read, but the hook's flush thread
        # sends them a moment later: frozen in between (CI, once), the rank is let run a
        # moment more until every logged death is counted.
        for _ in range(5):
            os.killpg(trainer.pid, signal.SIGSTOP)
            time.sleep(4)
            text = (tmp_path / "rank.log").read_text()
            bused = {int(p) for p in BUS.findall(text)}
            restarts = text.count("restarting the loader")
            if exits(prom, "shm_exhaustion") >= len(bused):
                break
            os.killpg(trainer.pid, signal.SIGCONT)
            time.sleep(0.5)
        with_agent = diagnose(prom)
        agent.stop()  # the node's agent gone: Prometheus alone
        alone = diagnose(prom)
    finally:
        if trainer is not None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
        if prom is not None:
            prom.stop()
        agent.stop()

    assert [s["ok"] for s in with_agent["sources"] if s["name"] == "agent"] == [True]
    assert [s["ok"] for s in alone["sources"] if s["name"] == "agent"] in ([], [False])
    assert alone["verdict"] == "input_bound", alone["reason"]
    # the kernel's word: each worker torch saw die of SIGBUS is one counted exit; a second
    # worker may die of it before the loader is restarted (one restart, two deaths), and
    # one may be dying as the rank is frozen (counted, not yet in the log)
    [counted] = [e["count"] for e in alone["worker_exits"] if e["reason"] == "shm_exhaustion"]
    assert len(bused) <= counted <= restarts + len(bused) + 1, (bused, restarts, alone["worker_exits"])
    # one rule: the same cause first on both paths, the same share of the wait within the
    # difference of their grids (the agent's samples every second, a range query's steps)
    top_agent, top_prom = with_agent["causes"][0], alone["causes"][0]
    assert top_agent["cause"] == top_prom["cause"] == "shm_exhaustion", (top_agent, alone["causes"])
    assert abs(top_agent["score"] - top_prom["score"]) < 0.15, (top_agent, top_prom)
    # the deaths' row (after the /dev/shm line's rows when that line scores higher: merge)
    [deaths] = [e for e in top_prom["evidence"] if e["signal"] == "workers_shm_killed"]
    assert deaths["during_stalls"] == counted
