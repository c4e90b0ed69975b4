"""Run the NVML sampler against the real driver for a few seconds and print what it read.

For a machine with an NVIDIA GPU (not collected by pytest: no GPU in CI):

    .venv/bin/python tests/exporters/gpu/real_nvml_check.py [--seconds 6] [--load] [--json out.json]

--load runs a 1 s on / 1 s off matmul square wave on cuda:0 (needs torch with CUDA), so
the busy samples must show the pattern: on-phases near 1, off-phases near 0. The raw
timestamps of the first read are printed next to each clock, which settles which clock
this driver stamps samples with. --fake runs the same against the fake NVML (a smoke
test of this script on machines without a GPU).
"""
import argparse
import json
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository root

from stallscope.exporters.gpu import nvml as nvml_mod
from stallscope.exporters.gpu.source import Sampler


def square_wave_load(stop, on_s=1.0):
    import torch

    a = torch.randn(8192, 8192, device="cuda:0")
    phases = []
    while not stop.is_set():
        t0 = time.monotonic_ns()
        while time.monotonic_ns() - t0 < on_s * 1e9 and not stop.is_set():
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        phases.append((t0, time.monotonic_ns()))
        stop.wait(on_s)
    return phases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.fake:
        from tests.helpers.fake_nvml import FakeGpu, FakeNvml, square
        nv = FakeNvml([FakeGpu(0, busy=square(2.0, 0.5), history_s=4), FakeGpu(1)], clock="boottime")
    else:
        import pynvml as nv
    logs = []
    src = nvml_mod.NvmlSource(nv)
    sampler = Sampler(src, interval=0.5, log=logs.append)
    report = {"logs": logs, "gpus": [], "clocks": {}}
    sampler.poll()
    if not sampler.available:
        print("NVML not available: %s" % sampler.reason)
        return 1
    mono, offsets = nvml_mod.clock_offsets()
    report["clocks"] = {k: (mono + v) // 1000 for k, v in offsets.items()}
    print("clocks now (µs): %s" % report["clocks"])
    stop, phases = threading.Event(), []
    loader = None
    if args.load:
        loader = threading.Thread(target=lambda: phases.extend(square_wave_load(stop)), daemon=True)
        loader.start()
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        time.sleep(0.5)
        sampler.poll()
    stop.set()
    if loader:
        loader.join(10)
    for gpu, status, _ratio, busy_s, sampled_s, pids in sampler.snapshot():
        ring = list(sampler.tracks[gpu.uuid].ring)
        st = gpu.state
        g = {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "status": status,
             "clock": st.domain, "mode": st.mode, "period_ms": st.period_ns and st.period_ns / 1e6,
             "samples": len(ring), "busy_seconds": busy_s, "sampled_seconds": sampled_s,
             "mean_busy": busy_s / sampled_s if sampled_s else None, "processes": pids,
             "last_nvml_ts_us": st.last_ts, "ring": ring[-40:]}
        report["gpus"].append(g)
        print("GPU %d %s %s: %s, clock=%s mode=%s period=%s ms, %d samples over %.2f s, "
              "mean busy %.3f, processes %s" % (
                  gpu.index, gpu.uuid, gpu.name, status, st.domain, st.mode, g["period_ms"],
                  len(ring), sampled_s, g["mean_busy"] or 0, pids))
        for t, p, r in ring[-24:]:
            print("    t=%.3f s  period=%4.0f ms  busy=%.2f" % (t / 1e9, p / 1e6, r))
    if phases:
        report["load_phases"] = phases
        print("load on-phases (monotonic s): %s" % [
            (round(a / 1e9, 3), round(b / 1e9, 3)) for a, b in phases])
    print("errors: %s; logs: %s" % (dict(sampler.errors), logs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    src.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
