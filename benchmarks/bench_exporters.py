"""CPU cost of one full exporter collection cycle (the default node exporters: cfs, psi,
shm, fuse, workers, disk, sched) for 8 ranks x 8 loader workers, all real processes; and
of one /metrics render of the result.

The exporters and their runner are built as the agent's composition root builds them
(``exporters.build`` over an ``AgentHost``), with the gpu exporter switched off: its
samplers run in threads of their own, whose cost benchmarks/bench_gpu.py measures.

    .venv/bin/python benchmarks/bench_exporters.py

As root, each rank's processes go into their own v1 cpu cgroup with a quota (the
cfs exporter then reads real counters) and one slowfs FUSE mount is probed each
cycle; elsewhere those parts are skipped and the figure says so.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client import CollectorRegistry, generate_latest

from stallscope import exporters
from stallscope.agent import malloc
from stallscope.agent.host import AgentHost
from stallscope.agent.table import samples, state
from stallscope.host.report import HookReport

RANKS, WORKERS, CYCLES = 8, 8, 30
BUDGET_MS = 20.0
CPU_V1 = "/sys/fs/cgroup/cpu"


def message(pid, workers, rank):
    return HookReport.of({"id": {"job": "bench", "rank": rank, "local_rank": rank, "world_size": RANKS,
                   "pod": "pod-bench", "namespace": "ml", "node": "n1"},
            "pid": pid, "role": "main", "mono_ns": 0, "wall_ns": 0, "dropped_total": 0,
            "events": [], "raw": {},
            "loader": {"num_workers": len(workers), "prefetch_factor": 2, "batch_size": 32,
                       "pin_memory": True, "persistent_workers": True, "worker_pids": workers}})


def setup(procs, cgroups_made, fs):
    table = state.RankTable(node="n1")
    use_cgroups = os.geteuid() == 0 and os.access(CPU_V1, os.W_OK)
    start = fs.popen if fs else subprocess.Popen  # the ranks' mains see the FUSE mount, as in a pod
    for r in range(RANKS):
        group = [start(["sleep", "600"])]
        group += [subprocess.Popen(["sleep", "600"]) for _ in range(WORKERS)]
        procs.extend(group)
        if use_cgroups:
            d = os.path.join(CPU_V1, "stallscope-bench-%d-%d" % (os.getpid(), r))
            os.mkdir(d)
            cgroups_made.append(d)
            with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                f.write("400000")
            for p in group:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(p.pid))
        table.apply(message(group[0].pid, [p.pid for p in group[1:]], r))
    return table, use_cgroups


def main():
    malloc.tune()  # the agent's allocator settings (agent/malloc.py): the reads pay them too
    procs, made, fs = [], [], None
    try:
        if os.geteuid() == 0 and os.path.exists("/dev/fuse") and shutil.which("fusermount3"):
            from stallscope.lab.slowfs import SlowFS
            fs = SlowFS(tempfile.mkdtemp(prefix="stallscope-bench-"), private=True).start()
        table, use_cgroups = setup(procs, made, fs)
        host = AgentHost(table, samples.SampleStore(900))
        _, run = exporters.build(host, {"gpu": False}, {})
        registry = CollectorRegistry(auto_describe=False)
        registry.register(run)
        for _ in range(2):  # warm: psutil handles, first rate readings
            run.collect_now()
        per = {s.name: 0.0 for s in run.slots}
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(CYCLES):
            for slot in run.slots:
                t = time.thread_time()
                run.run_once(slot)
                per[slot.name] += time.thread_time() - t
        cpu_ms = (time.process_time() - c0) / CYCLES * 1e3
        wall_ms = (time.perf_counter() - w0) / CYCLES * 1e3
        c0 = time.process_time()
        for _ in range(CYCLES):
            body = generate_latest(registry)
        scrape_ms = (time.process_time() - c0) / CYCLES * 1e3
        assert all(s.success for s in run.slots), [(s.name, s.error) for s in run.slots]
        if fs:  # the mount was really probed: one series per pod, up
            up = [x.value for s in run.slots if s.name == "fuse" for f in s.families
                  if f.name == "stallscope_fuse_up" for x in f.samples]
            assert up == [1.0], up
        print("exporters: %s; %d ranks x %d workers (real processes), %s, %s; mean of %d cycles"
              % (", ".join(per), RANKS, WORKERS,
                 "%d quota cgroups" % RANKS if use_cgroups else "no cgroups (not root)",
                 "1 FUSE mount" if fs else "no FUSE mount", CYCLES))
        print("one collection cycle:  %6.2f ms CPU  (%.2f ms wall)   budget %.0f ms CPU -> %.2fx of budget"
              % (cpu_ms, wall_ms, BUDGET_MS, cpu_ms / BUDGET_MS))
        for name, secs in per.items():
            print("  %-8s %6.2f ms CPU in its own thread" % (name, secs / CYCLES * 1e3))
        print("one /metrics render of the result: %6.2f ms CPU, %d bytes" % (scrape_ms, len(body)))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if fs is not None:  # after the ranks: they hold its mount namespace
            fs.stop()
            os.rmdir(fs.mountpoint)
        for d in made:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.05)


if __name__ == "__main__":
    main()
