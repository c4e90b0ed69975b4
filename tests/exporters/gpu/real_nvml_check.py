"""Run the NVML sampler against the real driver for a few seconds and print what it read.

For a machine with an NVIDIA GPU (not collected by pytest: no GPU in CI):

    .venv/bin/python tests/exporters/gpu/real_nvml_check.py [--seconds 6] [--load] [--json out.json]

--load runs a 1 s on / 1 s off matmul square wave on cuda:0 (needs torch with CUDA), so
the busy samples must show the pattern: on-phases near 1, off-phases near 0. The raw
timestamps of the first read are printed next to each clock, which settles which clock
this driver stamps samples with. Each GPU's placement is printed as NVML gives it (PCI
bus id, NUMA node, CPU affinity) beside sysfs (``numa_node``, ``local_cpulist``) and
what the numa exporter reads (issue 32). --fake runs the same against the fake NVML (a
smoke test of this script on machines without a GPU).
"""
import argparse
import json
import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository root

from stallscope.exporters.gpu import nvml as nvml_mod
from stallscope.exporters.gpu.source import Sampler
from stallscope.system.cpus import parse_cpulist


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _cpus(words):
    """NVML's CPU affinity: 64-bit words, CPU i is bit i%64 of word i//64."""
    return sorted(64 * w + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1)


def _ranges(cpus):
    out, start, prev = [], None, None
    for c in list(cpus) + [None]:
        if start is not None and (c is None or c != prev + 1):
            out.append("%d" % start if start == prev else "%d-%d" % (start, prev))
            start = None
        if c is not None and start is None:
            start = c
        prev = c
    return ",".join(out) or "-"


def placement(nv, index, sysfs="/sys"):
    """NVML's and sysfs's view of where GPU ``index`` sits; a call this driver or
    binding lacks is reported as such, never raised."""
    out = {}
    h = nv.nvmlDeviceGetHandleByIndex(index)
    try:
        bus = _text(nv.nvmlDeviceGetPciInfo(h).busId)
    except Exception as e:  # report whatever the driver says
        return {"error": "nvmlDeviceGetPciInfo: %s" % e}
    # NVML spells the domain with 8 digits (00000000:17:00.0), sysfs and the driver's
    # /proc directory with 4 (0000:17:00.0).
    dom, _, rest = bus.partition(":")
    sys_bus = ("%04x:%s" % (int(dom, 16), rest)).lower() if rest else bus.lower()
    out["nvml_bus_id"], out["sysfs_bus_id"] = bus, sys_bus
    try:
        out["nvml_numa_node"] = nv.nvmlDeviceGetNumaNodeId(h)
    except Exception as e:
        out["nvml_numa_node"] = "unsupported (%s)" % e
    try:
        words = ((os.cpu_count() or 1) + 63) // 64
        out["nvml_cpu_affinity"] = _ranges(_cpus(nv.nvmlDeviceGetCpuAffinity(h, words)))
    except Exception as e:
        out["nvml_cpu_affinity"] = "unsupported (%s)" % e
    dev = os.path.join(sysfs, "bus", "pci", "devices", sys_bus)
    for name in ("numa_node", "local_cpulist"):
        try:
            with open(os.path.join(dev, name)) as f:
                out["sysfs_" + name] = f.read().strip()
        except OSError as e:
            out["sysfs_" + name] = "unreadable (%s)" % e.strerror
    local = parse_cpulist(out["sysfs_local_cpulist"])
    if local and isinstance(out["nvml_cpu_affinity"], str) and "unsupported" not in out["nvml_cpu_affinity"]:
        out["affinity_agrees"] = _ranges(sorted(local)) == out["nvml_cpu_affinity"]
    return out


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
    ap.add_argument("--sysfs", default="/sys", help="where sysfs is (the fake's tree for --fake)")
    args = ap.parse_args()
    if args.fake:
        from tests.helpers.fake_nvml import FakeGpu, FakeNvml, square
        # GPU 0 sits where the golden node puts the rank's GPU (0000:18:00.0, NUMA node 1,
        # CPUs 8-15: tests/golden/fixtures/node.py); GPU 1's driver tells no placement.
        nv = FakeNvml([FakeGpu(0, busy=square(2.0, 0.5), history_s=4, bus_id="00000000:18:00.0",
                               numa_node=1, cpus=range(8, 16)), FakeGpu(1)], clock="boottime")
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
        g["placement"] = placement(nv, gpu.index, args.sysfs)
        print("    placement: %s" % "  ".join("%s=%s" % kv for kv in g["placement"].items()))
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
