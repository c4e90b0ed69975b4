"""Each lab rank as a pod: a mount namespace and a cgroup v2 of its own (as root).

Kubernetes gives every pod both, and stallscope attributes by them: FUSE mounts and
/dev/shm through the rank's mount namespace, PSI through its cgroup. Without them every
rank would see the whole machine's mounts and, sitting at the cgroup v2 root, the node's
pressure; on a shared machine the lab would then diagnose its neighbours.

- mount namespace: ``unshare --mount --propagation private``, starting as a copy of
  the host's; FUSE mounts that other software left there are detached from it, except
  the fault's own; a fault may add setup lines (the tiny /dev/shm) or have the target
  enter an existing namespace (the FUSE daemon's). It goes with the rank's last process.
- cgroup: a child of the cgroup v2 root, joined by the rank before it execs (so its
  loader workers start inside), removed after the rank stopped.
Without root the command runs unchanged, in the host's namespace and cgroup.
"""
import os
import shutil

from ..processes.teardown import rmdir_cgroup

UNIFIED = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")  # cgroup2: hybrid hosts, then unified ones

_DETACH_FOREIGN_FUSE = (
    "for m in $(awk '$0 ~ / - fuse[. ]/ {print $5}' /proc/self/mountinfo); do "
    "case \" %s \" in *\" $m \"*) ;; *) umount -l \"$m\" 2>/dev/null || true;; esac; done")


def isolated():
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def v2_root():
    """The cgroup v2 root where a pod cgroup with PSI files can be made, or None."""
    for base in UNIFIED:
        if os.path.exists(os.path.join(base, "cgroup.controllers")) and os.access(base, os.W_OK):
            return base
    return None


def missing():
    """Why a rank gets no cgroup v2 of its own with PSI files (None: it does)."""
    if not isolated():
        return "needs root and unshare(1)"
    base = v2_root()
    if base is None:
        return "needs a writable cgroup2 hierarchy"
    if not os.path.exists(os.path.join(base, "io.pressure")) and not os.path.exists("/proc/pressure/io"):
        return "the kernel has no PSI (CONFIG_PSI, or psi=0 on its command line)"
    return None


def make_cgroup(run, rank, parent=None):
    """A cgroup v2 for rank ``rank`` (under ``parent``: a lab node's, lab/nodes.py), removed
    by the run's teardown; None where it cannot be."""
    base = parent or (v2_root() if isolated() else None)
    if base is None:
        return None
    path = os.path.join(base, "stallscope-lab-%d-%s-rank%d" % (os.getpid(), run.job, rank))
    run.td.push("remove cgroup %s" % path, rmdir_cgroup, path)
    os.mkdir(path)
    run.created("cgroup", path)
    return path


def wrap(cmd, fault=None, cgroup=None, node=()):
    """``cmd`` to run as a pod (root only; else unchanged). ``fault`` is given for the
    target rank: its setup lines run in the namespace first. ``node``: the command prefix
    that enters the pod's lab node (lab/nodes.py), whose mount namespace the pod's copies."""
    if not isolated():
        return list(cmd)
    lines = fault.setup_lines() if fault else []
    enter = fault.enter() if fault else None
    keep = " ".join(fault.own_mounts()) if fault else ""
    join = ["echo $$ > %s/cgroup.procs" % cgroup] if cgroup else []
    script = "set -e; %s exec \"$@\"" % "".join(
        line + "; " for line in join + [_DETACH_FOREIGN_FUSE % keep] + lines)
    # a fault's namespace (made inside the node where there is one) or a new one copied
    # from the node's; the node's network and hostname either way
    prefix = list(node) + (enter or ["unshare", "--mount", "--propagation", "private", "--"])
    return prefix + ["sh", "-c", script, "sh"] + list(cmd)
