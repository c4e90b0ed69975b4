"""The agent's HTTP face under a hostile closed loop of API clients (issue 50), small:
benchmarks/bench_health.py's load (an in-process agent fed reports and running its
scheduler; the clients and the prober each in a process of their own) at 16 ranks and
16 clients that ask again at once after a 429, for 6 s.

Before, the loop thread answered each such client's 429s as fast as it asked (hundreds a
second each), and a rank's diagnosis was analysed for each request, so most of them got
429 too: `stallscope diagnose` against a busy agent failed when on-call needed it. Now a
connection answered 429 is not read again before its Retry-After, and while the API is
answering others a rank's diagnosis comes from its latest analysis (http.Made). The
bounds are loose enough for a loaded 2-core CI machine and far from what the code before
did (this test on it, at 20de22b: the diagnosis answered 429 4,292 times and 200 792
times in 6 s). ~8 s."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_health  # noqa: E402

SECONDS = 6.0
CLIENTS = 16


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def test_health_and_a_ranks_diagnosis_are_answered_under_a_hostile_api_load():
    out = bench_health.measure(ranks=16, api_clients=CLIENTS, seconds=SECONDS, at_once=True)
    assert out["n_errors"] == 0, out["errors"]
    diagnosis = out["by_endpoint"]["/api/v1/diagnosis"]
    # every diagnosis asked was answered, within the 2 s goal and a second's slack for a
    # loaded machine (a request that follows a 429 on its connection waits its Retry-After)
    assert diagnosis.get("200", 0) >= CLIENTS and diagnosis.get("429", 0) == 0, diagnosis
    assert max(out["lat"]["/api/v1/diagnosis"]) < 3.0
    # a client that asks again at once is answered one 429 per Retry-After (1 s), not one
    # per request: at most one a second each, with a second's slack
    refused = sum(e.get("429", 0) for e in out["by_endpoint"].values())
    assert refused <= CLIENTS * (SECONDS + 1), out["by_endpoint"]
    # the liveness probe (5 s timeout) is answered far within it
    health = out["lat"]["/healthz"]
    assert len(health) >= SECONDS / 0.1 * 0.8 and quantile(health, 0.99) < 1.0, sorted(health)[-5:]
