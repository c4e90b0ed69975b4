"""The golden node's tree, written from its description (fixtures/node.py) by
tests/helpers/nodetree.py, read back with the agent's own readers where it has them:
what the description says is what an exporter finds."""
import os
import signal

import pytest

from stallscope.system import procfs
from tests.golden.fixtures import node
from tests.helpers import golden, nodetree


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("golden-node") / "fixtures")
    nodetree.write(node.NODE, d)
    return d


def read(tree, *path):
    with open(os.path.join(tree, *path)) as f:
        return f.read()


def keyed(text, sep=":"):
    """{key: value} of "key<sep> value" lines (status, the NVIDIA information file)."""
    return {k.strip(): v.strip() for k, _, v in (line.partition(sep) for line in text.splitlines())}


def test_processes_read_back_through_the_agents_procfs_readers(tree):
    proc = os.path.join(tree, "proc")
    assert procfs.children(proc, node.MAIN.pid) == [w.pid for w in node.WORKERS]
    d, z = node.WORKERS
    assert procfs.stat_fields(proc, d.pid)[0] == "D"
    assert procfs.stat_fields(proc, z.pid)[0] == "Z"
    assert procfs.exit_signal(proc, z.pid) == signal.SIGBUS.name  # wait status 7
    assert [procfs.ns_pid(proc, p.pid) for p in (node.MAIN, d, z)] == [1, d.ns_pid, z.ns_pid]
    mounts = procfs.mountinfo(proc, node.MAIN.pid)
    assert [(m.mountpoint, m.fstype, m.dev) for m in mounts] == [
        (m.mountpoint, m.fstype, m.dev) for m in node.POD_MOUNTS.mounts]
    for p in (node.MAIN, d, z):
        assert procfs.parse_cgroup(read(tree, "proc", str(p.pid), "cgroup")) == ({}, node.SCOPE)
    assert os.readlink(os.path.join(proc, "self")) == str(node.MAIN.pid)


def test_stat_and_status_agree_on_what_both_say(tree):
    for p in (node.MAIN,) + node.WORKERS:
        status = keyed(read(tree, "proc", str(p.pid), "status"))
        stat = read(tree, "proc", str(p.pid), "stat").rsplit(")", 1)[1].split()
        assert status["State"][0] == stat[0] == p.state
        assert int(status["Threads"]) == int(stat[17]) == p.threads      # field 20
        assert int(status["VmRSS"].split()[0]) * 1024 == int(stat[21]) * nodetree.PAGE  # field 24
        assert status["NSpid"].split() == [str(p.pid), str(p.ns_pid)]
        assert int(read(tree, "proc", str(p.pid), "statm").split()[0]) * nodetree.PAGE == p.vsize


def test_numa_topology_gpu_and_cpu_affinity(tree):
    """Two NUMA nodes; the rank's GPU on node 1; the loader workers allowed on node 0 only
    (the placement the NUMA check is about)."""
    nodes = [nodetree.cpus_of(read(tree, "sys/devices/system/node/node%d/cpulist" % n).strip())
             for n in (0, 1)]
    assert nodes == [list(range(0, 8)), list(range(8, 16))]
    assert read(tree, "sys/devices/system/node/online") == "0-1\n"
    (gpu,) = node.GPUS
    dev = os.path.join(tree, "sys/bus/pci/devices", gpu.bdf)
    assert os.path.islink(dev) and os.path.isdir(dev)  # a link into /sys/devices, as the kernel's
    assert read(dev, "numa_node") == "1\n"
    assert nodetree.cpus_of(read(dev, "local_cpulist").strip()) == nodes[1]
    for w in node.WORKERS:
        status = keyed(read(tree, "proc", str(w.pid), "status"))
        allowed = nodetree.cpus_of(status["Cpus_allowed_list"])
        assert allowed == nodes[0]
        assert int(status["Cpus_allowed"].replace(",", ""), 16) == sum(1 << c for c in allowed)
    main = keyed(read(tree, "proc", str(node.MAIN.pid), "status"))
    assert main["Cpus_allowed"] == "ffff" and main["Cpus_allowed_list"] == "0-15"


def test_the_nvidia_information_file_names_the_simulated_gpu_of_the_run(tree):
    """The driver's format (nv-procfs.c: "Key: \\t value"), with the uuid the simulator
    gives the rank's GPU in the golden run's own exposition, and the bus location it is
    filed under."""
    (gpu,) = node.GPUS
    text = read(tree, "proc/driver/nvidia/gpus", gpu.bdf, "information")
    info = keyed(text)
    assert list(info) == ["Model", "IRQ", "GPU UUID", "Video BIOS", "Bus Type", "DMA Size",
                          "DMA Mask", "Bus Location", "Device Minor", "GPU Excluded"]
    assert text.startswith("Model: \t\t ") and "\nGPU UUID: \t SIM-" in text
    assert info["Bus Location"] == gpu.bdf and info["Bus Type"] == "PCIe"
    simulated = {line.split('uuid="')[1].split('"')[0] for line in golden.golden_run().exposition.splitlines()
                 if 'source="simulated"' in line and 'uuid="' in line}
    assert simulated == {info["GPU UUID"]}


def test_fusectl_connections_and_probes_follow_the_mounts(tree):
    waiting = {m.dev.split(":")[1]: m.waiting for m in node.POD_MOUNTS.mounts if m.waiting is not None}
    assert sorted(os.listdir(os.path.join(tree, "sys/fs/fuse/connections"))) == sorted(waiting)
    for minor, n in waiting.items():
        assert read(tree, "sys/fs/fuse/connections", minor, "waiting") == "%d\n" % n
    with pytest.raises(OSError) as e:
        os.stat(os.path.join(tree, "root", "loop"))
    assert e.value.errno == 40  # ELOOP
    assert os.path.isdir(os.path.join(tree, "root", "data"))


def test_an_inconsistent_description_is_refused():
    import dataclasses

    stray = dataclasses.replace(node.MAIN, pid=9999, cgroup="/nowhere")
    with pytest.raises(ValueError, match="undescribed cgroup"):
        nodetree.files(dataclasses.replace(node.NODE, processes=(stray,)))
    far = dataclasses.replace(node.GPUS[0], numa_node=2)
    with pytest.raises(ValueError, match="NUMA node 2 of 2"):
        nodetree.files(dataclasses.replace(node.NODE, gpus=(far,)))
    shm = dataclasses.replace(node.POD_MOUNTS.mounts[3], waiting=1)
    ns = nodetree.MountNamespace("mnt:[1]", (shm,))
    with pytest.raises(ValueError, match="not a FUSE mount"):
        nodetree.files(dataclasses.replace(node.NODE, processes=(dataclasses.replace(node.MAIN, mnt_ns=ns),)))
