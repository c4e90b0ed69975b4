"""What every exporter shares: the base class and small helpers. An exporter is a part
(stallscope.host.Part) that reads one node signal in ``collect()``; the runner
(runner.py) calls it on a schedule in its own thread, off the scrape path, and serves
its last result. It reads ranks from the host, records samples for the correlator, and
may add rank fields, timeline fields and routes like any part.

Label sets come from the vocabulary (stallscope/vocabulary/labels.py): series of a
cgroup or a pod carry pod labels and are exported once per cgroup/pod however many
ranks share it; node-wide readings leave the pod labels empty (``{pod=""}``).
"""
from __future__ import annotations

import time
from collections.abc import Hashable, Iterable
from typing import Any, NamedTuple

from ..host import Part
from ..system import cgroups, procfs
from ..vocabulary import labels

# Where the cgroup hierarchies are mounted is looked at again this often: listing and
# stat-ing the cgroupfs's every entry in each collection (and again in unavailable())
# was a tenth of the cfs and cpuset exporters' cost (benchmarks/bench_exporters.py).
LAYOUT_S = 30.0


class Exporter(Part):
    """One node signal. Subclasses set ``name`` and implement ``collect``; ``Options``
    is the dataclass of their own flags (stallscope.host.options), or None."""

    isolated = True
    Options: Any = None
    deadline = 2.0  # the runner's --exporter.timeout, set when it takes the exporter

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host)
        self.options = options if options is not None else (
            self.Options() if self.Options is not None else None)

    def unavailable(self) -> str | None:
        """Why this signal cannot be read on this node (a short sentence), or None."""
        return None

    def record(self, scope: Any, signal: str, value: float | None, t_ns: int | None = None) -> None:
        if value is not None:
            self.host.samples.record(scope, signal, value, t_ns)

    def cgroup_layout(self) -> Any:
        """The node's cgroup layout (system/cgroups.py Layout), at most LAYOUT_S old."""
        now = time.monotonic()
        held = getattr(self, "_layout", None)
        if held is None or now - held[0] >= LAYOUT_S:
            held = self._layout = (now, cgroups.Layout(self.host.cgroupfs))  # type: ignore[no-untyped-call]
        return held[1]

    def proc(self, pid: Any, *parts: str) -> str:
        return procfs.pid_path(self.host.procfs, pid, *parts)

    @property
    def node_labels(self) -> dict[str, str]:
        """Labels of a node-wide reading: only ``node`` set."""
        return {"node": self.host.node}


class Rates:
    """Per-key previous readings, turning cumulative counters into per-second rates
    for the sample store (which keeps levels and rates, never raw counters)."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.prev: dict[Hashable, tuple[float, tuple[float, ...]]] = {}
        self.seen: set = set()  # type: ignore[type-arg]

    def delta(self, key: Hashable, values: tuple[float, ...]) -> tuple[float, tuple[float, ...]] | None:
        """values: tuple of counters -> (dt_seconds, deltas) since the last call, or None
        the first time and after a counter went backwards (a new cgroup, a reset)."""
        now = self.host.clock()
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

    def prune(self) -> None:
        """Forget keys not seen since the last prune (call once per collection)."""
        for key in [k for k in self.prev if k not in self.seen]:
            del self.prev[key]
        self.seen = set()


_Reading = tuple[Hashable, tuple[float, ...]]  # a worker's (start time, counter values)


class Counted(NamedTuple):
    """One rank's counters after a collection: ``total`` over every worker generation
    since the rank was first seen, ``moved`` since its previous collection, and
    ``seconds`` between the two (None at the rank's first)."""
    total: tuple[float, ...]
    moved: tuple[float, ...]
    seconds: float | None


class WorkerCounters:
    """Counters read from each of a rank's changing workers (CPU time, bytes read, page
    faults), summed into one counter per rank that only grows, whatever comes and goes:
    non-persistent workers are replaced every epoch, a PID may be reused.

    A worker is known by its PID and start time (``start``; a reused PID is another
    worker). Where the start time is not read (None), a counter that went backwards is
    a new process under that PID. A worker first seen after its rank's first collection
    started since, so it is counted from 0 (what a generation did before the first
    reading is not lost); the workers of the rank's first collection are counted from 0
    too when ``before_first`` (CPU time: all of a worker's life is the loader's), else
    they are the baseline (bytes read before the agent looked, which would show as a
    burst). A worker not read in a collection has ended and is forgotten: what it did
    after its last reading is not counted (one collection interval, at most)."""

    def __init__(self, host: Any, width: int = 1, before_first: bool = False) -> None:
        self.host = host
        self.width = width
        self.before_first = before_first
        # rank key -> (totals, when last updated, {pid: (start, values)})
        self.ranks: dict[Hashable, tuple[list[float], float, dict[int, _Reading]]] = {}

    def update(self, key: Hashable,
               readings: Iterable[tuple[int, Hashable, tuple[float, ...]]]) -> Counted:
        """Fold one collection's readings of rank ``key``'s workers, ``(pid, start time
        or None, counter values)`` each, into its totals."""
        now = self.host.clock()
        held = self.ranks.get(key)
        first = held is None
        totals, then, known = held if held is not None else ([0.0] * self.width, now, {})
        moved = [0.0] * self.width
        workers: dict[int, _Reading] = {}
        for pid, start, values in readings:
            old = known.get(pid)
            if old is not None and (start is None or old[0] == start) and \
                    all(v >= o for v, o in zip(values, old[1])):
                since = tuple(v - o for v, o in zip(values, old[1]))
            elif first and not self.before_first:
                since = (0.0,) * self.width
            else:
                since = tuple(values)
            for i, d in enumerate(since):
                moved[i] += d
            workers[pid] = (start, tuple(values))
        for i, d in enumerate(moved):
            totals[i] += d
        self.ranks[key] = (totals, now, workers)
        seconds = now - then if not first and now > then else None
        return Counted(tuple(totals), tuple(moved), seconds)

    def knows(self, key: Hashable) -> bool:
        return key in self.ranks

    def total(self, key: Hashable) -> tuple[float, ...] | None:
        held = self.ranks.get(key)
        return tuple(held[0]) if held is not None else None

    def prune(self, keys: Iterable[Hashable]) -> None:
        """Forget the ranks not in ``keys`` (call once per collection)."""
        keep = set(keys)
        for key in [k for k in self.ranks if k not in keep]:
            del self.ranks[key]


class PodTotals:
    """Counters summed per pod over its ranks (``WorkerCounters``' ``moved``), exported
    with pod labels: off the per-rank series budget, and only growing while the pod has
    ranks (a rank that ends leaves what it counted); a pod with no rank left is
    forgotten."""

    def __init__(self, width: int = 1) -> None:
        self.width = width
        self.totals: dict[tuple[str, ...], list[float]] = {}
        self.seen: set[tuple[str, ...]] = set()

    def add(self, rank: Any, moved: tuple[float, ...]) -> None:
        """Add a rank's ``moved`` to its pod's counters (call for each rank a collection)."""
        pod = labels.values(labels.POD, rank.labels)
        self.seen.add(pod)
        total = self.totals.setdefault(pod, [0.0] * self.width)
        for i, d in enumerate(moved):
            total[i] += d

    def rows(self) -> list[tuple[tuple[str, ...], tuple[float, ...]]]:
        """(pod label values, totals) of the pods seen since the last call, in order;
        the others are forgotten."""
        self.totals = {p: t for p, t in self.totals.items() if p in self.seen}
        self.seen = set()
        return [(p, tuple(t)) for p, t in sorted(self.totals.items())]
