"""What a scenario needs from the machine, each with the one line that says it is missing.

``check(name)`` returns None when the need is met, else a one-line reason that names the
fix. The lab exits 2 with that line rather than half-running a scenario.
"""
import os
import shutil

TMPFS_MAGIC = 0x01021994


def cpu_cgroup():
    """("v1"|"v2" as 1|2, base directory) where a child cgroup with a CFS quota can be made."""
    return _cgroup("cpu", ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"), "cpu.cfs_quota_us")


def memory_cgroup():
    """("v1"|"v2" as 1|2, base directory) where a child memory cgroup with a limit can be made."""
    return _cgroup("memory", ("/sys/fs/cgroup/memory",), "memory.limit_in_bytes")


def _cgroup(controller, v1_bases, v1_file):
    """A writable v1 hierarchy of ``controller`` (one holding ``v1_file``), else the v2
    root when it delegates ``controller`` to its children, else None."""
    for base in v1_bases:
        if os.path.exists(os.path.join(base, v1_file)) and os.access(base, os.W_OK):
            return 1, base
    root = "/sys/fs/cgroup"
    try:
        with open(os.path.join(root, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
    except OSError:
        enabled = []
    if controller in enabled and os.access(root, os.W_OK):
        return 2, root
    return None


def _fuse():
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (load the fuse module, or give the container --device /dev/fuse)"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "fusermount is missing (apt-get install fuse3 libfuse2)"
    try:
        import mfusepy  # noqa: F401
    except Exception:
        return "mfusepy is missing (pip install 'stallscope[fuse]')"
    return None


def _disk():
    if disk_dir() is None:
        return "no disk-backed directory for shards (TMPDIR and /var/tmp are both tmpfs)"
    return None


def disk_dir():
    """A writable directory on a real disk (not tmpfs), for shards and checkpoints."""
    import tempfile

    for d in (tempfile.gettempdir(), "/var/tmp"):
        try:
            if os.access(d, os.W_OK) and _fs_type(d) != TMPFS_MAGIC:
                return d
        except OSError:
            continue
    return None


def _fs_type(path):
    # statvfs does not carry f_type; statfs(2) through ctypes does.
    import ctypes

    buf = ctypes.create_string_buffer(256)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(path), buf) != 0:
        raise OSError(ctypes.get_errno(), "statfs failed", path)
    return ctypes.c_long.from_buffer(buf).value


CHECKS = {
    "root": lambda: None if os.geteuid() == 0 else "needs root (run it with sudo)",
    "cpu_cgroup": lambda: None if cpu_cgroup() else
    "needs a writable cpu cgroup controller (cgroup v1 cpu, or v2 with cpu in cgroup.subtree_control)",
    "memory_cgroup": lambda: None if memory_cgroup() else
    "needs a writable memory cgroup controller (cgroup v1 memory, or v2 with memory in "
    "cgroup.subtree_control)",
    "fuse": _fuse,
    "unshare": lambda: None if shutil.which("unshare") else "needs unshare(1) (apt-get install util-linux)",
    "disk": _disk,
    "netns": lambda: None if shutil.which("ip") and shutil.which("tc") else
    "needs ip(8) and tc(8) for a network namespace and a shaped link (apt-get install iproute2)",
}


def check(name):
    return CHECKS[name]()
