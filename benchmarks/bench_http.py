"""/metrics under 50 concurrent scrapers at 256 ranks: the agent's bounded server with
single-flight renders and its own exposition, against the former ThreadingHTTPServer
rendering with generate_latest for every scrape (kept here as the baseline).

    .venv/bin/python benchmarks/bench_http.py [--seconds 10] [--interval 0] [--no-baseline] [--no-jobs]

An in-process agent (the real parts, GPU off) holds 256 ranks (--ranks) fed with
synthetic reports; while it is scraped a feeder keeps applying reports (one rank every
10 ms) and the agent's scheduler runs its periodic jobs, as in a live agent (--no-jobs:
without them; at 256 ranks the correlator's tick holds the GIL ~100 ms a second, and it
waits between ranks while a render runs: agent/web/scrapefirst.py). The
scrapers (--scrapers 50) run in a child process, so that their parsing does not take
the agent's GIL, each on a keep-alive connection, in a closed loop (--interval: one
scrape every so many seconds). Prints one render's time with each renderer, then p50,
p99 and max scrape latency and p99 against the 250 ms goal, for each server. (Both
renderers collect through the same parts, so the baseline has the faster histograms.)
"""
import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
GOAL_P99 = 0.250


def report(rank, events=100):
    """A trainer's report as the agent's validation makes it (HookReport)."""
    from stallscope.host.report import HookReport

    now = time.monotonic_ns()
    return HookReport.of({"v": 1, "kind": "report", "role": "main", "pid": 1000 + rank, "mono_ns": now,
            "wall_ns": time.time_ns(), "dropped_total": 0, "raw": {},
            "id": {"job": "bench", "rank": rank, "local_rank": rank % 8, "world_size": 256,
                   "pod": "bench-%d" % (rank // 8), "namespace": "bench", "node": ""},
            "loader": {"num_workers": 4, "prefetch_factor": 2, "pin_memory": False,
                       "persistent_workers": True, "batch_size": 8, "worker_pids": []},
            "events": [[now - (events - i) * 10**7, 10**6 * (i % 7), 10**7] for i in range(events)]})


def make_agent(ranks):
    from stallscope.agent.main import Agent, AgentOptions, Config
    agent = Agent(Config(agent=AgentOptions(socket="/nonexistent/bench.sock", max_ranks=ranks),
                         enabled={"gpu": False}))
    for r in range(ranks):
        agent.apply(report(r))
    for _period, job in agent.jobs:
        job()
    return agent


def old_render(parts):
    """The former Parts.render: generate_latest part by part."""
    from prometheus_client import generate_latest

    class One:
        def __init__(self, c):
            self.collect = c.collect
    return b"".join(generate_latest(One(c)) for c in parts.collectors() + [parts])


def old_server(render):
    """The former server: a thread per connection, a render per scrape."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            data = render()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def time_render(fn, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2]


def scrape_clients(port, scrapers, seconds, interval):
    """The child process: ``scrapers`` keep-alive scrapers, in a closed loop or each
    starting a scrape every ``interval`` seconds (at a random phase)."""
    lat, errors = [], []
    start = threading.Barrier(scrapers)

    def one(phase):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        start.wait()
        end = time.monotonic() + seconds
        due = time.monotonic() + phase
        while time.monotonic() < end:
            if interval:
                time.sleep(max(0.0, due - time.monotonic()))
                due += interval
            t = time.perf_counter()
            try:
                c.request("GET", "/metrics")
                r = c.getresponse()
                body = r.read()
            except (OSError, http.client.HTTPException) as e:
                errors.append(type(e).__name__)
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            lat.append(time.perf_counter() - t)
            if r.status != 200 or not body.endswith(b"\n"):
                errors.append("status %d" % r.status)
        c.close()
    pool = [threading.Thread(target=one, args=(random.uniform(0, interval),)) for _ in range(scrapers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps({"lat": lat, "errors": errors[:20], "n_errors": len(errors)}))


def measure(name, server, scrapers, seconds, interval):
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    port = server.server_address[1]
    cmd = [sys.executable, __file__, "--client", str(port), "--scrapers", str(scrapers),
           "--seconds", str(seconds), "--interval", str(interval)]
    child = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    server.shutdown()
    server.server_close()
    out = json.loads(child.stdout)
    lat = sorted(out["lat"])
    if not lat:
        print("  %-34s no scrape answered; errors: %s" % (name, out["errors"]))
        return
    p50, p99, top = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], lat[-1]
    print("  %-34s %5d scrapes  p50 %6.0f ms  p99 %6.0f ms  max %6.0f ms  p99/goal %.2fx  errors %d"
          % (name, len(lat), p50 * 1e3, p99 * 1e3, top * 1e3, p99 / GOAL_P99, out["n_errors"]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--interval", type=float, default=0.0,
                    help="seconds between one scraper's scrapes (0: a closed loop)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--no-jobs", action="store_true", help="without the agent's periodic jobs")
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        return scrape_clients(a.client, a.scrapers, a.seconds, a.interval)
    from stallscope.agent.web import http as agent_http
    from stallscope.agent.web.httppool import Stats

    agent = make_agent(a.ranks)
    body = agent.parts.render()
    print("%d ranks: /metrics is %d lines, %d KiB" % (a.ranks, body.count(b"\n"), len(body) >> 10))
    old, new = time_render(lambda: old_render(agent.parts)), time_render(agent.parts.render)
    print("  one render, generate_latest part by part %6.0f ms" % (old * 1e3))
    print("  one render, the agent's Exposition       %6.0f ms  (%.2fx)" % (new * 1e3, new / old))
    stop = threading.Event()

    def feed():  # the ingest's work while scrapes run: a rank's report every 10 ms
        r = 0
        while not stop.wait(0.01):
            agent.apply(report(r % a.ranks, events=10))
            r += 1
    for target in (feed,) if a.no_jobs else (feed, agent._scheduler):
        threading.Thread(target=target, daemon=True).start()
    print("%d scrapers %s for %gs each (goal: p99 < %d ms):" % (
        a.scrapers, "every %gs" % a.interval if a.interval else "in a closed loop", a.seconds,
        GOAL_P99 * 1e3), flush=True)
    try:
        renders = [0]

        def render():
            renders[0] += 1
            return agent.parts.render()
        stats = Stats()
        server = agent_http.make_server("127.0.0.1:0", render, agent.routes, agent.healthy, stats=stats)
        measure("bounded server, single-flight", server, a.scrapers, a.seconds, a.interval)
        print("    %d renders shared by the scrapes; %d requests answered 2xx" % (
            renders[0], stats.requests["2xx"]), flush=True)
        if not a.no_baseline:
            measure("ThreadingHTTPServer + generate_latest", old_server(lambda: old_render(agent.parts)),
                    a.scrapers, a.seconds, a.interval)
    finally:
        stop.set()
        agent.stopping.set()


if __name__ == "__main__":
    main()
