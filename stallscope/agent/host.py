"""The agent's side of the part contract: the ``Host`` every part receives (a narrow
view of the rank table and the sample store, node identity and root paths), and the
fan-out of reports, ticks, scrapes and API fields to the parts.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from ..host import Part, log
from ..host.families import family
from .samples import SampleStore
from .state import Event, RankState, RankTable


class AgentHost:
    """What parts may use of the agent (stallscope.host.Host)."""

    def __init__(self, table: RankTable, samples: SampleStore, procfs: str = "/proc",
                 sysfs: str = "/sys", cgroupfs: str = "/sys/fs/cgroup", rootfs: str = "/",
                 stopping: Optional[threading.Event] = None) -> None:
        self.table = table
        self.samples = samples
        self.node = table.node
        self.procfs, self.sysfs, self.cgroupfs, self.rootfs = procfs, sysfs, cgroupfs, rootfs
        self.stopping = stopping or threading.Event()
        self.notes: Dict[str, List[str]] = {}
        self._noted: Set[Tuple[str, str]] = set()
        self._lock = threading.Lock()

    def ranks(self) -> List[RankState]:
        return self.table.snapshot()

    def find(self, **match: Any) -> List[RankState]:
        return self.table.find(**match)

    def timeline(self, rank: RankState, seconds: float) -> List[Event]:
        return self.table.timeline(rank, seconds)

    def clock(self) -> float:
        return time.monotonic()

    def note(self, part: str, message: str) -> None:
        """Say something about this node once (a missing file, a partial signal)."""
        with self._lock:
            if (part, message) in self._noted:
                return
            self._noted.add((part, message))
            self.notes.setdefault(part, []).append(message)
        log("%s: %s" % (part, message))


class Parts:
    """The parts of one agent, and the fan-out of everything to them."""

    def __init__(self, host: AgentHost, parts: Sequence[Part]) -> None:
        self.host = host
        self.parts = list(parts)
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError("parts need distinct names: %s" % names)
        self.handlers = [p for p in self.parts if type(p).handle is not Part.handle]
        self.errors: Dict[str, int] = {}

    def handle(self, report: Any, rank: RankState) -> None:
        for p in self.handlers:
            p.handle(report, rank)

    def forget(self, keys: Iterable[Any]) -> None:
        for key in keys:
            self.host.samples.drop_scope(key)
            for p in self.parts:
                p.forget(key)

    def routes(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for p in self.parts:
            for path, fn in p.routes().items():
                if path in out:
                    raise ValueError("route %s added twice" % path)
                out[path] = fn
        return out

    def timeline_fields(self, rank: RankState, seconds: float) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for p in self.parts:
            out.update(p.timeline_fields(rank, seconds))
        return out

    def rank_fields(self, rank: RankState) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for p in self.parts:
            out.update(p.rank_fields(rank))
        return out

    def jobs(self) -> List[Tuple[float, Any]]:
        return [(p.interval, p.tick) for p in self.parts if p.interval > 0 and not p.isolated]

    # -- /metrics: one collector per part, so one part's failure costs only its series;
    # isolated parts (exporters) are collected by their runner, off the scrape path.
    def collectors(self) -> List["PartCollector"]:
        return [PartCollector(self, p) for p in self.parts if not p.isolated]

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        """The agent's own health: scrape-time failures of each part."""
        f = family("stallscope_agent_part_errors_total")
        for p in self.parts:
            f.add({}, self.errors.get(p.name, 0), part=p.name)
        yield f.family


class PartCollector:
    def __init__(self, parts: Parts, part: Part) -> None:
        self.parts = parts
        self.part = part

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> List[Any]:
        try:
            return list(self.part.collect())
        except Exception as e:  # one part's bug must not take /metrics down
            name = self.part.name
            self.parts.errors[name] = self.parts.errors.get(name, 0) + 1
            log("part %s failed to collect: %s: %s" % (name, type(e).__name__, e))
            return []
