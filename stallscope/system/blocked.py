"""Where a process waits in the kernel, read from /proc without touching what it waits on:
its state (R, S, D ...), wchan, the system call it is in, the file that call works on
and that file's mount (from the process's own mountinfo: its mount namespace).

A read on a FUSE file whose daemon no longer answers waits in the page cache
(``folio_wait_bit_common``) in D state, so wchan alone does not name FUSE; the file
descriptor's path and its mount's fstype do. readlink of /proc/PID/fd/N and mountinfo
never reach the filesystem, so none of this can hang on a dead mount. Reading the path
argument of open/stat calls from /proc/PID/mem needs ptrace rights (root here); without
them the call is named and the path left out.
"""
from __future__ import annotations

import os
import platform

from . import procfs

# x86_64 numbers of the calls a loader process blocks in (elsewhere: "syscall N").
X86_64 = {0: "read", 17: "pread64", 19: "readv", 295: "preadv", 327: "preadv2", 1: "write",
          2: "open", 257: "openat", 437: "openat2", 4: "stat", 5: "fstat", 6: "lstat",
          262: "newfstatat", 332: "statx", 137: "statfs", 138: "fstatfs", 217: "getdents64",
          8: "lseek", 7: "poll", 271: "ppoll", 23: "select", 270: "pselect6", 232: "epoll_wait",
          281: "epoll_pwait", 202: "futex", 45: "recvfrom", 47: "recvmsg", 35: "nanosleep",
          230: "clock_nanosleep", 61: "wait4", 9: "mmap", 74: "fsync", 75: "fdatasync",
          40: "sendfile", 44: "sendto", 46: "sendmsg"}
FD_ARG = {"read", "pread64", "readv", "preadv", "preadv2", "write", "fstat", "fstatfs",
          "getdents64", "lseek", "fsync", "fdatasync", "recvfrom", "recvmsg", "sendto", "sendmsg"}
PATH_ARG0 = {"open", "stat", "lstat", "statfs"}
PATH_ARG1 = {"openat", "openat2", "newfstatat", "statx"}   # (dirfd, path, ...)
AT_FDCWD = -100
STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep (D)", "T": "stopped",
          "t": "traced", "Z": "zombie", "I": "idle"}


def _read(procfs_root: str, pid: int, name: str) -> str | None:
    text = procfs.read_text(procfs.pid_path(procfs_root, pid, name))
    return text.strip() if text is not None else None


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _string_at(procfs_root: str, pid: int, address: int) -> str | None:
    """The NUL-terminated string at ``address`` in the process (a path argument)."""
    try:
        with open(procfs.pid_path(procfs_root, pid, "mem"), "rb", buffering=0) as f:
            f.seek(address)
            raw = f.read(4096)
    except (OSError, OverflowError, ValueError):
        return None
    text = raw.split(b"\0", 1)[0]
    return os.fsdecode(text) if text else None


def syscall(procfs_root: str, pid: int) -> tuple[str | None, list[int]]:
    """(name of the call it is blocked in, its arguments); (None, []) when running or
    unreadable."""
    text = _read(procfs_root, pid, "syscall")
    if not text or text.startswith("running") or text.startswith("-1"):
        return None, []
    parts = text.split()
    try:
        nr, args = int(parts[0]), [int(a, 16) for a in parts[1:7]]
    except ValueError:
        return None, []
    if platform.machine() == "x86_64":
        return X86_64.get(nr, "syscall %d" % nr), args
    return "syscall %d" % nr, args


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def target(procfs_root: str, pid: int, call: str | None, args: list[int]) -> str | None:
    """The path the blocked call works on, as the process names it."""
    if call in FD_ARG and args:
        return _link(procfs.pid_path(procfs_root, pid, "fd", str(_signed(args[0]))))
    if call in PATH_ARG0 and args:
        path, base = _string_at(procfs_root, pid, args[0]), AT_FDCWD
    elif call in PATH_ARG1 and len(args) > 1:
        path, base = _string_at(procfs_root, pid, args[1]), _signed(args[0])
    else:
        return None
    if path is None or path.startswith("/"):
        return path
    where = "cwd" if base == AT_FDCWD else os.path.join("fd", str(base))
    start = _link(procfs.pid_path(procfs_root, pid, where))
    return os.path.join(start, path) if start else path


def mount_of(procfs_root: str, pid: int, path: str) -> procfs.Mount | None:
    """The process's mount that holds ``path`` (the longest mountpoint prefix; the last
    mounted of equal ones, which is what the path reaches)."""
    best = None
    for m in procfs.mountinfo(procfs_root, pid):
        mp = m.mountpoint.rstrip("/") or "/"
        if path == mp or path.startswith(mp + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                best = m
    return best


def view(procfs_root: str, pid: int) -> dict[str, object] | None:
    """{state, wchan, syscall, path, mount, fstype} of ``pid``; None when it is gone."""
    st = procfs.stat(procfs_root, pid)
    if st is None:
        return None
    call, args = syscall(procfs_root, pid) if st.state in "SD" else (None, [])
    path = target(procfs_root, pid, call, args) if call else None
    mount = mount_of(procfs_root, pid, path) if path and path.startswith("/") else None
    return {"state": st.state, "wchan": _read(procfs_root, pid, "wchan") or None,
            "syscall": call, "path": path,
            "mount": mount.mountpoint if mount else None,
            "fstype": mount.fstype if mount else None}
