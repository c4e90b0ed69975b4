#!/usr/bin/env python3
"""Record a labelled trace for the correlator's evaluation set from a real run.

    .venv/bin/python scripts/record_trace.py SCENARIO [--seconds 45] [--out FILE]
    .venv/bin/python scripts/record_trace.py --list

Starts a real stallscope agent, runs a real DataLoader training loop (this file with
``--trainer``) with the scenario's injected fault, waits, and saves the agent's
``GET /api/v1/timeline`` answers for the diagnosed rank and its peers on the node,
with the scenario's labels, to ``tests/data/traces/real-<scenario>.json`` (format:
tests/data/traces/README.md). The cpu_throttle scenario needs root and a cgroup v1
``cpu`` controller: the loader workers join a cgroup with a CFS quota.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TRACES = os.path.join(ROOT, "tests", "data", "traces")

# name: (expected verdict, expected top cause, target rank, [trainer args per rank], note)
SCENARIOS = {
    # On a busy 2-core machine, taking even a prefetched batch costs 1-5 ms (IPC and
    # scheduling): 200 ms steps keep that well under the 2% verdict threshold.
    "healthy": ("healthy", None, 0, [["--workers", "2", "--sample-sleep", "0.005",
                                      "--compute", "0.2"]],
                "2 workers, 5 ms per sample (20 ms per batch), 200 ms compute: the loader "
                "keeps well ahead."),
    "compute_bound": ("healthy", None, 0, [["--workers", "2", "--sample-sleep", "0.001",
                                            "--compute", "0.3"]],
                      "Slow compute (300 ms), fast loader: no data-wait."),
    "too_few_workers_sleep": ("input_bound", "too_few_workers", 0, [[
        "--workers", "2", "--sample-sleep", "0.04", "--batch-size", "8", "--compute", "0.05"]],
        "2 workers, 320 ms per batch (per-sample sleep) vs 50 ms compute."),
    "too_few_workers_3": ("input_bound", "too_few_workers", 0, [[
        "--workers", "3", "--sample-sleep", "0.03", "--batch-size", "8", "--compute", "0.04"]],
        "3 workers, 240 ms per batch (per-sample sleep): one batch every 80 ms vs 40 ms compute."),
    "cpu_crowded": ("input_bound", "cpu_throttle", 0, [[
        "--workers", "2", "--sample-cpu", "0.01", "--batch-size", "8", "--compute", "0.05",
        "--hogs", "3"]],
        "2 workers with 80 ms of CPU per batch would keep up with 50 ms of compute, but three "
        "busy loops crowd the node's CPUs: the workers are runnable, not running."),
    "cpu_throttle": ("input_bound", "cpu_throttle", 0, [[
        "--workers", "4", "--sample-cpu", "0.004", "--batch-size", "8", "--compute", "0.05",
        "--worker-cgroup", "QUOTA:0.1"]],
        "4 workers at 32 ms CPU per batch would keep up, but their cgroup has a 0.1-CPU quota."),
    "straggler_peer": ("not_input_bound", None, 1, [
        ["--workers", "2", "--sample-sleep", "0.04", "--batch-size", "8", "--compute", "0.05",
         "--dist", "2", "--rank", "0"],
        ["--workers", "4", "--sample-sleep", "0.001", "--batch-size", "8", "--compute", "0.05",
         "--dist", "2", "--rank", "1"]],
        "Two ranks in a gloo all_reduce per step; rank 0's loader is slow, rank 1 (diagnosed) "
        "waits for it in the collective."),
}


# ----------------------------------------------------------------------------- trainer
def trainer(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-sleep", type=float, default=0.0)
    p.add_argument("--sample-cpu", type=float, default=0.0)
    p.add_argument("--compute", type=float, default=0.05)
    p.add_argument("--duration", type=float, default=45.0)
    p.add_argument("--worker-cgroup", default="")
    p.add_argument("--dist", type=int, default=0)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--job", default="eval")
    p.add_argument("--hogs", type=int, default=0, help="busy loops crowding the CPUs")
    a = p.parse_args(argv)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.hogs)]
    import torch
    from torch.utils.data import DataLoader, Dataset

    import stallscope

    class Work(Dataset):
        def __len__(self):
            return 10 ** 6

        def __getitem__(self, i):
            if a.sample_sleep:
                time.sleep(a.sample_sleep)
            if a.sample_cpu:
                end = time.thread_time() + a.sample_cpu
                x = 0
                while time.thread_time() < end:
                    x += 1
            return torch.full((16,), float(i))

    if a.dist:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port,
                                rank=a.rank, world_size=a.dist)
    loader = stallscope.watch(DataLoader(Work(), batch_size=a.batch_size, num_workers=a.workers,
                                         persistent_workers=a.workers > 0),
                              rank=a.rank, world_size=max(1, a.dist), job=a.job)
    it = iter(loader)
    if a.worker_cgroup:
        for w in it._workers:
            with open(os.path.join(a.worker_cgroup, "cgroup.procs"), "w") as f:
                f.write(str(w.pid))
    end = time.monotonic() + a.duration
    acc = torch.zeros(16)
    for batch in it:
        time.sleep(a.compute)  # the "GPU step": the CPU waits, as on a CUDA sync
        acc += batch.sum(0)
        if a.dist:
            import torch.distributed as dist
            dist.all_reduce(acc)
        if time.monotonic() > end:
            break
    for h in hogs:
        h.kill()
        h.wait()
    time.sleep(1.0)  # let the hook flush


# ----------------------------------------------------------------------------- recorder
def make_cgroup(quota):
    base = "/sys/fs/cgroup/cpu"
    path = os.path.join(base, "stallscope-record-%d" % os.getpid())
    os.mkdir(path)
    with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
        f.write("100000")
    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(int(quota * 100000)))
    return path


def record(name, seconds, out):
    from stallscope.lab.procs import AgentProcess

    verdict, cause, target, ranks, note = SCENARIOS[name]
    # The simulated GPU (busy while the loop computes) stands in for NVML on machines
    # without one; its samples carry source "simulated" in the trace.
    agent = AgentProcess(args=["--node", "recorder", "--gpu.simulated"]).start()
    procs, cgroup = [], None
    try:
        env = dict(os.environ, STALLSCOPE_SOCKET=agent.socket, PYTHONPATH=ROOT)
        port = 29500 + os.getpid() % 1000
        for args in ranks:
            args = list(args)
            if "--worker-cgroup" in args:
                i = args.index("--worker-cgroup") + 1
                cgroup = make_cgroup(float(args[i].split(":")[1]))
                args[i] = cgroup
            cmd = [sys.executable, os.path.abspath(__file__), "--trainer", "--duration",
                   str(seconds + 8), "--port", str(port)] + args
            procs.append(subprocess.Popen(cmd, env=env))
        time.sleep(seconds + 4)
        bodies = {}
        for r in range(len(ranks)):
            q = urllib.parse.urlencode({"rank": r, "job": "eval", "seconds": seconds})
            bodies[r] = agent.api("/api/v1/timeline?" + q)
        diag = agent.api("/api/v1/diagnosis?rank=%d&job=eval&seconds=%d" % (target, seconds))
    finally:
        for pr in procs:
            try:
                pr.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait()
        agent.stop()
        if cgroup:
            os.rmdir(cgroup)
    doc = {"format": "stallscope-trace/1",
           "labels": {"scenario": name, "expected_verdict": verdict, "expected_cause": cause,
                      "source": "recorded", "note": note},
           "recorded": {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "kernel": platform.release(), "seconds": seconds,
                        "command": "scripts/record_trace.py %s --seconds %d" % (name, seconds),
                        "agent_verdict": diag.get("verdict"),
                        "agent_top_cause": (diag.get("causes") or [{}])[0].get("cause")},
           "timeline": bodies[target],
           "peers": [b for r, b in sorted(bodies.items()) if r != target]}
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print("%s: %d batches, agent says %s / %s -> %s" % (
        name, len(bodies[target]["batches"]), doc["recorded"]["agent_verdict"],
        doc["recorded"]["agent_top_cause"], out))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--trainer":
        return trainer(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", nargs="?", choices=sorted(SCENARIOS))
    p.add_argument("--seconds", type=int, default=45)
    p.add_argument("--out")
    p.add_argument("--list", action="store_true")
    a = p.parse_args()
    if a.list or not a.scenario:
        for n, (v, c, _t, _r, note) in sorted(SCENARIOS.items()):
            print("%-24s %-16s %-16s %s" % (n, v, c or "-", note))
        return
    record(a.scenario, a.seconds, a.out or os.path.join(TRACES, "real-%s.json" % a.scenario))


if __name__ == "__main__":
    main()
