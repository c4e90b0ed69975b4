"""The agent's CPU at 8 ranks x 8 real DataLoader workers, this tree against another, in
alternating runs: on a shared VM the same code measures tens of percent apart from one
hour to the next (docs/deploy.md), so a change's effect is a ratio taken in one sitting.

    .venv/bin/python benchmarks/compare_agent.py BASE_TREE [--pairs 3] [--seconds 60]

BASE_TREE is a checkout of the code to compare with (``git worktree add /tmp/base REV``).
Each run is bench_agent.py's real load in a fresh process whose stallscope is that tree's:
an agent with the simulated GPU, 8 trainers of 8 workers at ~100 batches/s each, 45 s to
settle, then ``--seconds`` measured from the agent's own per-thread CPU
(/api/v1/agent) while /metrics is scraped every 15 s, as deployed. The order alternates
pair by pair; printed: each run with its largest threads, each tree's mean, and this
tree's over the base's.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside the tree measured: only what every tree has (the agent's process wrapper,
# the hook's environment, /api/v1/agent), so an older checkout runs it too.
RUN = r"""
import json, os, subprocess, sys, tempfile, time, urllib.request
from stallscope.processes.children import child_env
from stallscope.processes.servers import AgentProcess
TRAINER = '''
import sys, time, torch, stallscope
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.zeros(4)
loader = stallscope.watch(torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=8,
                                                      persistent_workers=True, prefetch_factor=4))
for batch in loader:
    time.sleep(0.002)
'''
def agent_json(agent):
    with urllib.request.urlopen(agent.url + "/api/v1/agent", timeout=30) as r:
        return json.loads(r.read())
seconds = float(sys.argv[1])
agent = AgentProcess(args=["--gpu.simulated", "--no-gpu.nvml"], workdir=tempfile.mkdtemp()).start()
procs = []
try:
    for r in range(8):
        env = child_env({"STALLSCOPE_SOCKET": agent.socket, "STALLSCOPE_JOB": "bench", "RANK": str(r),
                         "POD_NAME": "bench-%d" % r, "POD_NAMESPACE": "bench", "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, "-c", TRAINER], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(45)  # past the young stalls' re-ranking (bench_agent.py ONSET_S)
    t0, a = time.monotonic(), agent_json(agent)
    while time.monotonic() - t0 < seconds - 0.05:  # scraped as deployed (podmonitor.yaml): 15 s
        time.sleep(max(0.0, min(15.0, seconds - (time.monotonic() - t0))))
        if time.monotonic() - t0 < seconds - 0.05:
            urllib.request.urlopen(agent.url + "/metrics", timeout=30).read()
    b, span = agent_json(agent), time.monotonic() - t0
    before = {(t["name"], t["native_id"]): t["cpu_seconds"] for t in a["threads"]}
    split = {}
    for t in b["threads"]:
        d = t["cpu_seconds"] - before.get((t["name"], t["native_id"]), 0.0)
        if d > 0:
            name = t["name"].replace("stallscope-", "")
            split[name] = split.get(name, 0.0) + 100 * d / span
    print(json.dumps({"cpu": 100 * (b["cpu_seconds"] - a["cpu_seconds"]) / span, "split": split}))
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    agent.stop()
"""


def run(tree, seconds):
    """One run in ``tree``: {"cpu": % of a core, "split": {thread: %}}."""
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", RUN, str(seconds)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=seconds + 300)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise SystemExit("compare_agent: the run in %s failed: %s" % (tree, out.stderr.strip()[-400:]))
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", help="a checkout of the code to compare with")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    base = os.path.abspath(args.base)
    if not os.path.isdir(os.path.join(base, "stallscope")):
        raise SystemExit("compare_agent: %s holds no stallscope package" % base)
    trees = {"base": base, "this": ROOT}
    cpu = {"base": [], "this": []}
    for i in range(args.pairs):
        for name in ("base", "this") if i % 2 == 0 else ("this", "base"):
            got = run(trees[name], args.seconds)
            cpu[name].append(got["cpu"])
            top = sorted(got["split"].items(), key=lambda kv: -kv[1])[:5]
            print("%-4s %5.2f %% of a core   %s" % (name, got["cpu"], ", ".join(
                "%s %.2f" % kv for kv in top)), flush=True)
    means = {k: sum(v) / len(v) for k, v in cpu.items()}
    print("mean: base %.2f %%, this %.2f %% of a core (%s); this / base %.2f"
          % (means["base"], means["this"], base, means["this"] / means["base"]))


if __name__ == "__main__":
    main()
