"""Readers and parsers for procfs (proc(5)). Every reader returns None (or an empty
value) when the file cannot be read: processes vanish between a listing and a read.
"""
from __future__ import annotations

import collections
import os
import re
import signal
from collections.abc import Iterable
from typing import NamedTuple

# os.read(fd, n) allocates n bytes before the kernel fills a few hundred of them: at 64 KiB
# that block was over the agent's fixed mmap threshold (agent/malloc.py), and reads of
# /proc files became mmaps, page faults, mremaps to shrink and munmaps (strace of the agent
# at 8 ranks x 8 workers, 20 s: 1002 mmap and munmap and 497 mremap calls for 2397 files
# opened; perf: a tenth of its CPU). 16 KiB comes from the heap; a larger file is read in
# parts. An exporter cycle under the agent's allocator: 16.4-17.8 ms -> 7.3-11.6 ms
# (benchmarks/bench_exporters.py).
READ_CHUNK = 16 * 1024

# Why a pod's files cannot be read through /proc/<pid>/root (the shm and fuse exporters'
# note; %s: the error)
PTRACE_NOTE = ("cannot follow /proc/<pid>/root into the ranks' mount namespaces (%s; the agent "
               "needs CAP_SYS_PTRACE: deploy/kubernetes/overlays/ptrace)")


def read_text(path: str) -> str | None:
    """File contents, or None when it cannot be read (gone, absent, permission).

    Read with bare descriptors: a text-mode ``open()`` adds an fstat, an ioctl and a
    decoder per file, and the exporters read thousands of these small files a minute
    (2.4x the cost a read: benchmarks/bench_exporters.py). Bytes a process put in its
    own files (comm, cmdline) need not be UTF-8: they are replaced, never raised."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        first = os.read(fd, READ_CHUNK)
        if not first:
            return ""
        chunks = [first]
        while True:  # seq files (mountinfo) may hand over a large file in parts
            more = os.read(fd, READ_CHUNK)
            if not more:
                break
            chunks.append(more)
    except OSError:
        return None
    finally:
        os.close(fd)
    return (first if len(chunks) == 1 else b"".join(chunks)).decode("utf-8", "replace")


class KeptFiles:
    """One file of many processes (``/proc/<pid>/<name>``), each kept open between reads.

    A procfs file read again from offset 0 gives its current values, so a read is one
    pread where open, read and close were three calls and a path walk: 9-11 us -> 2-4 us a
    file on this VM, for the exporters that read a file of every loader worker every
    collection (issue 31: the agent's 2 % at 8 ranks x 8 workers). A descriptor stays
    bound to the process it was opened on (the inode holds its struct pid): once that one
    has exited the read fails with ESRCH, even if a new process has its PID, and the file
    is then opened anew by path. What the owner no longer reads is closed by ``keep``.
    """

    SIZE = 4096  # stat, io and schedstat are a few hundred bytes; a longer file is read whole
    # Past this many kept, a file is read and closed as read_text does: a node of more
    # loader processes than this costs more a read, never the agent's descriptors.
    MAX_KEPT = 4096

    def __init__(self, procfs: str, name: str) -> None:
        self.procfs, self.name = procfs, name
        self.fds: dict[int, int] = {}

    def read(self, pid: int) -> str | None:
        """The file of ``pid`` now, or None when it cannot be read (gone, no right)."""
        fd = self.fds.get(pid)
        if fd is not None:
            try:
                data = os.pread(fd, self.SIZE, 0)
            except OSError:  # that process is gone: its PID may be another's now
                data = None
            if data is not None and len(data) < self.SIZE:
                return data.decode("utf-8", "replace")
            self._close(pid)
        path = pid_path(self.procfs, pid, self.name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.pread(fd, self.SIZE, 0)
        except OSError:
            os.close(fd)
            return None
        if len(data) >= self.SIZE:  # longer than a part: not kept, read whole
            os.close(fd)
            return read_text(path)
        if len(self.fds) >= self.MAX_KEPT:
            os.close(fd)
        else:
            self.fds[pid] = fd
        return data.decode("utf-8", "replace")

    def keep(self, pids: Iterable[int]) -> None:
        """Close the files of every process but ``pids``."""
        wanted = set(pids)
        for pid in [p for p in self.fds if p not in wanted]:
            self._close(pid)

    def close(self) -> None:
        self.keep(())

    def _close(self, pid: int) -> None:
        fd = self.fds.pop(pid, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def read_keyed(path: str) -> dict[str, int]:
    """``key value`` lines (cpu.stat and friends) -> {key: int}; {} when unreadable."""
    out: dict[str, int] = {}
    for line in (read_text(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def pid_path(procfs: str, pid: object, *parts: str) -> str:
    """``<procfs>/<pid>/<parts...>``; the parts are file names, never absolute (joined
    as strings: os.path.join was a tenth of an exporter cycle)."""
    return "/".join((procfs, str(pid)) + parts)


class Stat(NamedTuple):
    """The fields of /proc/<pid>/stat that stallscope reads (proc(5) numbering)."""
    state: str         # field 3: R, S, D, Z ...
    ppid: int          # field 4
    pgrp: int          # field 5
    starttime: int     # field 22: clock ticks after boot (tells a reused PID apart)
    exit_code: int | None  # field 52 (Linux 3.5+): the wait status of a zombie


def parse_stat(text: str) -> Stat | None:
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = text[text.rfind(")") + 2:].split()
    try:
        exit_code = int(rest[49]) if len(rest) > 49 else None
        return Stat(rest[0], int(rest[1]), int(rest[2]), int(rest[19]), exit_code)
    except (IndexError, ValueError):
        return None


def stat_fields(procfs: str, pid: object, *task: str) -> list[str] | None:
    """The fields of /proc/<pid>[/task/<tid>]/stat after comm (field 3 at index 0, so
    utime, field 14, is index 11), or None."""
    return split_stat(read_text(pid_path(procfs, pid, *task, "stat")))


def split_stat(text: str | None) -> list[str] | None:
    """A stat file's fields after comm (stat_fields), or None for an empty or no file."""
    if not text:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2:].split()


def rss_bytes(procfs: str, pid: object) -> int | None:
    for line in (read_text(pid_path(procfs, pid, "status")) or "").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def stat(procfs: str, pid: object) -> Stat | None:
    text = read_text(pid_path(procfs, pid, "stat"))
    return parse_stat(text) if text else None


def start_time(procfs: str, pid: object) -> int | None:
    st = stat(procfs, pid)
    return st.starttime if st else None


def alive(procfs: str, pid: object, start: int | None = None) -> bool:
    """Whether ``pid`` exists (and, given ``start``, is still the same process)."""
    now = start_time(procfs, pid)
    return now is not None and (start is None or now == start)


def exit_signal(procfs: str, pid: object) -> str | None:
    """The signal that ended a zombie ``pid`` (its wait status), or None."""
    st = stat(procfs, pid)
    if st is None or st.exit_code is None:
        return None
    sig = st.exit_code & 0x7F
    if not sig or sig == 0x7F:
        return None
    return signal_name(sig)


def signal_name(sig: int) -> str:
    """``SIGBUS`` for 7; the number itself where Python has no name for it."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def ns_pid(procfs: str, pid: object) -> int | None:
    """The PID in the innermost PID namespace: the last field of NSpid in status."""
    for line in (read_text(pid_path(procfs, pid, "status")) or "").splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else None
    return None


def children(procfs: str, pid: object) -> list[int]:
    """Children of every thread of ``pid`` (/proc/<pid>/task/<tid>/children)."""
    out: list[int] = []
    try:
        tids = os.listdir(pid_path(procfs, pid, "task"))
    except OSError:
        return out
    for tid in tids:
        text = read_text(pid_path(procfs, pid, "task", tid, "children")) or ""
        out.extend(int(c) for c in text.split())
    return out


def is_descendant(procfs: str, pid: int, ancestor: int, max_depth: int = 64) -> bool:
    """Whether ``ancestor`` is ``pid`` or one of its parents (the ppid chain of stat)."""
    for _ in range(max_depth):
        if pid == ancestor:
            return True
        st = stat(procfs, pid)
        if st is None or st.ppid <= 0:
            return False
        pid = st.ppid
    return False


# -- mountinfo ------------------------------------------------------------------------
Mount = collections.namedtuple("Mount", "mount_id dev root mountpoint fstype source")


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(text: str) -> list[Mount]:
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if not sep or len(f) < 5 or len(r) < 2:
            continue
        out.append(Mount(f[0], f[2], _unescape(f[3]), _unescape(f[4]), r[0], _unescape(r[1])))
    return out


def mountinfo(procfs: str, pid: object) -> list[Mount]:
    return parse_mountinfo(read_text(pid_path(procfs, pid, "mountinfo")) or "")


# -- cgroup ---------------------------------------------------------------------------
def parse_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """Text of /proc/<pid>/cgroup (cgroups(7)) -> (v1 {controller: path}, v2 path)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
            continue
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v1, v2
