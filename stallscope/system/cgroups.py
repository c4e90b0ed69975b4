"""Attribution: which cgroup, pod and container a rank's processes live in.

Reads ``/proc/<pid>/cgroup`` (cgroups(7)): one ``ID:CONTROLLERS:PATH`` line per v1
hierarchy and ``0::PATH`` for the v2 (unified) hierarchy. Kubernetes path shapes
(kubelet's cgroup drivers; containerd, CRI-O and cri-dockerd scope names):

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`` (guaranteed pods
  have no QoS level; CRI-O uses ``crio-<id>.scope`` and ``crio-conmon-<id>.scope``,
  cri-dockerd ``docker-<id>.scope``; kind nests everything under ``kubelet.slice``).
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>``.
- Seen from a private cgroup namespace, other pods' paths start with ``/../..``: the
  tail is matched and the host path rebuilt (``resolve``) against the hostPath mount.
"""
from __future__ import annotations

import os
import re
from typing import Any

from . import procfs as procfs_mod

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD_RE = re.compile(r"(?:^|[-/])pod(" + _UID + r")(?:\.slice)?(?:/|$)")
_QOS_RE = re.compile(r"kubepods[-/](burstable|besteffort)")
# <runtime>-<id>.scope (systemd driver), or a bare 64-hex directory (cgroupfs driver).
_SCOPE_RE = re.compile(r"/(?:(cri-containerd|crio-conmon|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")


class Cgroup:
    """Where one process lives: v1 paths by controller, the v2 path, and what the path
    says about Kubernetes (pod UID, container ID, runtime, QoS class, driver)."""

    __slots__ = ("v1", "v2", "pod_uid", "container_id", "runtime", "qos", "driver")

    def __init__(self, v1: dict[str, str] | None = None, v2: str | None = None) -> None:
        self.v1 = v1 or {}
        self.v2 = v2
        self.pod_uid = self.container_id = self.runtime = self.qos = self.driver = None
        infos = [k8s_info(p) for p in [v2] + sorted(set(self.v1.values())) if p]
        # A path naming the pod wins; else one naming a container (plain docker/podman).
        best = next((i for i in infos if i["pod_uid"]), None) or next(
            (i for i in infos if i["container_id"]), None)
        for k, v in (best or {}).items():
            setattr(self, k, v)

    def path(self, controller):
        """The path of ``controller`` ("cpu", "memory" ...): v1 when a v1 hierarchy has it."""
        return self.v1.get(controller) or self.v2

    def as_json(self) -> dict[str, Any]:
        return {"v1": dict(self.v1), "v2": self.v2, "pod_uid": self.pod_uid,
                "container_id": self.container_id, "runtime": self.runtime,
                "qos": self.qos, "driver": self.driver}


def k8s_info(path):
    """Pod UID, container ID, runtime, QoS and cgroup driver from a cgroup path."""
    info = {"pod_uid": None, "container_id": None, "runtime": None, "qos": None, "driver": None}
    s = _SCOPE_RE.search(path)
    if s:
        info["container_id"] = s.group(2)
        info["runtime"] = s.group(1) or ""
    m = _POD_RE.search(path)
    if m:
        info["pod_uid"] = m.group(1).replace("_", "-")
        info["driver"] = "systemd" if ".slice" in path else "cgroupfs"
        q = _QOS_RE.search(path)
        info["qos"] = q.group(1) if q else "guaranteed"
    return info


def of_pid(procfs: str, pid: Any) -> Cgroup | None:
    """The Cgroup of ``pid``, or None when the process is gone."""
    text = procfs_mod.read_text(procfs_mod.pid_path(procfs, pid, "cgroup"))
    return None if text is None else Cgroup(*procfs_mod.parse_cgroup(text))


def _systemd_expand(name):
    """``a-b-c.slice`` → ``/a.slice/a-b.slice/a-b-c.slice`` (systemd.slice(5) naming)."""
    stem = name[:-len(".slice")]
    parts = stem.split("-")
    return "".join("/%s.slice" % "-".join(parts[:i]) for i in range(1, len(parts) + 1))


def resolve(path, exists):
    """A path as seen from a private cgroup namespace (``/../../x/y``) → the host path,
    using ``exists(host_path)`` to pick among candidates; plain paths pass through.

    The kernel shows other namespaces' cgroups relative to the reader's root, so the
    prefix above the ``..`` is lost; for Kubernetes it is rebuilt from the slice names
    (systemd driver) or tried from the usual cgroupfs-driver roots.
    """
    if "/.." not in path:
        return path
    segs = [s for s in path.split("/") if s and s != ".."]
    if not segs:
        return "/"
    tail = "/" + "/".join(segs)
    candidates = []
    slices = [i for i, s in enumerate(segs) if s.endswith(".slice")]
    if slices:  # systemd: the first slice name encodes all of its parents
        first = slices[0]
        candidates.append(_systemd_expand(segs[first]) + "/" + "/".join(segs[first + 1:]))
        candidates.append("/kubelet.slice" + candidates[-1])
    for root in ("", "/kubepods", "/kubepods/burstable", "/kubepods/besteffort"):
        candidates.append(root + tail)
    for c in candidates:
        c = c.rstrip("/") or "/"
        if exists(c):
            return c
    return None


class Layout:
    """Where the hierarchies are mounted under ``--path.cgroupfs``: v1 controllers
    (``cpu`` may live in ``cpu,cpuacct``), and the v2 root (the fs itself on a pure v2
    host, ``unified/`` on a hybrid one)."""

    def __init__(self, cgroupfs):
        self.root = cgroupfs
        self.v1 = {}
        self.v2 = None
        if os.path.exists(os.path.join(cgroupfs, "cgroup.controllers")):
            self.v2 = cgroupfs
            return
        try:
            names = sorted(os.listdir(cgroupfs))
        except OSError:
            names = []
        for name in names:
            full = os.path.join(cgroupfs, name)
            if name == "unified" and os.path.exists(os.path.join(full, "cgroup.controllers")):
                self.v2 = full
                continue
            if os.path.islink(full) or not os.path.isdir(full):
                continue
            for c in name.split(","):
                self.v1.setdefault(c, full)

    def v1_dir(self, controller, path):
        base = self.v1.get(controller)
        return _join(base, path) if base and path is not None else None

    def v2_dir(self, path):
        return _join(self.v2, path) if self.v2 and path is not None else None

    def resolve_v1(self, controller, path):
        base = self.v1.get(controller)
        if not base or path is None:
            return None
        return resolve(path, lambda p: os.path.isdir(_join(base, p)))

    def resolve_v2(self, path):
        if not self.v2 or path is None:
            return None
        return resolve(path, lambda p: os.path.isdir(_join(self.v2, p)))


def _join(base, path):
    return os.path.join(base, path.lstrip("/")) if path.strip("/") else base


def ancestors(path):
    """``/a/b/c`` → ``/a/b/c``, ``/a/b``, ``/a`` (the root excluded)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def container_label(cg, path):
    """The ``container`` label value: the container ID when the path names one, else the
    cgroup path itself (bare metal, Slurm, the lab)."""
    if cg is not None and cg.container_id:
        return cg.container_id
    return path or "/"
