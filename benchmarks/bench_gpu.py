"""CPU the GPU sampler costs per GPU per second of sampling, as the agent runs it: the gpu
exporter (stallscope/exporters/gpu) over an AgentHost, its samplers polled by hand once a
second and its own sink recording into the SampleStore. NVML through the fake pynvml
(8 GPUs, busy, 6 samples/s each, read once a second) and the simulated GPU (8 ranks at
100 batches/s). The fake's own share (building the driver's sample arrays) is measured
in the same run and shown apart, since the real driver call costs differently. The
simulated GPU is fed by the exporter's ``handle`` in the ingest thread (each report's
events); that cost is measured and shown apart too.

    .venv/bin/python benchmarks/bench_gpu.py
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stallscope.agent.host import AgentHost
from stallscope.agent.table.samples import SampleStore
from stallscope.agent.table.state import RankTable
from stallscope.exporters.gpu.exporter import GpuExporter
from stallscope.exporters.gpu.options import GpuOptions
from stallscope.host.report import HookReport
from tests.helpers.fake_nvml import FakeGpu, FakeNvml, square

GPUS = 8
SECONDS = 4.0
INTERVAL = 1.0


def exporter(table, **options):
    """The gpu exporter as the agent builds it, its samplers not started (polled here)."""
    host = AgentHost(table or RankTable(procfs_root="/nonexistent", node="n"), SampleStore())
    return GpuExporter(host, GpuOptions(**options))


def run(sampler, feed=None):
    """Poll every INTERVAL for SECONDS of wall time; CPU seconds spent in poll()."""
    cpu, polls = 0.0, 0
    sampler.poll()  # open + first read of the buffered history: not steady state
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        time.sleep(INTERVAL)
        if feed:
            feed()
        t = time.thread_time()
        sampler.poll()
        cpu += time.thread_time() - t
        polls += 1
    return cpu, polls


def bench_nvml():
    fake = FakeNvml([FakeGpu(i, busy=square(0.7, 0.6, phase_s=0.05 * i)) for i in range(GPUS)])
    fake_cpu = [0.0]
    real_get = fake.nvmlDeviceGetSamples

    def timed_get(*a):
        t = time.thread_time()
        try:
            return real_get(*a)
        finally:
            fake_cpu[0] += time.thread_time() - t

    fake.nvmlDeviceGetSamples = timed_get
    s, = exporter(None, nvml_module=fake).samplers
    cpu, polls = run(s)
    n = sum(len(t.ring) for t in s.tracks.values())
    return cpu, fake_cpu[0], polls, n


def bench_sim():
    table = RankTable(procfs_root="/nonexistent", node="n")
    exp = exporter(table, nvml=False, simulated=True)
    ident = {"job": "j", "local_rank": 0, "world_size": GPUS, "pod": "p", "namespace": "ns", "node": "n"}
    state = {"t": time.monotonic_ns(), "cpu": 0.0}

    def feed():  # 100 batches/s per rank: 2 ms wait, 8 ms compute
        now = time.monotonic_ns()
        for r in range(GPUS):
            events, t = [], state["t"]
            while t + 10_000_000 <= now:
                t += 10_000_000
                events.append([t, 2_000_000, 10_000_000])
            msg = HookReport.of({"id": dict(ident, rank=r), "pid": 1, "role": "main", "mono_ns": 0,
                                 "wall_ns": 0, "dropped_total": 0, "events": events, "loader": None,
                                 "raw": {}})
            rank = table.apply(msg)
            c = time.thread_time()
            exp.handle(msg, rank)  # the gpu part's share of a report: feeds the simulation
            state["cpu"] += time.thread_time() - c
        state["t"] = t

    feed()
    s, = exp.samplers
    s.poll()
    exp.refresh(table.snapshot())  # a collection maps each rank to its simulated GPU
    state["cpu"] = 0.0
    cpu, polls = run(s, feed)
    return cpu, state["cpu"], polls


def main():
    cpu, fake_cpu, polls, n = bench_nvml()
    gpu_s = GPUS * polls * INTERVAL
    print("NVML sampler (fake pynvml): %d GPUs, %d polls, %d samples kept" % (GPUS, polls, n))
    print("  total:            %7.1f us CPU per GPU per second" % (cpu / gpu_s * 1e6))
    print("  of which the fake: %6.1f us (building the driver's sample arrays)" % (fake_cpu / gpu_s * 1e6))
    print("  sampler's own:    %7.1f us CPU per GPU per second = %.4f%% of one core" % (
        (cpu - fake_cpu) / gpu_s * 1e6, (cpu - fake_cpu) / gpu_s * 100))
    cpu, fed, polls = bench_sim()
    gpu_s = GPUS * polls * INTERVAL
    print("simulated GPU: %d ranks at 100 batches/s, %d polls" % (GPUS, polls))
    print("  sampler:          %7.1f us CPU per GPU per second = %.4f%% of one core" % (
        cpu / gpu_s * 1e6, cpu / gpu_s * 100))
    print("  feeding (handle): %7.1f us CPU per GPU per second = %.4f%% of one core" % (
        fed / gpu_s * 1e6, fed / gpu_s * 100))
    print("  total:            %7.1f us CPU per GPU per second = %.4f%% of one core" % (
        (cpu + fed) / gpu_s * 1e6, (cpu + fed) / gpu_s * 100))


if __name__ == "__main__":
    main()
