"""How long the correlator takes for one hour of 10 Hz timelines on 8 ranks.

    .venv/bin/python benchmarks/bench_correlate.py

Each rank: 36,000 batch events (a loader one third too slow, so every analysis step
runs: verdict, period, sawtooth, all cause scores), 36,000 simulated-GPU samples at
10 Hz, and 16 signals at the exporters' 2 s interval (12 rank-scoped, 4 node-wide).
Prints, best of 5, against the 200 ms budget of issue 6: the pure analysis (traces
already as arrays), and the agent's run (the correlator part reading the rank table's
timelines and the sample store's windows, which are kept as numpy rings, so nothing is
converted, into traces, then the analysis), with the share of that spent building the
traces.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.correlate import diagnosis
from stallscope.correlate.trace import RankTrace
from stallscope.host.report import HookReport
from stallscope.lab import synth

RANKS, HOUR, BUDGET_S = 8, 3600.0, 0.200
RANK_SIGNALS = ("cfs_throttled_ratio", "cfs_throttled_seconds_rate", "psi_io_some_ratio",
                "psi_memory_some_ratio", "shm_used_ratio", "fuse_up", "fuse_probe_seconds",
                "workers_dstate", "workers_cpu_ratio", "batch_load_seconds",
                "shard_read_seconds", "cache_miss_ratio")
NODE_SIGNALS = ("psi_io_some_ratio", "psi_io_full_ratio", "psi_memory_some_ratio",
                "disk_write_bytes_rate")


def make_rank(rank, t0):
    rng = np.random.default_rng(rank)
    j = synth.jitter(rng, 0.05)
    n = int(HOUR / 0.1)
    ev, ph = synth.simulate(n, 4, lambda k, t: j(0.4), lambda k, t: j(0.07), t0=t0)
    start, end = synth.span_of(ev)
    sig = {s: synth.sampled(lambda t: float(rng.random()), start, end) for s in RANK_SIGNALS}
    sig["gpu_busy_ratio"] = synth.gpu_samples(ph, start, end)
    node = {s: synth.sampled(lambda t: float(rng.random()), start, end) for s in NODE_SIGNALS}
    return ev, sig, node


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    t0 = time.monotonic_ns() - int((HOUR + 5) * 1e9)
    data = [make_rank(r, t0) for r in range(RANKS)]
    n_events = sum(len(ev) for ev, _, _ in data)
    # 1. pure analysis over arrays
    traces = [RankTrace.from_timeline(synth.body(ev, rank=r, job="bench", workers=4, signals=sig,
                                                 node_signals=node))
              for r, (ev, sig, node) in enumerate(data)]
    window = HOUR + 60  # the arguments the agent's correlator part passes
    verdicts = [diagnosis.analyse(t, traces, node="bench", window_seconds=window).verdict
                for t in traces]
    pure = best_of(lambda: [diagnosis.analyse(t, traces, node="bench", window_seconds=window)
                            for t in traces])
    # 2. the agent's path: rank table + sample store -> traces -> analysis. The rings are
    # sized from --timeline-seconds (agent/table/budget.py): an hour and a minute holds it all.
    agent = Agent(Config(agent=AgentOptions(socket="/nonexistent/bench.sock", node="bench",
                                            timeline_seconds=window)))
    for r, (ev, sig, _node) in enumerate(data):
        rank = agent.table.apply(HookReport.of({
            "id": {"job": "bench", "rank": r, "local_rank": r, "world_size": RANKS,
                   "pod": "bench-%d" % r, "namespace": "ns", "node": "bench"},
            "role": "main", "pid": 0, "mono_ns": 0, "wall_ns": 0, "dropped_total": 0, "events": ev, "raw": {},
            "loader": {"num_workers": 4, "prefetch_factor": 2, "batch_size": 32, "pin_memory": True,
                       "persistent_workers": True, "worker_pids": []}}))
        for name, pts in sig.items():
            t, v = zip(*pts)
            agent.samples.record_many(rank.key, name, t, v)
    for name, pts in data[0][2].items():
        t, v = zip(*pts)
        agent.samples.record_many("node", name, t, v)
    ranks = agent.table.snapshot()
    kept = sum(len(agent.table.timeline(r, window)) for r in ranks)
    stored = sum(len(agent.samples.window(r.key, name, window)[0]) for r in ranks for name in RANK_SIGNALS
                 + ("gpu_busy_ratio",))
    given = sum(len(p) for _, sig, _ in data for p in sig.values())
    assert (kept, stored) == (n_events, given), (kept, n_events, stored, given)  # nothing cut
    corr = agent.correlator
    via_agent = best_of(lambda: corr.analyse(ranks, window))
    node = corr._scope("node", window)
    traces_t = best_of(lambda: [corr.trace(r, window, node) for r in ranks])
    agent_verdicts = [d.verdict for d in corr.analyse(ranks, window).values()]
    print("correlator: %d ranks x 1 h at 10 Hz (%d batch events, %d GPU samples, %d signal samples)"
          % (RANKS, n_events, sum(len(s["gpu_busy_ratio"]) for _, s, _ in data),
             sum(len(p) for _, s, node in data for k, p in s.items() if k != "gpu_busy_ratio")
             + sum(len(p) for p in data[0][2].values())))
    print("  verdicts: %s (arrays), %s (agent)" % (", ".join(sorted(set(verdicts))),
                                                  ", ".join(sorted(set(agent_verdicts)))))
    print("  analysis (arrays in hand):                 %7.1f ms  = %.2f x the %d ms budget" % (
        pure * 1e3, pure / BUDGET_S, BUDGET_S * 1e3))
    print("  agent run (store -> traces -> analysis):   %7.1f ms  = %.2f x the budget" % (
        via_agent * 1e3, via_agent / BUDGET_S))
    print("    of which building the traces:            %7.1f ms  = %.2f of the run" % (
        traces_t * 1e3, traces_t / via_agent))
    print("  per rank (agent run):                      %7.1f ms" % (via_agent * 1e3 / RANKS))
    print("  within the 200 ms budget: %s" % ("yes" if max(pure, via_agent) <= BUDGET_S else "NO"))


if __name__ == "__main__":
    main()
