"""A fake node's ``/proc``, ``/sys``, cgroup v2 tree and root filesystem, written from a
description (``Node``): what an exporter reads is declared once, as data, and every file
that mirrors it is generated here in the kernel's (or the NVIDIA driver's) format.

The golden run (tests/helpers/golden.py) describes its node in
tests/golden/fixtures/node.py and writes the tree into its temporary directory with
``write``; ``python -m tests.helpers.nodetree DIR`` writes the same tree for a look.

Formats, each from its source:
- /proc/<pid>/stat, statm, status, io, schedstat, cgroup, mountinfo,
  task/<tid>/children; /proc/diskstats, /proc/stat: proc(5) and
  Documentation/filesystems/proc.rst, Documentation/admin-guide/iostats.rst;
  Documentation/scheduler/sched-stats.rst (schedstat).
- PSI files (/proc/pressure/*, <cgroup>/*.pressure): Documentation/accounting/psi.rst.
- cpu.max, cpu.stat, cgroup.controllers: Documentation/admin-guide/cgroup-v2.rst.
- /sys/fs/fuse/connections/<minor>/waiting: Documentation/filesystems/fuse.rst (fusectl;
  the directory is the minor of the mount's ``0:N`` device).
- /sys/devices/system/node/node<N>/cpulist and ``online``:
  Documentation/ABI/stable/sysfs-devices-node; /sys/bus/pci/devices/<bdf> (a link into
  /sys/devices) with ``numa_node`` and ``local_cpulist``:
  Documentation/ABI/testing/sysfs-bus-pci.
- /proc/driver/nvidia/gpus/<bdf>/information: the NVIDIA driver's
  ``nv_procfs_read_gpu_info`` (kernel-open/nvidia/nv-procfs.c).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

PAGE = 4096  # bytes per page: statm and the stat rss are in pages (the run fixes psutil's)


# -- the description ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Pressure:
    """One PSI file: the ``some`` and ``full`` lines, each (avg10, avg60, avg300 in %,
    total stall time in microseconds)."""
    some: tuple[float, float, float, int]
    full: tuple[float, float, float, int]


@dataclasses.dataclass(frozen=True)
class CpuStat:
    """A cgroup's cpu.stat (the fields the kernel prints; the burst and core-scheduling
    ones are zero)."""
    usage_usec: int
    user_usec: int
    system_usec: int
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_usec: int = 0


@dataclasses.dataclass(frozen=True)
class Cgroup:
    """A cgroup v2 directory, ``path`` relative to the cgroupfs root (with a leading /)."""
    path: str
    cpu_max: tuple[int, int] | None = None     # (quota_us, period_us); None: no file
    cpu_stat: CpuStat | None = None
    pressure: Mapping[str, Pressure] = dataclasses.field(default_factory=dict)  # cpu|io|memory
    cpuset: str | None = None                  # cpuset.cpus.effective (a cpulist); None: no file


@dataclasses.dataclass(frozen=True)
class Mount:
    """One line of mountinfo. ``waiting``: a FUSE mount's fusectl ``waiting`` count (its
    connection directory is written when set). ``probe``: what a probe of the mountpoint
    through the pod's root finds, "dir" (a directory) or "loop" (a symlink to itself:
    ELOOP); None writes nothing under the root."""
    mount_id: int
    parent_id: int
    dev: str                 # major:minor
    mountpoint: str
    options: str
    fstype: str
    source: str
    super_options: str
    optional: str = ""       # e.g. master:300
    root: str = "/"
    waiting: int | None = None
    probe: str | None = None


@dataclasses.dataclass(frozen=True)
class MountNamespace:
    name: str                # the ns/mnt link's target, e.g. mnt:[4026532712]
    mounts: Sequence[Mount]


@dataclasses.dataclass(frozen=True)
class Io:
    """/proc/<pid>/io."""
    rchar: int
    wchar: int
    syscr: int
    syscw: int
    read_bytes: int
    write_bytes: int = 0
    cancelled_write_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Process:
    """A process, on the node (``pid``) and in its pod's PID namespace (``ns_pid``).
    ``state`` is the one-letter state of stat (S, R, D, Z ...); ``exit_code`` the
    wait status of a zombie (stat field 52). CPU times are in clock ticks (100 Hz),
    ``vsize`` in bytes, the memory pages in pages of PAGE bytes. ``cpus_allowed`` is the
    affinity as a cpulist (status Cpus_allowed_list). Its children (task/<pid>/children)
    are the described processes whose ``ppid`` it is."""
    pid: int
    ns_pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cgroup: str                               # a described Cgroup's path
    cpus_allowed: str
    io: Io
    schedstat: tuple[int, int, int]           # on-CPU ns, run-queue wait ns, timeslices
    utime: int
    stime: int
    starttime: int
    vsize: int
    rss: int                                  # resident pages
    shared: int = 0                           # statm's shared, text and data pages
    text: int = 0
    data: int = 0
    threads: int = 1
    comm: str = "python3"
    flags: int = 0x400100                     # PF_RANDOMIZE | PF_FORKNOEXEC
    minflt: int = 0
    majflt: int = 0
    processor: int = 0
    blkio_ticks: int = 0                      # delayacct_blkio_ticks
    exit_code: int = 0
    uid: int = 1000
    mnt_ns: MountNamespace | None = None   # writes ns/mnt and mountinfo
    root: bool = False                        # a root link to the node's pod root (../../root)
    fds: Mapping[int, str] = dataclasses.field(default_factory=dict)  # fd/<n> -> link target


@dataclasses.dataclass(frozen=True)
class Disk:
    """A block device: its diskstats counters (the 17 fields after the name), ``model``
    for a physical disk (sysfs ``device/model``; None: no ``device``, as for loop and
    device-mapper), ``size`` in 512-byte sectors (None: no file). Partitions are lines of
    diskstats, not entries of /sys/block."""
    name: str
    major: int
    minor: int
    stats: Sequence[int]
    model: str | None = None
    size: int | None = None
    partitions: Sequence[Disk] = ()


@dataclasses.dataclass(frozen=True)
class NetInterface:
    """A network interface of the node's namespace (/sys/class/net/<name>): its received
    bytes, link speed in Mb/s (-1: unknown, as the kernel reads it for a link that is
    down), and whether it is physical (a ``device`` link, as a NIC has and a veth not)."""
    name: str
    rx_bytes: int
    speed: int = -1
    physical: bool = False


@dataclasses.dataclass(frozen=True)
class NvidiaGpu:
    """A GPU the NVIDIA driver lists: its PCI address, NUMA node (its ``local_cpulist`` is
    that node's CPUs) and the identity its information file gives."""
    bdf: str                 # domain:bus:device.function, e.g. 0000:18:00.0
    numa_node: int
    uuid: str
    model: str
    minor: int = 0
    irq: int = 0
    vbios: str = "96.00.74.00.01"
    dma_bits: int = 47


@dataclasses.dataclass(frozen=True)
class Node:
    numa_cpus: Sequence[str]                  # the cpulist of NUMA node 0, 1, ...
    processes: Sequence[Process]
    cgroups: Sequence[Cgroup]
    controllers: str                          # the root's cgroup.controllers
    pressure: Mapping[str, Pressure]          # /proc/pressure/*
    disks: Sequence[Disk]
    gpus: Sequence[NvidiaGpu] = ()
    btime: int = 1700000000                   # /proc/stat
    cpu_idle: int = 46828483                  # /proc/stat: idle ticks of all CPUs (USER_HZ)
    root_files: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the pod root
    self_pid: int | None = None            # /proc/self
    cpuset: str | None = None                 # the root cgroup's cpuset.cpus.effective
    interfaces: Sequence[NetInterface] = ()   # /sys/class/net


# -- cpulists ----------------------------------------------------------------------------
def cpus_of(cpulist: str) -> list[int]:
    """The CPUs of a cpulist ("0-3,8,10-11"), in order."""
    out: list[int] = []
    for part in cpulist.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def cpumask(cpulist: str, ncpus: int) -> str:
    """The kernel's %*pb of a cpulist: hex, ncpus bits wide, in comma-separated groups of
    32 bits (status Cpus_allowed)."""
    bits = 0
    for c in cpus_of(cpulist):
        bits |= 1 << c
    digits = "%0*x" % ((ncpus + 3) // 4, bits)
    groups = []
    while digits:
        groups.insert(0, digits[-8:])
        digits = digits[:-8]
    return ",".join(groups)


# -- rendering ---------------------------------------------------------------------------
def pressure_text(p: Pressure) -> str:
    return "".join("%s avg10=%.2f avg60=%.2f avg300=%.2f total=%d\n" % ((kind,) + tuple(v))
                   for kind, v in (("some", p.some), ("full", p.full)))


def cpu_stat_text(s: CpuStat) -> str:
    rows = [("usage_usec", s.usage_usec), ("user_usec", s.user_usec), ("system_usec", s.system_usec),
            ("core_sched.force_idle_usec", 0), ("nr_periods", s.nr_periods),
            ("nr_throttled", s.nr_throttled), ("throttled_usec", s.throttled_usec),
            ("nr_bursts", 0), ("burst_usec", 0)]
    return "".join("%s %d\n" % r for r in rows)


def stat_text(p: Process, by_pid: Mapping[int, Process]) -> str:
    """The 52 fields of /proc/<pid>/stat (proc(5)); a zombie has no memory."""
    f = [p.pid, "(%s)" % p.comm, p.state, p.ppid, p.pgid, p.sid, 0, -1, p.flags,
         p.minflt, 0, p.majflt, 0, p.utime, p.stime, 0, 0, 20, 0, p.threads, 0, p.starttime,
         p.vsize, p.rss, 2 ** 64 - 1, 1, 1, 0, 0, 0, 0, 0, 16781312, 16386, 0, 0, 0, 17,
         p.processor, 0, 0, p.blkio_ticks, 0, 0, 0, 0, 0, 0, 0, 0, 0, p.exit_code]
    assert len(f) == 52
    return " ".join(str(v) for v in f) + "\n"


def statm_text(p: Process) -> str:
    return "%d %d %d %d 0 %d 0\n" % (p.vsize // PAGE, p.rss, p.shared, p.text, p.data)


STATES = {"R": "R (running)", "S": "S (sleeping)", "D": "D (disk sleep)", "T": "T (stopped)",
          "Z": "Z (zombie)", "I": "I (idle)"}


def status_text(p: Process, by_pid: Mapping[int, Process], ncpus: int) -> str:
    def ns(pid: int) -> str:  # a PID as the node and the pod's namespace see it
        inside = by_pid[pid].ns_pid if pid in by_pid else None
        return "%d\t%d" % (pid, inside) if inside is not None else "%d" % pid

    ids = "\t".join([str(p.uid)] * 4)
    rows = [("Name", p.comm), ("Umask", "0022"), ("State", STATES[p.state]), ("Tgid", p.pid),
            ("Ngid", 0), ("Pid", p.pid), ("PPid", p.ppid), ("TracerPid", 0), ("Uid", ids),
            ("Gid", ids), ("NStgid", ns(p.pid)), ("NSpid", ns(p.pid)), ("NSpgid", ns(p.pgid)),
            ("NSsid", ns(p.sid)), ("VmRSS", "%d kB" % (p.rss * PAGE // 1024)), ("Threads", p.threads),
            ("Cpus_allowed", cpumask(p.cpus_allowed, ncpus)), ("Cpus_allowed_list", p.cpus_allowed)]
    return "".join("%s:\t%s\n" % r for r in rows)


def io_text(io: Io) -> str:
    return "".join("%s: %d\n" % (f.name, getattr(io, f.name)) for f in dataclasses.fields(io))


def mountinfo_text(ns: MountNamespace) -> str:
    lines = []
    for m in ns.mounts:
        fields = ((m.mount_id, m.parent_id, m.dev, m.root, m.mountpoint, m.options)
                  + ((m.optional,) if m.optional else ()) + ("-", m.fstype, m.source, m.super_options))
        lines.append(" ".join(str(v) for v in fields))
    return "\n".join(lines) + "\n"


def diskstats_text(disks: Sequence[Disk]) -> str:
    lines = []
    for d in disks:
        for x in (d,) + tuple(d.partitions):
            assert len(x.stats) == 17, x.name
            lines.append("%4d %7d %s %s" % (x.major, x.minor, x.name, " ".join(str(v) for v in x.stats)))
    return "\n".join(lines) + "\n"


def information_text(g: NvidiaGpu) -> str:
    rows = [("Model: \t\t", g.model), ("IRQ:   \t\t", g.irq), ("GPU UUID: \t", g.uuid),
            ("Video BIOS: \t", g.vbios), ("Bus Type: \t", "PCIe"), ("DMA Size: \t", "%d bits" % g.dma_bits),
            ("DMA Mask: \t", "0x%x" % ((1 << g.dma_bits) - 1)), ("Bus Location: \t", g.bdf),
            ("Device Minor: \t", g.minor), ("GPU Excluded:\t", "No")]
    return "".join("%s %s\n" % r for r in rows)


PROC_STAT = ("cpu  10132153 290696 3084719 %d 16683 0 25195 0 0 0\n"
             "cpu0 2533038 72674 771179 11707120 4170 0 6298 0 0 0\n"
             "intr 199292 0\nctxt 1990473\nbtime %d\nprocesses 20490\n"
             "procs_running 2\nprocs_blocked 1\nsoftirq 30100 0\n")


# -- the tree ----------------------------------------------------------------------------
def files(node: Node) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """({path: text}, {path: symlink target}, [empty directories]) of the tree, paths
    relative to its root (proc/, sys/, cgroup/, root/)."""
    out: dict[str, str] = {}
    links: dict[str, str] = {}
    dirs: list[str] = []
    by_pid = {p.pid: p for p in node.processes}
    ncpus = max(max(cpus_of(c)) for c in node.numa_cpus) + 1
    cgroups = {c.path: c for c in node.cgroups}

    # /proc
    for p in node.processes:
        d = "proc/%d/" % p.pid
        if p.cgroup not in cgroups:
            raise ValueError("process %d is in an undescribed cgroup %s" % (p.pid, p.cgroup))
        out[d + "stat"] = stat_text(p, by_pid)
        out[d + "statm"] = statm_text(p)
        out[d + "status"] = status_text(p, by_pid, ncpus)
        out[d + "io"] = io_text(p.io)
        out[d + "schedstat"] = "%d %d %d\n" % p.schedstat
        out[d + "cgroup"] = "0::%s\n" % p.cgroup
        kids = [c.pid for c in node.processes if c.ppid == p.pid]
        if kids:  # the kernel ends each PID with a space, and the file with nothing
            out[d + "task/%d/children" % p.pid] = "".join("%d " % k for k in kids)
        if p.mnt_ns is not None:
            links[d + "ns/mnt"] = p.mnt_ns.name
            out[d + "mountinfo"] = mountinfo_text(p.mnt_ns)
        if p.root:
            links[d + "root"] = "../../root"
        for fd, target in p.fds.items():
            links[d + "fd/%d" % fd] = target
    if node.self_pid is not None:
        links["proc/self"] = str(node.self_pid)
    out["proc/stat"] = PROC_STAT % (node.cpu_idle, node.btime)
    for kind, p in node.pressure.items():
        out["proc/pressure/" + kind] = pressure_text(p)
    out["proc/diskstats"] = diskstats_text(node.disks)
    for g in node.gpus:
        out["proc/driver/nvidia/gpus/%s/information" % g.bdf] = information_text(g)

    # /sys
    for d in node.disks:
        if d.model is not None:
            out["sys/block/%s/device/model" % d.name] = d.model + "\n"
        if d.size is not None:
            out["sys/block/%s/size" % d.name] = "%d\n" % d.size
    for i in node.interfaces:
        out["sys/class/net/%s/statistics/rx_bytes" % i.name] = "%d\n" % i.rx_bytes
        out["sys/class/net/%s/speed" % i.name] = "%d\n" % i.speed
        if i.physical:
            out["sys/class/net/%s/device/vendor" % i.name] = "0x15b3\n"
    namespaces = {p.mnt_ns.name: p.mnt_ns for p in node.processes if p.mnt_ns is not None}
    for ns in namespaces.values():
        for m in ns.mounts:
            if m.waiting is not None:
                if not (m.fstype == "fuse" or m.fstype.startswith("fuse.")):
                    raise ValueError("%s is not a FUSE mount: no fusectl connection" % m.mountpoint)
                out["sys/fs/fuse/connections/%s/waiting" % m.dev.split(":")[1]] = "%d\n" % m.waiting
            if m.probe == "dir":
                dirs.append("root" + m.mountpoint)
            elif m.probe == "loop":
                links["root" + m.mountpoint] = os.path.basename(m.mountpoint)
    for n, cpulist in enumerate(node.numa_cpus):
        out["sys/devices/system/node/node%d/cpulist" % n] = cpulist + "\n"
    out["sys/devices/system/node/online"] = "0-%d\n" % (len(node.numa_cpus) - 1) \
        if len(node.numa_cpus) > 1 else "0\n"
    for g in node.gpus:
        if not 0 <= g.numa_node < len(node.numa_cpus):
            raise ValueError("GPU %s on NUMA node %d of %d" % (g.bdf, g.numa_node, len(node.numa_cpus)))
        dev = "sys/devices/pci%s/%s/" % (g.bdf.rsplit(":", 2)[0] + ":00", g.bdf)
        out[dev + "numa_node"] = "%d\n" % g.numa_node
        out[dev + "local_cpulist"] = node.numa_cpus[g.numa_node] + "\n"
        links["sys/bus/pci/devices/" + g.bdf] = "../../../devices/pci%s/%s" % (
            g.bdf.rsplit(":", 2)[0] + ":00", g.bdf)

    # the cgroup v2 tree
    out["cgroup/cgroup.controllers"] = node.controllers + "\n"
    if node.cpuset is not None:
        out["cgroup/cpuset.cpus.effective"] = node.cpuset + "\n"
    for c in node.cgroups:
        d = "cgroup" + c.path + "/"
        if c.cpu_max is not None:
            out[d + "cpu.max"] = "%d %d\n" % c.cpu_max
        if c.cpu_stat is not None:
            out[d + "cpu.stat"] = cpu_stat_text(c.cpu_stat)
        for kind, p in c.pressure.items():
            out[d + kind + ".pressure"] = pressure_text(p)
        if c.cpuset is not None:
            out[d + "cpuset.cpus.effective"] = c.cpuset + "\n"

    # the pod's root filesystem
    for path, text in node.root_files.items():
        out["root/" + path] = text
    return out, links, dirs


def write(node: Node, tree: str) -> None:
    """Write the node's tree under ``tree`` (which need not exist)."""
    out, links, dirs = files(node)
    for path, text in out.items():
        full = os.path.join(tree, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    for path, target in links.items():
        full = os.path.join(tree, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(target, full)
    for path in dirs:
        os.makedirs(os.path.join(tree, path), exist_ok=True)


def rewrite(node: Node, tree: str) -> list[str]:
    """The tree of ``write`` moved on to ``node`` (the same node later: its counters
    moved): each file whose text changed is written over in place, so a reader that
    keeps the file open (system/procfs.py KeptFiles) reads the new text. Returns the
    paths rewritten; a change of the tree's shape (another file, link or directory) is
    refused, since ``node`` must be the same node."""
    out, links, dirs = files(node)
    changed = []
    for path, text in sorted(out.items()):
        full = os.path.join(tree, path)
        if not os.path.isfile(full):
            raise ValueError("%s is not in the tree: a later node has the same files" % path)
        with open(full, "r+") as f:
            if f.read() == text:
                continue
            f.seek(0)
            f.truncate()
            f.write(text)
        changed.append(path)
    for path, target in links.items():
        if os.readlink(os.path.join(tree, path)) != target:
            raise ValueError("link %s moved: a later node has the same links" % path)
    return changed


if __name__ == "__main__":
    from tests.golden.fixtures.node import NODE

    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.helpers.nodetree DIR  (writes the golden node's tree there)")
    write(NODE, sys.argv[1])
