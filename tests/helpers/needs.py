"""Skip rules for tests that need root, /dev/fuse, a writable cpu cgroup or the
prometheus binary, and a way to run a command as an unprivileged user. On the project's
CI machines all of these exist, so nothing skips there."""
import os
import shutil

import pytest


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root")


def need_prometheus():
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("needs prometheus and promtool (apt-get install prometheus)")


def need_lab_nodes():
    from stallscope.lab import nodes

    if not nodes.isolated():
        pytest.skip("lab nodes need root, iproute2, nsenter and unshare")


def need_fuse():
    need_root()
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        pytest.skip("needs /dev/fuse and fuse3 (apt-get install fuse3 libfuse2)")


def need_cpu_cgroup():
    need_root()
    for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        if os.path.exists(os.path.join(base, "cpu.cfs_quota_us")) and os.access(base, os.W_OK):
            return base
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "/sys/fs/cgroup"
    pytest.skip("needs a writable cpu cgroup")


def as_nobody(cmd):
    """``cmd`` run as uid/gid 65534 with no capability but CAP_DAC_READ_SEARCH: an
    unprivileged user (not root, no ptrace) that can still read the checkout and its
    virtualenv wherever they live (CI clones into a mode 0700 directory)."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux)")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            "--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search"] + list(cmd)


def need_memory_cgroup():
    """(base directory, "v1"/"v2") where a child memory cgroup with a limit can be made."""
    need_root()
    base = "/sys/fs/cgroup/memory"
    if os.path.exists(os.path.join(base, "memory.limit_in_bytes")) and os.access(base, os.W_OK):
        return base, "v1"
    base = "/sys/fs/cgroup"
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            if "memory" in f.read().split():
                return base, "v2"
    except OSError:
        pass
    pytest.skip("needs a writable memory cgroup (v1 memory controller, or v2 with memory enabled)")
