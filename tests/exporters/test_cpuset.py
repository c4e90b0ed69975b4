"""cpuset (exporters/cpuset.py): whether a pod's loader has CPUs of its own (issue 32).
Node trees written from descriptions (tests/helpers/nodetree.py: a burstable pod on the
shared pool beside the node's s3fs daemon, and a guaranteed one on exclusive CPUs), and
a real v1 cpuset cgroup confining a rank's process to one CPU beside a real FUSE daemon
(stallscope.lab.slowfs), checked against the kernel's own record."""
import dataclasses
import os
import subprocess

import pytest

from stallscope.exporters import cpuset
from stallscope.host.facts import RankCpuset
from stallscope.system import cpus
from tests.golden.fixtures import node as golden
from tests.helpers import nodetree
from tests.helpers.exporters import collect, context, kill, scratch_cgroup, table_with, values, write
from tests.helpers.needs import need_fuse, need_root

LABELS = dict(job="job1", pod="pod1", namespace="ns1", node="n1")


def exporter_over(tmp_path, node):
    tree = str(tmp_path / "node")
    nodetree.write(node, tree)
    procfs = os.path.join(tree, "proc")
    table = table_with(dict(pid=golden.MAIN.pid, worker_pids=[w.pid for w in golden.WORKERS]), procfs=procfs)
    host = context(table, procfs=procfs, sysfs=os.path.join(tree, "sys"),
                   cgroupfs=os.path.join(tree, "cgroup"))
    return cpuset.CpusetExporter(host), table.snapshot()[0]


def test_a_burstable_pod_on_the_shared_pool_shares_its_cpus_with_the_fuse_daemon(tmp_path):
    exp, rank = exporter_over(tmp_path, golden.NODE)
    assert exp.unavailable() is None
    fams = collect(exp, [rank])
    all_cpus = len(nodetree.cpus_of(golden.ALL_CPUS))
    assert values(fams, "stallscope_pod_cpuset_cpus", qos_class="burstable", **LABELS) == [all_cpus]
    assert values(fams, "stallscope_pod_cpuset_exclusive", **LABELS) == [0]
    daemon = len(nodetree.cpus_of(golden.FUSE_DAEMON_CPUS))
    assert values(fams, "stallscope_pod_cpuset_fuse_daemon_cpus", **LABELS) == [daemon]
    assert exp.host.facts.value(RankCpuset, rank.key) == RankCpuset("burstable", all_cpus, False, daemon)


def guaranteed(neighbour_cpus):
    """The golden pod as the static CPU manager places a Guaranteed pod: CPUs 8-11 of its
    own, beside another container whose cpuset is ``neighbour_cpus``."""
    uid = golden.POD_UID.replace("-", "_")
    pod = "/kubepods.slice/kubepods-pod%s.slice" % uid
    scope = pod + "/cri-containerd-%s.scope" % golden.CONTAINER
    other = ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice"
             "/cri-containerd-%s.scope" % (uid[::-1], "ab" * 32))
    procs = tuple(dataclasses.replace(p, cgroup=scope) if p.cgroup == golden.SCOPE else p
                  for p in golden.NODE.processes)
    cgs = (nodetree.Cgroup(pod), nodetree.Cgroup(scope, cpuset="8-11"),
           nodetree.Cgroup(other, cpuset=neighbour_cpus), nodetree.Cgroup(golden.DAEMON_CGROUP))
    return dataclasses.replace(golden.NODE, processes=procs, cgroups=cgs)


def test_a_guaranteed_pods_own_cpus_are_exclusive_and_off_the_daemons(tmp_path):
    exp, rank = exporter_over(tmp_path, guaranteed(neighbour_cpus="0-7,12-15"))
    fams = collect(exp, [rank])
    assert values(fams, "stallscope_pod_cpuset_cpus", qos_class="guaranteed", **LABELS) == [4]
    assert values(fams, "stallscope_pod_cpuset_exclusive", **LABELS) == [1]
    assert values(fams, "stallscope_pod_cpuset_fuse_daemon_cpus", **LABELS) == [0]


def test_cpus_another_container_also_holds_are_not_exclusive(tmp_path):
    exp, rank = exporter_over(tmp_path, guaranteed(neighbour_cpus="0-8"))
    assert values(collect(exp, [rank]), "stallscope_pod_cpuset_exclusive", **LABELS) == [0]


def test_no_cpuset_controller_is_said(tmp_path):
    exp, rank = exporter_over(tmp_path, dataclasses.replace(golden.NODE, controllers="cpu io memory"))
    assert "no cpuset cgroup controller" in exp.unavailable()


def test_the_daemon_scan_waits_its_interval(tmp_path):
    """The /proc walk for /dev/fuse holders runs once a scan interval, not each collection."""
    exp, rank = exporter_over(tmp_path, golden.NODE)
    calls = []
    scan = exp._scan_daemons
    exp._scan_daemons = lambda: calls.append(1) or scan()
    for _ in range(3):
        collect(exp, [rank])
    assert len(calls) == 1


@pytest.fixture
def v1_cpuset():
    need_root()
    base = "/sys/fs/cgroup/cpuset"
    if not os.path.exists(os.path.join(base, "cpuset.effective_cpus")):
        pytest.skip("needs the cgroup v1 cpuset controller")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs to confine a process to one")
    with scratch_cgroup(base) as made:
        yield made


def test_a_real_cpuset_and_a_real_fuse_daemon(v1_cpuset, tmp_path):
    need_fuse()
    from stallscope.lab import slowfs

    path, procs = v1_cpuset
    write(os.path.join(path, "cpuset.cpus"), "1")
    write(os.path.join(path, "cpuset.mems"), "0")
    main = subprocess.Popen(["sleep", "60"])
    procs.append(main)
    write(os.path.join(path, "cgroup.procs"), str(main.pid))
    fs = slowfs.SlowFS(str(tmp_path / "mnt"), private=True).start()
    try:
        table = table_with(dict(pid=main.pid))
        exp = cpuset.CpusetExporter(context(table, cgroupfs="/sys/fs/cgroup"))
        fams = collect(exp, table.snapshot())
        # the kernel's own record: the process's affinity, and the daemon's
        with open("/proc/%d/status" % main.pid) as f:
            [allowed] = [line.split()[1] for line in f if line.startswith("Cpus_allowed_list")]
        with open("/proc/%d/status" % fs.proc.pid) as f:
            [daemon] = [line.split()[1] for line in f if line.startswith("Cpus_allowed_list")]
        mine, theirs = cpus.parse_cpulist(allowed), cpus.parse_cpulist(daemon)
        assert mine == {1}
        assert values(fams, "stallscope_pod_cpuset_cpus", qos_class="", **LABELS) == [1]
        assert values(fams, "stallscope_pod_cpuset_fuse_daemon_cpus", **LABELS) == [len(mine & theirs)] == [1]
    finally:
        fs.stop()
        kill(main)
