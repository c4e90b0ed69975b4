"""The agent's side of the part contract: the ``Host`` every part receives (a narrow
view of the rank table and the sample store, node identity and root paths), and the
fan-out of reports, ticks, scrapes and API fields to the parts.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..host import Part, log
from ..host.facts import Facts
from ..host.families import family
from ..host.report import HookReport
from .table.rankstate import RankState
from .table.samples import SampleStore
from .table.state import RankTable
from .web.exposition import Exposition

NOTES_KEPT = 32  # a part's newest notes, for /api/v1/exporters; each is also logged

class AgentHost:
    """What parts may use of the agent (stallscope.host.Host)."""

    def __init__(self, table: RankTable, samples: SampleStore, procfs: str = "/proc",
                 sysfs: str = "/sys", cgroupfs: str = "/sys/fs/cgroup", rootfs: str = "/",
                 stopping: threading.Event | None = None) -> None:
        self.table = table
        self.samples = samples
        self.node = table.node
        self.procfs, self.sysfs, self.cgroupfs, self.rootfs = procfs, sysfs, cgroupfs, rootfs
        self.stopping = stopping or threading.Event()
        self.notes: dict[str, list[str]] = {}
        self.facts = Facts()
        self._noted: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def ranks(self) -> list[RankState]:
        return self.table.snapshot()

    def find(self, **match: Any) -> list[RankState]:
        return self.table.find(**match)

    def timeline(self, rank: RankState, seconds: float, open_wait: bool = False) -> Any:
        """The rank's batch events as columns (agent/table/batches.py BatchColumns: t_end,
        wait, interval, ready; ready -1 where the wait was not split), oldest first."""
        return self.table.timeline(rank, seconds, open_wait)

    def open_wait_end(self, rank: RankState) -> int | None:
        """t_end of the open wait a timeline(open_wait=True) ends with, or None."""
        return self.table.open_wait_end(rank)

    def detection_news(self, rank: RankState) -> Any:
        """(newest batch, blocked call) of the rank (RankTable.detection_news)."""
        return self.table.detection_news(rank)

    def detection_input(self, rank: RankState, now_ns: int) -> Any:
        """(bins, newest batch) for the change-point test (RankTable.detection_input)."""
        return self.table.detection_input(rank, now_ns)

    def clock(self) -> float:
        return time.monotonic()

    def note(self, part: str, message: str) -> None:
        """Say something about this node once (a missing file, a partial signal). Notes
        may name a pod's cgroup (cfs): kept are a part's NOTES_KEPT newest, and what was
        said is remembered for 32 x that, so pods that come and go cannot grow them."""
        with self._lock:
            if (part, message) in self._noted:
                return
            if len(self._noted) >= 32 * NOTES_KEPT:
                self._noted.clear()  # at worst a note is said once more
            self._noted.add((part, message))
            kept = self.notes.setdefault(part, [])
            kept.append(message)
            del kept[:-NOTES_KEPT]
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
        self.errors: dict[str, int] = {}
        self.exposition = Exposition()  # generate_latest's bytes, faster (exposition.py)
        self.http: Any = None  # the HTTP server's counters (httppool.Stats), set by the agent

    def handle(self, report: HookReport, rank: RankState) -> None:
        for p in self.handlers:
            p.handle(report, rank)

    def forget(self, keys: Iterable[Any]) -> None:
        for key in keys:
            self.host.samples.drop_scope(key)
            self.host.facts.drop(key)
            for p in self.parts:
                p.forget(key)

    def routes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.parts:
            for path, fn in p.routes().items():
                if path in out:
                    raise ValueError("route %s added twice" % path)
                out[path] = fn
        return out

    def timeline_fields(self, rank: RankState, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.parts:
            out.update(p.timeline_fields(rank, seconds))
        return out

    def rank_fields(self, rank: RankState) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.parts:
            out.update(p.rank_fields(rank))
        return out

    def jobs(self) -> list[tuple[float, Any]]:
        return [(p.interval, p.tick) for p in self.parts if p.interval > 0 and not p.isolated]

    # -- /metrics: one collector per part, so one part's failure costs only its series;
    # isolated parts (exporters) are collected by their runner, off the scrape path.
    def collectors(self) -> list[PartCollector]:
        return [PartCollector(self, p) for p in self.parts if not p.isolated]

    def render(self) -> bytes:
        """The /metrics exposition, rendered part by part: a part whose series cannot be
        collected or encoded is left out and counted, the others are served. The same
        bytes as generate_latest(registry) (tests/agent/test_exposition.py)."""
        out = []
        for c in self.collectors() + [self]:
            try:
                out.append(self.exposition.render(c.collect()))
            except Exception as e:
                name = c.part.name if isinstance(c, PartCollector) else "agent"
                self.errors[name] = self.errors.get(name, 0) + 1
                log("part %s: its series could not be rendered: %s: %s" % (name, type(e).__name__, e))
        self.exposition.settle()
        return b"".join(out)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        """The agent's own health: scrape-time failures of each part, and its HTTP server's
        connections and answers."""
        f = family("stallscope_agent_part_errors_total")
        for p in self.parts:
            f.add({}, self.errors.get(p.name, 0), part=p.name)
        yield f.family
        if self.http is not None:
            yield from http_families(self.http)


def http_families(stats: Any) -> Iterator[Any]:
    """Every reason and class from the start (at 0), so that rate() sees the first one."""
    f = family("stallscope_agent_http_connections")
    f.add({}, stats.open)
    yield f.family
    f = family("stallscope_agent_http_connections_dropped_total")
    for reason, n in stats.dropped.items():
        f.add({}, n, reason=reason)
    yield f.family
    f = family("stallscope_agent_http_requests_total")
    for klass, n in sorted(stats.requests.items()):
        f.add({}, n, code=klass)
    yield f.family


class PartCollector:
    def __init__(self, parts: Parts, part: Part) -> None:
        self.parts = parts
        self.part = part

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        try:
            return list(self.part.collect())
        except Exception as e:  # one part's bug must not take /metrics down
            name = self.part.name
            self.parts.errors[name] = self.parts.errors.get(name, 0) + 1
            log("part %s failed to collect: %s: %s" % (name, type(e).__name__, e))
            return []
