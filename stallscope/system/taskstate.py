"""What a task (a thread of a loader process) is doing, from procfs alone (issue 30).

Per task, ``/proc/<pid>/task/<tid>/``:

- ``schedstat``: time on CPU and time runnable waiting for a CPU, in ns (kernel
  Documentation/scheduler/sched-stats.rst); their deltas over a sampling interval split
  it into *on CPU*, *waiting for CPU* and the rest, off CPU.
- ``stat`` field 3: the state (R, S, D ...), read for D (blocked in the kernel).
- ``syscall``: the system call the task is blocked in, its number and arguments in hex,
  "running", or "-1 ..." when blocked outside a call (a page fault); readable with
  ptrace-read rights over the task (proc(5), PTRACE_MODE_ATTACH_FSCREDS).
- ``/proc/<pid>/fd/<n>``: what the call's first argument, a file descriptor, is open on:
  a path (then its mount, from ``mountinfo``), ``pipe:[ino]`` or ``socket:[ino]``, and for
  a socket its protocol (the ``system.sockprotoname`` attribute: unix, TCP, UDP ...).

The off-CPU rest is classified into the declared states (vocabulary LOADER_STATES) by
the call and what its descriptor is, for a worker or for the training process. Reading
never stops, signals or attaches to the task.
"""
from __future__ import annotations

import os
import platform
from typing import NamedTuple

# System call numbers by architecture (the kernel's syscall tables:
# arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h for arm64).
_X86_64 = {
    "read": (0, 17, 19, 295, 327), "write": (1, 18, 20, 296, 328),
    "recv": (45, 47, 299), "send": (44, 46, 307),
    "poll": (7, 23, 232, 270, 271, 281, 441), "futex": (202, 449),
    "sleep": (35, 230), "open": (2, 257, 437, 4, 5, 6, 262, 332),
}
_ARM64 = {
    "read": (63, 65, 67, 69, 286), "write": (64, 66, 68, 70, 287),
    "recv": (207, 212, 243), "send": (206, 211, 269),
    "poll": (72, 73, 22, 441), "futex": (98, 449),
    "sleep": (101, 115), "open": (56, 437, 79, 291),
}
_TABLE = _ARM64 if platform.machine() in ("aarch64", "arm64") else _X86_64
CALLS = {nr: kind for kind, nrs in _TABLE.items() for nr in nrs}

NETWORK_FS = frozenset(("nfs", "nfs4", "lustre", "cifs", "smb3", "ceph", "glusterfs", "9p", "beegfs", "gpfs",
                        "wekafs", "orangefs"))


class Syscall(NamedTuple):
    kind: str | None        # read, write, recv, send, poll, futex, sleep, open; None: another call
    first_arg: int | None   # the call's first argument (a descriptor for read/write/poll ...)
    blocked_outside: bool   # "-1": blocked, but not in a call (a page fault)
    running: bool


def parse_syscall(text: str | None) -> Syscall | None:
    """``/proc/<pid>/task/<tid>/syscall`` -> Syscall; None when unreadable or junk."""
    if not text:
        return None
    parts = text.split()
    if not parts:
        return None
    if parts[0] == "running":
        return Syscall(None, None, False, True)
    try:
        nr = int(parts[0])
    except ValueError:
        return None
    if nr < 0:
        return Syscall(None, None, True, False)
    arg = None
    if len(parts) > 1:
        try:
            arg = int(parts[1], 16)
        except ValueError:
            arg = None
    return Syscall(CALLS.get(nr), arg, False, False)


def mount_kind(fstype: str) -> str:
    """The kind of a mount: fuse, network_fs, tmpfs, overlay or local."""
    if fstype == "fuse" or fstype.startswith("fuse.") or fstype == "fuseblk":
        return "fuse"
    if fstype in NETWORK_FS:
        return "network_fs"
    if fstype in ("tmpfs", "ramfs", "devtmpfs"):
        return "tmpfs"
    if fstype == "overlay":
        return "overlay"
    return "local"


def classify(role: str, state: str | None, call: Syscall | None, target: str | None,
             unix_socket: bool, internet_socket: bool = False) -> str:
    """The off-CPU state of a task of ``role`` (worker, main, pin): by its call and what
    the call's descriptor is open on (``target``: a path, pipe:[..], socket:[..]).
    ``internet_socket``: the process held a socket other than a unix one when last looked
    at; a poll names its descriptors only in the task's memory (never read), and with a
    socket timeout Python polls its socket before each recv (issue 31: every worker of
    the lab's bandwidth-bound run read as idle)."""
    if call is None:
        return "storage" if state == "D" else "other"
    if call.blocked_outside:
        # blocked outside a call: a fault on a mapped file (an mmap'd dataset) in D state
        return "storage" if state == "D" else "other"
    kind = call.kind
    if kind == "sleep":
        return "sleeping"
    is_path = target is not None and target.startswith("/")
    is_pipe = target is not None and target.startswith("pipe:")
    is_socket = target is not None and target.startswith("socket:")
    if kind in ("read", "open"):
        if is_path or kind == "open":
            return "storage"
        if is_pipe:  # a worker's index queue; the training process's result queue
            return "idle"
    if kind in ("read", "recv") and is_socket:
        if unix_socket:  # the resource sharer's connection (file_descriptor sharing)
            return "handoff"
        return "network"
    if kind in ("write", "send"):
        if is_path:
            return "storage"
        if is_socket and not unix_socket:
            return "network"
        return "handoff"  # putting a batch on the result queue, or passing its descriptors
    if kind == "poll":
        # multiprocessing's Queue.get(timeout) polls its pipe; an HTTP client with a
        # timeout (urllib, requests, the cloud SDKs) polls its connection
        return "network" if internet_socket else "idle"
    if state == "D":
        return "storage"
    return "other"


# Protocol names of the sockets that reach another host (the kernel's struct proto
# names, sk->sk_prot_creator->name, as getxattr "system.sockprotoname" gives them)
INTERNET_PROTOCOLS = ("TCP", "TCPv6", "UDP", "UDPv6", "UDPLITE", "UDPLITEv6", "SCTP", "SCTPv6", "MPTCP",
                      "MPTCPv6")


def socket_protocol(procfs: str, pid: int, fd: int | str) -> str | None:
    """The protocol of the socket ``pid`` holds as descriptor ``fd`` ("UNIX", "UNIX-STREAM",
    "TCP", "NETLINK" ...), from the socket inode's ``system.sockprotoname`` attribute
    (net/socket.c, sockfs_getxattr) read through ``/proc/<pid>/fd/<fd>``: one call, where
    telling a unix socket by ``/proc/<pid>/net/unix`` read every unix socket of the
    namespace (3.6 ms a read at 8 ranks x 8 workers, most of the sampler's time). None:
    not a socket, gone, or not readable."""
    try:
        raw = os.getxattr(os.path.join(procfs, str(pid), "fd", str(fd)), "system.sockprotoname")
    except OSError:
        return None
    return raw.rstrip(b"\0").decode("ascii", "replace")


def is_unix(protocol: str | None) -> bool:
    return protocol is not None and protocol.startswith("UNIX")


def internet_sockets(procfs: str, pid: int) -> frozenset[str]:
    """The sockets to another host (TCP, UDP, SCTP) ``pid`` holds open, as its ``fd``
    links name them (``socket:[N]``, one per socket inode), each one's protocol asked (a
    netlink or unix socket is not one)."""
    base = os.path.join(procfs, str(pid), "fd")
    try:
        names = os.listdir(base)
    except OSError:
        return frozenset()
    held = set()
    for name in names:
        try:
            target = os.readlink(os.path.join(base, name))
        except OSError:
            continue
        if target.startswith("socket:") and socket_protocol(procfs, pid, name) in INTERNET_PROTOCOLS:
            held.add(target)
    return frozenset(held)


def holds_internet_socket(procfs: str, pid: int) -> bool:
    """Whether ``pid`` holds a socket to another host open."""
    return bool(internet_sockets(procfs, pid))
