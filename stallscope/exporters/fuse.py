"""fuse: health of the FUSE mounts the ranks read from.

Mounts come from ``/proc/<pid>/mountinfo`` (proc(5)), once per mount namespace. A
mount's kernel connection is its ``major:minor`` (0:N); fusectl's
``/sys/fs/fuse/connections/<N>/waiting`` counts its requests in flight and is read
first, since it never touches the mount (kernel Documentation/filesystems/fuse.rst).

Each connection is probed with ``statvfs`` through ``/proc/<pid>/root<mountpoint>``
in a thread of its own: statfs always reaches the daemon (FUSE_STATFS), where ``stat``
may be answered from the attribute cache. A hung daemon leaves the probe blocked in
the kernel, so a probe is never re-issued while one is outstanding; past
``--exporter.fuse.probe-timeout`` the mount is reported stuck. A dead daemon makes every
call fail with ENOTCONN ("Transport endpoint is not connected"); an aborted connection
with ECONNABORTED.

Implementations: Mountpoint for S3 and blobfuse2 mount as plain ``fuse`` with their
name as source; gcsfuse, s3fs, JuiceFS, Alluxio use ``fuse.<name>`` (as their mount
helpers register them).
"""
from __future__ import annotations

import collections
import dataclasses
import errno
import os
import re
import threading
import time
from typing import Any

from ..host.families import family
from ..host.options import flag
from ..system.procfs import PTRACE_NOTE, mountinfo, read_text
from ..vocabulary import signal
from . import base

DEFAULT_EXCLUDE = r"^fuse\.(lxcfs|portal|gvfsd-fuse|xdg-document-portal)$"
KNOWN = ("mountpoint-s3", "blobfuse2", "gcsfuse", "s3fs", "juicefs", "alluxio-fuse",
         "goofys", "rclone", "sshfs", "ossfs", "geesefs")
UP, PROBE, WAITING = (signal(n).name for n in ("fuse_up", "fuse_probe_seconds", "fuse_waiting_requests"))


@dataclasses.dataclass(frozen=True)
class FuseOptions:
    probe_timeout: float = flag(2.0, "--exporter.fuse.probe-timeout",
                                "A FUSE mount whose statfs probe takes longer is reported stuck; "
                                "the probe is not re-issued until it returns.",
                                lo=0.05, hi=600, metavar="SECONDS")
    exclude_fstypes: str = flag(DEFAULT_EXCLUDE, "--exporter.fuse.exclude-fstypes",
                                "FUSE filesystem types not to watch.", metavar="REGEX", regex=True)


def is_fuse(fstype):
    return fstype in ("fuse", "fuseblk") or fstype.startswith(("fuse.", "fuseblk."))


def driver_of(fstype, source):
    """The FUSE implementation's name from fstype (fuse.<name>) or, for plain ``fuse``
    mounts, from the source; bounded to a short token so it is safe as a label."""
    name = fstype.split(".", 1)[1] if "." in fstype else source.split(":", 1)[0].rsplit("/", 1)[-1]
    name = name.lower()
    for known in KNOWN:
        if name == known or name.startswith(known):
            return known
    name = re.sub(r"[^a-z0-9._-]", "", name)[:32]
    return name or "unknown"


class Probe:
    """One statvfs of a mount in a daemon thread; ``done`` is set when it returns."""

    def __init__(self, path):
        self.path = path
        self.started = time.monotonic()
        self.seconds = None
        self.errno = None
        self.counted = False  # already counted in the failures counter
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="stallscope-fuse-probe").start()

    def _run(self):
        try:
            os.statvfs(self.path)
        except OSError as e:
            self.errno = e.errno or errno.EIO
        self.seconds = time.monotonic() - self.started
        self.done.set()


def outcome(p, probe_timeout, now):
    """(state, probe seconds, error name) of a probe: up, stuck, disconnected (ENOTCONN),
    aborted (ECONNABORTED), gone (the process or mountpoint vanished), error; or
    (None, elapsed, None) while a probe is still within its timeout."""
    if not p.done.is_set():
        elapsed = now - p.started
        return ("stuck", elapsed, "stuck") if elapsed > probe_timeout else (None, elapsed, None)
    if p.errno is None:
        return "up", p.seconds, None
    name = errno.errorcode.get(p.errno, str(p.errno))
    state = {errno.ENOTCONN: "disconnected", errno.ECONNABORTED: "aborted",
             errno.ENOENT: "gone", errno.ESRCH: "gone"}.get(p.errno, "error")
    return state, p.seconds, name


class FuseExporter(base.Exporter):
    name = "fuse"
    Options = FuseOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.probe_timeout = self.options.probe_timeout
        self.exclude = re.compile(self.options.exclude_fstypes)
        self.mounts_of: dict[Any, Any] = {}   # rank key -> [mount state] for /api/v1/ranks
        self.probes = {}      # connection (major:minor) -> latest Probe
        self.last = {}        # connection -> last settled (state, seconds, error)
        self.failures = collections.Counter()  # labels + (reason,) -> n

    def _mounts(self, ranks):
        """{connection: {"path": probe path, "series": {labels: Mount}, "ranks": [...]}}"""
        by_ns, out = {}, {}
        for rank in ranks:
            if not rank.pid:
                continue
            try:
                ns = os.readlink(self.proc(rank.pid, "ns", "mnt"))
            except PermissionError as e:
                self.note(PTRACE_NOTE % e.strerror + ": the ranks' FUSE mounts are not watched")
                continue
            except OSError:
                continue
            if ns not in by_ns:
                by_ns[ns] = [m for m in mountinfo(self.host.procfs, rank.pid)
                             if is_fuse(m.fstype) and not self.exclude.search(m.fstype)]
            for m in by_ns[ns]:
                entry = out.setdefault(m.dev, {"path": self.proc(rank.pid, "root") + m.mountpoint,
                                               "series": {}, "ranks": []})
                labels = (rank.labels["job"], rank.labels["pod"], rank.labels["namespace"],
                          rank.labels["node"], m.mountpoint, m.fstype, driver_of(m.fstype, m.source))
                entry["series"].setdefault(labels, m)
                entry["ranks"].append((rank, labels))
        return out

    def _waiting(self, dev):
        major, _, minor = dev.partition(":")
        # fusectl names a connection by the kernel's dev_t, (major << 20) | minor: for
        # the anonymous devices of plain FUSE mounts (major 0), the minor.
        conn = str((int(major) << 20) | int(minor))
        text = read_text(os.path.join(self.host.sysfs, "fs", "fuse", "connections", conn, "waiting"))
        if text is None:
            self.note("fusectl is not mounted at %s/fs/fuse/connections: pending requests "
                      "unknown (mount -t fusectl none /sys/fs/fuse/connections)" % self.host.sysfs)
            return None
        return int(text)

    def collect(self) -> Any:
        mounts = self._mounts(self.host.ranks())
        waiting = {dev: self._waiting(dev) for dev in mounts}  # before any probe
        for dev, entry in mounts.items():
            p = self.probes.get(dev)
            if p is None or p.done.is_set():
                self.probes[dev] = Probe(entry["path"])
        budget_end = time.monotonic() + min(self.probe_timeout, 0.5 * self.deadline)
        for dev in mounts:
            self.probes[dev].done.wait(max(0.0, budget_end - time.monotonic()))
        return self._emit(mounts, waiting, time.monotonic())

    def _emit(self, mounts, waiting, now):
        up = family("stallscope_fuse_up")
        secs = family("stallscope_fuse_probe_seconds")
        wait = family("stallscope_fuse_waiting_requests")
        fails = family("stallscope_fuse_probe_failures_total")
        per_rank, live = collections.defaultdict(list), set()
        for dev, entry in sorted(mounts.items()):
            p = self.probes[dev]
            state, seconds, error = outcome(p, self.probe_timeout, now)
            if state is None or state == "gone":  # pending within its timeout / transient
                state, seconds, error = self.last.get(dev, ("up", seconds, None))
            self.last[dev] = (state, seconds, error)
            for labels, _m in entry["series"].items():
                live.add(labels)
                up.add_values(labels, 1 if state == "up" else 0)
                secs.add_values(labels, seconds)
                if waiting[dev] is not None:
                    wait.add_values(labels, waiting[dev])
                if error and not p.counted:
                    self.failures[labels + (error,)] += 1
            if error:
                p.counted = True
            for rank, labels in entry["ranks"]:
                per_rank[rank.key].append((rank, labels, state, seconds, waiting[dev], error))
        for key in [k for k in self.failures if k[:-1] not in live]:
            del self.failures[key]
        for key, n in sorted(self.failures.items()):
            fails.add_values(key, n)
        self._forget(mounts)
        self._record(per_rank)
        return [f.family for f in (up, secs, wait, fails)]

    def _forget(self, mounts):
        for dev in [d for d, p in self.probes.items() if d not in mounts and p.done.is_set()]:
            del self.probes[dev]
            self.last.pop(dev, None)

    def _record(self, per_rank):
        mounts_of = {}
        for key, rows in per_rank.items():
            self.record(key, UP, min(1 if r[2] == "up" else 0 for r in rows))
            self.record(key, PROBE, max(r[3] for r in rows))
            known = [r[4] for r in rows if r[4] is not None]
            if known:
                self.record(key, WAITING, sum(known))
            mounts_of[key] = [
                {"mountpoint": mount[4], "fstype": mount[5], "driver": mount[6], "state": s,
                 "probe_seconds": round(sec, 6), "waiting_requests": w, "error": e}
                for _, mount, s, sec, w, e in rows]
        self.mounts_of = mounts_of

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        found = self.mounts_of.get(rank.key)
        return {"fuse": found} if found is not None else {}
