"""``stallscope diagnose`` on a 2,048-rank job: seconds from the call to the report.

A real Prometheus scrapes (every second) a test exporter serving 2,047 ranks' series,
the spine's 23 per rank (data-wait and step histograms, loader info, drops) and 256
nodes' agent build_info, plus one real agent on node-0167 fed by a real DataLoader run
as rank 1337, slowed (its workers sleep 90 ms per sample). diagnose is then timed on
that rank's pod (cluster view over all 2,048 ranks + node detail from its agent) and on
a healthy synthetic pod (whose "agent" answers 404: the degraded path). Predictions are
on (issue 17): the slowed pod's report must carry the agent's prediction (its change and
predicted step), the headroom and the cost, all inside the timed call.

    .venv/bin/python benchmarks/bench_diagnose.py [--quick]

The default window is 60 s (60 samples a series, as 15m at a 15 s scrape interval), after
a full window of steady state: about 80 s in all. ``--quick`` (what ``make bench`` runs)
uses a 20 s window and 3 runs each: about 40 s, with fewer samples a query.
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from stallscope import diagnose  # noqa: E402
from stallscope.agent.table.rankstate import STEP_BUCKETS, WAIT_BUCKETS  # noqa: E402
from stallscope.processes.children import child_env  # noqa: E402
from stallscope.processes.servers import AgentProcess, PrometheusProcess  # noqa: E402

RANKS, PER_NODE, REAL = 2048, 8, 1337
JOB, NS = "big", "ml"
WINDOW_S = 60       # 60 samples a series: as 15m at a 15s scrape interval (--quick: 20)
STEP = 0.2          # seconds per synthetic step
LIMIT = 5.0
ROUNDS = 5


def ratio(rank):
    """Synthetic data-wait ratios: 0.4-0.6 % for most, three ranks at 3 %."""
    return 0.03 if rank in (11, 600, 1900) else 0.004 + 0.002 * ((rank * 7919) % 100) / 100


class Exporter:
    def __init__(self):
        self.t0 = time.monotonic() - 60  # counters as if the job had run a minute already
        self.ranks = []
        for r in range(RANKS):
            if r == REAL:
                continue
            labels = 'job="%s",rank="%d",pod="%s-%d",namespace="%s",node="node-%04d"' % (
                JOB, r, JOB, r, NS, r // PER_NODE)
            self.ranks.append((labels, ratio(r)))
        self.nodes = sorted({r // PER_NODE for r in range(RANKS)} - {REAL // PER_NODE})

    def text(self):
        n = int((time.monotonic() - self.t0) / STEP)
        step_sum = n * STEP
        out = []
        for labels, rt in self.ranks:
            wait_each = rt * STEP
            acc = 0
            for b in WAIT_BUCKETS:
                acc = n if b >= wait_each else 0
                out.append('stallscope_data_wait_seconds_bucket{%s,le="%r"} %d' % (labels, b, acc))
            out.append('stallscope_data_wait_seconds_bucket{%s,le="+Inf"} %d' % (labels, n))
            out.append("stallscope_data_wait_seconds_count{%s} %d" % (labels, n))
            out.append("stallscope_data_wait_seconds_sum{%s} %.6f" % (labels, rt * step_sum))
            for b in STEP_BUCKETS:
                out.append('stallscope_step_seconds_bucket{%s,le="%r"} %d'
                           % (labels, b, n if b >= STEP else 0))
            out.append('stallscope_step_seconds_bucket{%s,le="+Inf"} %d' % (labels, n))
            out.append("stallscope_step_seconds_count{%s} %d" % (labels, n))
            out.append("stallscope_step_seconds_sum{%s} %.6f" % (labels, step_sum))
            out.append('stallscope_loader_info{%s,num_workers="4",prefetch_factor="2",pin_memory="true",'
                       'persistent_workers="true",batch_size="32"} 1' % labels)
            out.append("stallscope_hook_dropped_events_total{%s} 0" % labels)
        for node in self.nodes:
            out.append('stallscope_agent_build_info{version="0.1.0",node="node-%04d"} 1' % node)
        return ("\n".join(out) + "\n").encode()

    def serve(self):
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path == "/metrics":
                    body, status, ctype = exporter.text(), 200, "text/plain; version=0.0.4"
                else:
                    body, status, ctype = b'{"error": "not an agent"}', 404, "application/json"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return "127.0.0.1:%d" % self.server.server_address[1]


def timed(pod, prom_url, window, rounds):
    times, doc = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        doc = diagnose.encode(diagnose.run(pod, namespace=NS, prometheus_url=prom_url, window=window))
        times.append(time.perf_counter() - t)
    return doc, times


def agent_request(url, pod, rounds):
    """Seconds of the node agent's /api/v1/diagnosis alone: the node detail, where the
    correlator and its predictions run (on the request)."""
    import urllib.request
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        with urllib.request.urlopen("%s/api/v1/diagnosis?pod=%s&namespace=%s" % (url, pod, NS),
                                    timeout=30) as r:
            assert r.status == 200 and b'"prediction"' in r.read()
        times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a 20 s window and 3 runs each (~40 s)")
    args = ap.parse_args()
    window_s, rounds = (20, 3) if args.quick else (WINDOW_S, ROUNDS)
    window = "%ds" % window_s
    exporter = Exporter()
    target = exporter.serve()
    t = time.perf_counter()
    lines = exporter.text().count(b"\n")
    gen = time.perf_counter() - t
    agent = AgentProcess(args=["--node", "node-%04d" % (REAL // PER_NODE)]).start()
    prom = PrometheusProcess([target, agent.url]).start()
    env = child_env({"STALLSCOPE_SOCKET": agent.socket, "STALLSCOPE_JOB": JOB, "RANK": str(REAL),
                     "POD_NAME": "%s-%d" % (JOB, REAL), "POD_NAMESPACE": NS})
    script = os.path.join(ROOT, "tests", "helpers", "trainers", "simple_trainer.py")
    trainer = subprocess.Popen([sys.executable, script,
                                "--duration", "120", "--batch-size", "4", "--workers", "2",
                                "--compute", "0.15", "--samples", "4000", "--sample-sleep", "0.09"], env=env)
    try:
        sli = diagnose.cluster.sli(window, job=JOB)
        prom.wait_for("count(%s)" % sli, lambda r: r and float(r[0]["value"][1]) == RANKS, timeout=120)
        time.sleep(window_s + 2)  # a full window of steady state for every rank
        slow, slow_t = timed("%s-%d" % (JOB, REAL), prom.url, window, rounds)
        ok, ok_t = timed("%s-42" % JOB, prom.url, window, rounds)
        agent_t = agent_request(agent.url, "%s-%d" % (JOB, REAL), rounds)
        t = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", "%s-%d" % (JOB, REAL),
                              "-n", NS, "--prometheus", prom.url, "--window", window],
                             env=child_env(), capture_output=True, text=True)
        cli_t = time.perf_counter() - t
    finally:
        trainer.kill()
        trainer.wait()
        prom.stop()
        agent.stop()
    assert slow["straggler"]["rank"] == REAL and slow["verdict"] == "input_bound", slow["reason"]
    assert slow["job_ranks"] == RANKS and ok["verdict"] == "not_input_bound", ok["reason"]
    pred = slow.get("prediction") or {}
    assert pred.get("predicted_step_seconds") and slow.get("cost"), "no prediction or cost in the report"
    worst = max(slow_t + ok_t)
    print("bench_diagnose: job of %d ranks (%d series scraped every second, exposition built in %.0f ms), "
          "window %s" % (RANKS, lines + 23, 1000 * gen, window))
    print("  slowed pod %s-%d (cluster view + its real agent): median %.3f s, max %.3f s over %d runs; "
          "verdict %s, straggler rank %s (%.1f%%), job median %.2f%%"
          % (JOB, REAL, statistics.median(slow_t), max(slow_t), rounds, slow["verdict"],
             slow["straggler"]["rank"], 100 * slow["data_wait_ratio"],
             100 * slow["job_median_data_wait_ratio"]))
    print("  of which the agent's /api/v1/diagnosis (correlator + predictions): median %.3f s (%.0f%% of "
          "the slowed pod's median)" % (statistics.median(agent_t),
                                        100 * statistics.median(agent_t) / statistics.median(slow_t)))
    print("  prediction (in the timed call): %s -> step %.3fs, data-wait %.1f%%; "
          "job cost %.1f GPU-hours a day"
          % (pred["change"], pred["predicted_step_seconds"], 100 * pred["predicted_data_wait_ratio"],
             slow["cost"]["gpu_hours_per_day"]))
    print("  healthy pod %s-42 (its agent answers 404: degraded):   median %.3f s, max %.3f s; verdict %s"
          % (JOB, statistics.median(ok_t), max(ok_t), ok["verdict"]))
    print("  CLI, wall time incl. interpreter start: %.3f s (exit %d)" % (cli_t, cli.returncode))
    print("  limit %.1f s: worst in-process %.3f s = %.1f%% of it; CLI %.1f%% -> %s"
          % (LIMIT, worst, 100 * worst / LIMIT, 100 * cli_t / LIMIT,
             "OK" if max(worst, cli_t) <= LIMIT else "OVER"))
    return 0 if max(worst, cli_t) <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
