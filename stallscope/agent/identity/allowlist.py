"""The allow-list file (``--identity.allow``): pod names pinned to the uids and cgroups
that may report as them, outside Kubernetes or while the pod map is down (issue 33).

One entry a line, ``#`` starts a comment, blank lines are skipped::

    # NAME                 WHO (at least one of uid= and cgroup=)
    research/node01        uid=1000  cgroup=/system.slice/slurmstepd.scope/job_*
    node02                 uid=1001
    /node03                cgroup=/user.slice/user-1002.slice/*

NAME is ``namespace/pod`` as the hook reports them; a name without ``/`` (or with an
empty namespace, ``/pod``) is the pod of a report that names no namespace (bare metal,
Slurm: the hook's pod defaults to the hostname). ``uid=N`` is the sender's uid as the
kernel gives it (SO_PEERCRED); ``cgroup=`` is a path or an fnmatch glob (``*`` also
matches ``/``) matched against the sender's cgroup paths in /proc/PID/cgroup (the v2
path and each v1 controller's). Several lines may name one pod: a sender matching any
of them may report as it; a sender matching none is refused (``not_allowed``).

A line-based text file, not JSON: an administrator writes it by hand next to
/etc/slurm, comments say why a name is pinned, and a diff shows one entry a line.

A bad file is refused whole, naming its first bad line: at start the agent exits 2; at
a reload (SIGHUP, or its mtime changed) the agent keeps the entries it had, logs one
line and counts it (``stallscope_agent_allowlist_reload_failures_total``).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import threading

from ...host import log
from . import peer

MAX_ENTRIES = 4096
MAX_FILE_BYTES = 1 << 20
MAX_NAME_LEN = 128  # validate.py MAX_LABEL_LEN: a longer name is never reported


@dataclasses.dataclass(frozen=True)
class Entry:
    uid: int | None
    cgroup: str | None     # a path or a glob

    def admits(self, source: peer.Source) -> bool:
        if self.uid is not None and source.uid != self.uid:
            return False
        if self.cgroup is not None:
            paths = (source.cgroup,) + tuple(p for _, p in source.v1)
            if not any(fnmatch.fnmatchcase(p, self.cgroup) for p in paths):
                return False
        return True


Name = tuple[str, str]   # (namespace, pod)


def parse(text: str, where: str) -> dict[Name, tuple[Entry, ...]]:
    """The entries of a file's text; ValueError naming ``where`` and the first bad line."""
    out: dict[Name, list[Entry]] = {}
    n = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue

        def bad(why: str, lineno: int = lineno) -> ValueError:
            return ValueError("%s:%d: %s" % (where, lineno, why))
        words = line.split()
        name = words[0]
        ns, _, pod = name.rpartition("/")
        if not pod or "/" in ns or len(ns) > MAX_NAME_LEN or len(pod) > MAX_NAME_LEN \
                or not name.isprintable():
            raise bad("%r is not NAMESPACE/POD or POD" % name)
        uid: int | None = None
        cgroup: str | None = None
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if not eq or key not in ("uid", "cgroup") or not value:
                raise bad("%r: expected uid=N or cgroup=PATH" % word)
            if (uid if key == "uid" else cgroup) is not None:
                raise bad("%s= given twice" % key)
            if key == "uid":
                if not value.isdigit() or int(value) >= 2**32:
                    raise bad("uid=%s is not a uid" % value)
                uid = int(value)
            else:
                if not value.startswith("/"):
                    raise bad("cgroup=%s is not an absolute path or glob" % value)
                cgroup = value
        if uid is None and cgroup is None:
            raise bad("%s: give uid=N, cgroup=PATH or both" % name)
        n += 1
        if n > MAX_ENTRIES:
            raise bad("more than %d entries" % MAX_ENTRIES)
        out.setdefault((ns, pod), []).append(Entry(uid, cgroup))
    return {k: tuple(v) for k, v in out.items()}


def read(path: str) -> dict[Name, tuple[Entry, ...]]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError("--identity.allow %s: %s" % (path, e.strerror)) from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError("--identity.allow %s: larger than %d bytes" % (path, MAX_FILE_BYTES))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("--identity.allow %s: not UTF-8 text" % path) from None
    return parse(text, "--identity.allow " + path)


class AllowList:
    """The entries in force; reloaded whole or not at all. Thread-safe: ``check`` runs in
    the ingest thread, ``reload`` in the scheduler's."""

    def __init__(self, path: str = "") -> None:
        self.path = path
        self.entries: dict[Name, tuple[Entry, ...]] = {}
        self.mtime: int | None = None
        self.reload_failures = 0
        self.wanted = False        # SIGHUP asked for a reload
        self.lock = threading.Lock()

    def load(self) -> None:
        """At start: ValueError (one line) when the file is unusable."""
        if not self.path:
            return
        self.mtime = self._mtime()
        self.entries = read(self.path)

    def _mtime(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def request(self) -> None:
        """SIGHUP: reload at the next ``poll`` (a signal handler does no I/O)."""
        self.wanted = True

    def poll(self) -> bool:
        """Reload when asked to or when the file's mtime changed; whether it did."""
        if not self.path:
            return False
        mtime = self._mtime()
        if not self.wanted and mtime == self.mtime:
            return False
        self.wanted = False
        self.mtime = mtime
        try:
            entries = read(self.path)
        except ValueError as e:
            self.reload_failures += 1
            log("%s; keeping the %d names loaded before" % (e, len(self.entries)))
            return False
        with self.lock:
            self.entries = entries
        log("--identity.allow %s: %d names" % (self.path, len(entries)))
        return True

    def get(self, name: Name) -> tuple[Entry, ...] | None:
        with self.lock:
            return self.entries.get(name)
