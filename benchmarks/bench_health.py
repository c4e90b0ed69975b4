"""/healthz and /metrics while 50 closed-loop clients of the JSON API keep the agent busy,
at 256 ranks (issue 33: before, /healthz p50 5.45 s and p99 14.6 s, /metrics p99 14.5 s,
so the DaemonSet's liveness probe, 5 s timeout and 3 failures, would restart a healthy
agent under API load).

    .venv/bin/python benchmarks/bench_health.py [--seconds 20] [--ranks 256] [--api-clients 50]

An in-process agent (the real parts, GPU off; bench_http.py's) holds 256 ranks fed with
synthetic reports while its scheduler runs its periodic jobs. A child process (so that
the clients' parsing does not take the agent's GIL) runs the API clients, each on its
own keep-alive connection in a closed loop over /api/v1/ranks, /api/v1/timeline and
/api/v1/diagnosis (a 429 is honoured: the client waits its Retry-After, as a well-behaved
one does, then asks again; with --retry-at-once it asks again at once, as the issue's
probe did); another child process runs one prober asking /healthz every 0.1 s on a fresh
connection (as the kubelet's probe does) and one scraper asking /metrics every second.
Prints p50, p99 and max of each endpoint's answers (the API's 200s), against the goals
of 100 ms p99 for /healthz and 2 s for a rank's diagnosis (issue 50), and what the API
clients got (200, 429).

The server is the agent's: its health responder (agent/healthd.py) holds the listening
socket and answers /healthz from the status the agent's jobs write, handing every other
connection to the agent. ``--compare`` runs the load twice in one sitting, first with
/healthz answered by the agent's HTTP loop thread (no responder, as before issue 50's
last step), then with the responder.
"""
import argparse
import collections
import gc
import http.client
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
GOAL_HEALTH_P99 = 0.100
GOAL_DIAGNOSIS_MAX = 2.0  # a rank's diagnosis answered within 2 s under the load


def clients(port, api_clients, seconds, ranks, at_once=False):
    lat: dict = collections.defaultdict(list)
    codes: collections.Counter = collections.Counter()
    by_endpoint: dict = collections.defaultdict(collections.Counter)
    errors: list = []
    end = time.monotonic() + seconds

    def api(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        paths = ["/api/v1/ranks", "/api/v1/timeline?job=bench&rank=%d&seconds=60" % (i % ranks),
                 "/api/v1/diagnosis?job=bench&rank=%d" % (i % ranks)]
        k = 0
        while time.monotonic() < end:
            path = paths[k % len(paths)]
            k += 1
            t = time.perf_counter()
            try:
                c.request("GET", path)
                r = c.getresponse()
                r.read()
            except (OSError, http.client.HTTPException) as e:
                errors.append(type(e).__name__)
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            name = path.split("?")[0]
            codes[r.status] += 1
            by_endpoint[name][r.status] += 1
            if r.status == 200:
                lat[name].append(time.perf_counter() - t)
            if r.status == 429 and not at_once:
                time.sleep(float(r.getheader("Retry-After", "1")))
        c.close()

    def probe(path, every):
        due = time.monotonic()
        while time.monotonic() < end:
            time.sleep(max(0.0, due - time.monotonic()))
            due += every
            t = time.perf_counter()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c.request("GET", path)
                r = c.getresponse()
                r.read()
                c.close()
            except (OSError, http.client.HTTPException) as e:
                errors.append("%s %s" % (path, type(e).__name__))
                continue
            lat[path].append(time.perf_counter() - t)
            if r.status != 200:
                errors.append("%s status %d" % (path, r.status))
    # the prober and the scraper in a process of their own (api_clients 0), as the kubelet
    # and Prometheus are: among 50 busy client threads, the prober's own wait for its
    # process's GIL was most of what it measured
    pool = [threading.Thread(target=api, args=(i,)) for i in range(api_clients)]
    if not api_clients:
        pool += [threading.Thread(target=probe, args=("/healthz", 0.1)),
                 threading.Thread(target=probe, args=("/metrics", 1.0))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps({"lat": lat, "codes": codes, "by_endpoint": by_endpoint, "errors": errors[:20],
                      "n_errors": len(errors)}))


def summary(name, lat, goal=None, against="p99"):
    lat = sorted(lat)
    if not lat:
        return "  %-18s nothing answered" % name
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    line = "  %-18s %5d answers  p50 %7.1f ms  p99 %7.1f ms  max %7.1f ms" % (
        name, len(lat), p50 * 1e3, p99 * 1e3, lat[-1] * 1e3)
    if goal:
        line += "  %s/goal %.2fx" % (against, (p99 if against == "p99" else lat[-1]) / goal)
    return line


def measure(ranks, api_clients, seconds, at_once=False, front=True):
    """The load above against an in-process agent; {"lat": {endpoint: [seconds]}, "codes",
    "by_endpoint": {endpoint: {status: n}}, "errors", "n_errors"} (tests/agent/test_http_load.py
    runs it small). ``front``: the health responder answers /healthz (as the agent runs);
    without it, the HTTP loop thread does."""
    from bench_http import make_agent, report

    from stallscope.agent.web import http as agent_http

    agent = make_agent(ranks)
    gc.freeze()  # as the agent does once started (agent/main.py)
    stop = threading.Event()

    def feed():  # the ingest's work meanwhile: a rank's report every 10 ms
        r = 0
        while not stop.wait(0.01):
            agent.apply(report(r % ranks, events=10))
            r += 1
    for target in (feed, agent._scheduler):
        threading.Thread(target=target, daemon=True).start()
    server = agent_http.make_server("127.0.0.1:0", agent.parts.render, agent.routes, agent.healthy,
                                    stats=agent.http_stats, front=front)
    agent.server = server  # its jobs write the status the responder answers with
    agent.beat()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cmd = [sys.executable, __file__, "--client", str(server.server_address[1]), "--seconds",
               str(seconds), "--api-clients", str(api_clients), "--ranks", str(ranks)]
        cmd += ["--retry-at-once"] if at_once else []
        probes = subprocess.Popen([*cmd, "--api-clients", "0"], stdout=subprocess.PIPE, text=True)
        child = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        out = json.loads(child.stdout)
        probed = json.loads(probes.communicate(timeout=seconds + 120)[0])
        out["lat"].update(probed["lat"])
        out["errors"] += probed["errors"]
        out["n_errors"] += probed["n_errors"]
    finally:
        stop.set()
        agent.stopping.set()
        server.shutdown()
        server.server_close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--api-clients", type=int, default=50)
    ap.add_argument("--retry-at-once", action="store_true",
                    help="API clients ask again at once after a 429 (a hostile closed loop)")
    ap.add_argument("--compare", action="store_true",
                    help="first without the health responder (the HTTP loop answers /healthz), "
                         "then with it, in one sitting")
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        return clients(a.client, a.api_clients, a.seconds, a.ranks, a.retry_at_once)
    for front in ((False, True) if a.compare else (True,)):
        print("%d ranks, %d closed-loop API clients for %gs (after a 429: %s); /healthz every 0.1 s, "
              "/metrics every 1 s; /healthz answered by %s" % (
                  a.ranks, a.api_clients, a.seconds, "at once" if a.retry_at_once else "Retry-After",
                  "the health responder" if front else "the HTTP loop thread"), flush=True)
        print_result(measure(a.ranks, a.api_clients, a.seconds, a.retry_at_once, front))


def print_result(out):
    print(summary("/healthz", out["lat"].get("/healthz", []), GOAL_HEALTH_P99))
    print(summary("/metrics", out["lat"].get("/metrics", [])))
    for name in ("/api/v1/ranks", "/api/v1/timeline", "/api/v1/diagnosis"):
        got = out.get("by_endpoint", {}).get(name, {})
        goal = GOAL_DIAGNOSIS_MAX if name == "/api/v1/diagnosis" else None
        print(summary(name, out["lat"].get(name, []), goal, "max")
              + "  (%s)" % ", ".join("%s: %d" % kv for kv in sorted(got.items())))
    print("  API answers by status: %s; errors %d %s" % (
        dict(sorted(out["codes"].items())), out["n_errors"], out["errors"][:5]))


if __name__ == "__main__":
    main()
