"""What every exporter shares: the base class, the context it runs in, label sets and
small file readers. An exporter is one class with ``collect(ranks)``; the runner
(runner.py) calls it on a schedule in its own thread and serves the last result.

Label sets (series carrying ``rank`` count against the per-rank budget in DESIGN.md,
so signals of a cgroup or a pod carry pod-level labels and are exported once per
cgroup/pod however many ranks share it):
- ``RANK``: job, rank, pod, namespace, node (the workers exporter).
- ``CONTAINER``: job, pod, namespace, node, container (cfs, psi of a cgroup).
- ``POD``: job, pod, namespace, node (shm, fuse add mountpoint/fstype/driver).
- node-wide readings use the same families with only ``node`` set (the other labels
  empty, which Prometheus treats as absent): select them with ``{pod=""}``.
"""
import os
import sys
import threading
import time

from ..agent.state import LABELS as RANK
from . import cgroups

CONTAINER = ("job", "pod", "namespace", "node", "container")
POD = ("job", "pod", "namespace", "node")


def log(message):
    print("stallscope agent: %s" % message, file=sys.stderr, flush=True)


def read_text(path):
    """File contents, or None when it cannot be read (gone, absent, permission)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def read_keyed(path):
    """``key value`` lines (cpu.stat and friends) → {key: int}; {} when unreadable."""
    text = read_text(path)
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


class Context:
    """Paths, options and sinks shared by all exporters of one agent."""

    def __init__(self, procfs="/proc", sysfs="/sys", cgroupfs="/sys/fs/cgroup", rootfs="/",
                 node="", options=None, samples=None, lock=None, deadline=2.0):
        self.procfs = procfs
        self.sysfs = sysfs
        self.cgroupfs = cgroupfs
        self.rootfs = rootfs
        self.node = node
        self.options = options or {}
        self.samples = samples
        self.lock = lock or threading.RLock()  # the rank table's lock, for rank.extra
        self.deadline = deadline
        self.clock = time.monotonic  # tests substitute a fake clock for exact rates
        self.notes = {}  # exporter -> [message], for /api/v1/exporters
        self._noted = set()

    @classmethod
    def of_agent(cls, agent, deadline):
        c = agent.config
        return cls(procfs=c.procfs, sysfs=c.sysfs, cgroupfs=c.cgroupfs, rootfs=c.rootfs,
                   node=agent.table.node, options=c.options, samples=agent.samples,
                   lock=agent.table.lock, deadline=deadline)

    def option(self, name, default=None):
        value = self.options.get(name)
        return default if value is None else value

    def note(self, exporter, message):
        """Say something about this node once (a missing file, a partial signal)."""
        if (exporter, message) in self._noted:
            return
        self._noted.add((exporter, message))
        self.notes.setdefault(exporter, []).append(message)
        log("exporter %s: %s" % (exporter, message))

    def record(self, scope, signal, value, t_ns=None):
        if self.samples is not None and value is not None:
            self.samples.record(scope, signal, value, t_ns)

    def attribute(self, rank):
        """The Cgroup of the rank's main process; kept in ``rank.extra["json_cgroup"]``
        so /api/v1/ranks shows each rank's cgroup, pod UID and container ID."""
        cg = cgroups.of_pid(self.procfs, rank.pid) if rank.pid else None
        if cg is not None:
            doc = cg.as_json()
            if rank.extra.get("json_cgroup") != doc:
                self.set_extra(rank, "json_cgroup", doc)
        return cg

    def set_extra(self, rank, key, value):
        # RankState.as_json iterates rank.extra under the table lock.
        with self.lock:
            rank.extra[key] = value


def rank_node(ctx, rank):
    return rank.ident.get("node") or ctx.node


def pod_labels(ctx, rank):
    i = rank.ident
    return (i["job"], i["pod"], i["namespace"], rank_node(ctx, rank))


def node_labels(ctx, n):
    """Labels of a node-wide reading in a family whose label names are ``n`` long."""
    return ("",) * 3 + (ctx.node,) + ("",) * (n - 4)


class Exporter:
    """One node signal. Subclasses set ``name`` and implement ``collect``."""

    name = None

    def __init__(self, ctx):
        self.ctx = ctx

    def unavailable(self):
        """Why this signal cannot be read on this node (a short sentence), or None."""
        return None

    def collect(self, ranks):
        """Read the signal for ``ranks`` (RankState list); return metric families.
        Runs in the exporter's own thread; may also record samples and rank extras."""
        raise NotImplementedError

    def note(self, message):
        self.ctx.note(self.name, message)


class Rates:
    """Per-key previous readings, turning cumulative counters into per-second rates
    for the sample store (which keeps levels and rates, never raw counters)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.prev = {}
        self.seen = set()

    def delta(self, key, values):
        """values: tuple of counters → (dt_seconds, deltas) since the last call, or None
        the first time and after a counter went backwards (a new cgroup, a reset)."""
        now = self.ctx.clock()
        self.seen.add(key)
        old = self.prev.get(key)
        self.prev[key] = (now, values)
        if old is None:
            return None
        dt = now - old[0]
        deltas = tuple(a - b for a, b in zip(values, old[1]))
        if dt <= 0 or any(d < 0 for d in deltas):
            return None
        return dt, deltas

    def prune(self):
        """Forget keys not seen since the last prune (call once per collection)."""
        for key in [k for k in self.prev if k not in self.seen]:
            del self.prev[key]
        self.seen = set()


def proc_path(ctx, pid, *parts):
    return os.path.join(ctx.procfs, str(pid), *parts)
