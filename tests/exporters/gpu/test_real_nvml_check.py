"""real_nvml_check.py against the fake NVML and the golden node's sysfs: the placement it
prints for a GPU (issue 32) is NVML's (bus id, NUMA node, CPU affinity) beside sysfs's,
and says where they agree; a driver that tells no placement is reported, never raised."""
import json
import os
import subprocess
import sys

from tests.golden.fixtures.node import NODE
from tests.helpers import ROOT
from tests.helpers.nodetree import write

SCRIPT = os.path.join(ROOT, "tests", "exporters", "gpu", "real_nvml_check.py")


def test_the_check_prints_each_gpus_placement_from_nvml_beside_sysfs(tmp_path):
    write(NODE, str(tmp_path / "node"))
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, SCRIPT, "--fake", "--seconds", "1", "--json", str(out),
                        "--sysfs", str(tmp_path / "node" / "sys")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    gpus = {g["index"]: g["placement"] for g in json.loads(out.read_text())["gpus"]}
    [gpu] = NODE.gpus
    local = NODE.numa_cpus[gpu.numa_node]
    assert gpus[0] == {"nvml_bus_id": "00000000:18:00.0", "sysfs_bus_id": gpu.bdf,
                       "nvml_numa_node": gpu.numa_node, "nvml_cpu_affinity": local,
                       "sysfs_numa_node": str(gpu.numa_node), "sysfs_local_cpulist": local,
                       "affinity_agrees": True}
    assert "placement: nvml_bus_id=00000000:18:00.0" in r.stdout
    # GPU 1: no NUMA node from the driver, no device in sysfs
    assert gpus[1]["nvml_numa_node"].startswith("unsupported")
    assert gpus[1]["sysfs_numa_node"].startswith("unreadable")
    assert gpus[1]["nvml_cpu_affinity"] == "-" and "affinity_agrees" not in gpus[1]
