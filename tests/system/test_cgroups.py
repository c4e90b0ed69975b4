"""Attribution: /proc/<pid>/cgroup → cgroup paths, pod UID, container ID, over the path
shapes Kubernetes, container runtimes and hosts really produce (kubelet's systemd and
cgroupfs drivers; containerd, CRI-O, cri-dockerd; private cgroup namespaces)."""
import os

import pytest

from stallscope.system import cgroups, procfs

UID = "6c2a7d5e-6f8e-4c2b-9a1d-3e4f5a6b7c8d"
UID_ = UID.replace("-", "_")
CID = "4f1c2b3a" * 8

SHAPES = [
    # (cgroup path, pod_uid, container_id, runtime, qos, driver)
    ("/kubepods.slice/kubepods-burstable.slice/"
     "kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID),
     UID, CID, "cri-containerd", "burstable", "systemd"),
    ("/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID),
     UID, CID, "cri-containerd", "guaranteed", "systemd"),
    ("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/crio-%s.scope" % (UID_, CID),
     UID, CID, "crio", "besteffort", "systemd"),
    ("/kubepods.slice/kubepods-besteffort.slice/"
     "kubepods-besteffort-pod%s.slice/crio-conmon-%s.scope" % (UID_, CID),
     UID, CID, "crio-conmon", "besteffort", "systemd"),
    ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/docker-%s.scope" % (UID_, CID),
     UID, CID, "docker", "burstable", "systemd"),
    ("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     "kubelet-kubepods-besteffort-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID),
     UID, CID, "cri-containerd", "besteffort", "systemd"),
    ("/kubepods/burstable/pod%s/%s" % (UID, CID), UID, CID, "", "burstable", "cgroupfs"),
    ("/kubepods/pod%s/%s" % (UID, CID), UID, CID, "", "guaranteed", "cgroupfs"),
    ("/kubepods/besteffort/pod%s" % UID, UID, None, None, "besteffort", "cgroupfs"),  # pod level
    ("/system.slice/docker-%s.scope" % CID, None, CID, "docker", None, None),       # plain docker
    ("/docker/%s" % CID, None, CID, "", None, None),
    ("/user.slice/user-1000.slice/session-2.scope", None, None, None, None, None),
    ("/system.slice/slurmstepd.scope/job_123/step_0/user/task_0", None, None, None, None, None),
    ("/", None, None, None, None, None),
]


@pytest.mark.parametrize("path,uid,cid,runtime,qos,driver", SHAPES)
def test_k8s_info_over_real_shapes(path, uid, cid, runtime, qos, driver):
    info = cgroups.k8s_info(path)
    assert (info["pod_uid"], info["container_id"], info["runtime"], info["qos"], info["driver"]) == \
        (uid, cid, runtime, qos, driver)


def test_parse_v1_hybrid_and_v2_lines():
    k8s = "/kubepods/burstable/pod%s/%s" % (UID, CID)
    text = ("12:cpu,cpuacct:%s\n11:memory:%s\n3:name=systemd:/kubepods/x\n1:pids:/\n0::/\n" % (k8s, k8s))
    v1, v2 = procfs.parse_cgroup(text)
    assert v1["cpu"] == v1["cpuacct"] == v1["memory"] == k8s
    assert v1["name=systemd"] == "/kubepods/x"
    assert v2 == "/"  # hybrid hosts: the 0:: line is often /
    cg = cgroups.Cgroup(v1, v2)
    assert (cg.pod_uid, cg.container_id, cg.driver) == (UID, CID, "cgroupfs")
    assert cg.path("cpu") == k8s and cg.path("io") == "/"
    v1, v2 = procfs.parse_cgroup("0::/kubepods.slice/x.scope\n")
    assert v1 == {} and v2 == "/kubepods.slice/x.scope"


def test_this_process_is_found():
    cg = cgroups.of_pid("/proc", os.getpid())
    assert cg is not None and (cg.v1 or cg.v2 is not None)
    assert cgroups.of_pid("/proc", 2 ** 22 + 7) is None  # no such PID


PRIVATE_NS = [
    # seen from a private cgroup namespace → host path (the set of host dirs that exist)
    ("/../../kubepods-besteffort-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID),
     "/kubepods.slice/kubepods-besteffort.slice/"
     "kubepods-besteffort-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID)),
    ("/../../../kubelet-kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID),
     "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     "kubelet-kubepods-burstable-pod%s.slice/cri-containerd-%s.scope" % (UID_, CID)),
    ("/../../pod%s/%s" % (UID, CID), "/kubepods/burstable/pod%s/%s" % (UID, CID)),
    ("/../pod%s/%s" % (UID, CID), "/kubepods/pod%s/%s" % (UID, CID)),
]


@pytest.mark.parametrize("seen,host", PRIVATE_NS)
def test_resolve_private_namespace_paths(seen, host):
    exists = {host}.__contains__
    assert cgroups.resolve(seen, exists) == host
    assert cgroups.resolve(seen, lambda p: False) is None
    assert cgroups.resolve(host, lambda p: False) == host  # plain paths pass through


def test_layout_of_hybrid_pure_v2_and_merged_controllers(tmp_path):
    hybrid = tmp_path / "hybrid"
    for d in ("cpu,cpuacct", "memory", "unified"):
        (hybrid / d).mkdir(parents=True)
    (hybrid / "cpu").symlink_to("cpu,cpuacct")
    (hybrid / "unified" / "cgroup.controllers").write_text("\n")
    lay = cgroups.Layout(str(hybrid))
    assert lay.v1["cpu"] == lay.v1["cpuacct"] == str(hybrid / "cpu,cpuacct")
    assert lay.v2 == str(hybrid / "unified")
    assert lay.v1_dir("cpu", "/a/b") == str(hybrid / "cpu,cpuacct" / "a" / "b")
    assert lay.v2_dir("/") == str(hybrid / "unified")
    pure = tmp_path / "pure"
    pure.mkdir()
    (pure / "cgroup.controllers").write_text("cpu io memory\n")
    lay = cgroups.Layout(str(pure))
    assert lay.v2 == str(pure) and lay.v1 == {}


def test_ancestors_and_container_label():
    assert cgroups.ancestors("/a/b/c") == ["/a/b/c", "/a/b", "/a"]
    assert cgroups.ancestors("/") == []
    k8s = cgroups.Cgroup({}, "/kubepods/pod%s/%s" % (UID, CID))
    assert cgroups.container_label(k8s, "/x") == CID
    assert cgroups.container_label(cgroups.Cgroup({}, "/user.slice"), "/user.slice") == "/user.slice"
