"""The part contract.

A part handles hook reports, collects metric families, ticks on a schedule and may add
API routes, timeline fields and fields of its ranks' entries in ``/api/v1/ranks``. It
receives a ``Host`` (rank snapshot and lookup, the ranks' batch timelines, the sample
store, node identity, root paths) and its own typed options, never the agent; it keeps
its own state under its own lock. Reads across parts are explicit calls the
composition root wires, or facts one part publishes on the host for the others (facts.py:
a rank's GPU, its CPU quota).

Threads: ``handle`` runs in the ingest thread for every accepted report, ``tick`` in
the scheduler's, ``collect`` in a scrape's (or, for exporters, in the exporter's own
thread, off the scrape path), routes in an HTTP handler's.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, Protocol

from ..report import LoaderSettings
from .facts import Facts
from .report import HookReport

RankKey = tuple[str, str, str, int]   # (namespace, pod, job, rank)
Query = dict[str, list[str]]          # parsed query string
Route = Callable[[Query], tuple[int, Any]]


def log(message: str) -> None:
    """One line on the agent's stderr (its log in a DaemonSet)."""
    print("stallscope agent: %s" % message, file=sys.stderr, flush=True)


class ApiError(Exception):
    """An API answer other than 200: its status and the one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def one(query: Query, name: str, default: Any = None, convert: Callable[[str], Any] = str) -> Any:
    """One query parameter, converted; ApiError(400) when repeated or unconvertible, and
    when missing with ``default=ApiError``."""
    values = query.get(name)
    if not values:
        if default is ApiError:
            raise ApiError(400, "missing parameter %r" % name)
        return default
    if len(values) > 1:
        raise ApiError(400, "parameter %r given more than once" % name)
    try:
        return convert(values[0])
    except (TypeError, ValueError):
        raise ApiError(400, "parameter %r has a bad value %r" % (name, values[0][:64])) from None


def no_params(query: Query, allowed: Sequence[str] = ()) -> None:
    unknown = set(query) - set(allowed)
    if unknown:
        raise ApiError(400, "unknown parameters: %s" % ", ".join(sorted(unknown)))


class Rank(Protocol):
    """What a part may read of a rank (attributes of the rank table's entries)."""

    @property
    def key(self) -> RankKey: ...

    @property
    def ident(self) -> Mapping[str, Any]:
        """job, rank, local_rank, world_size, pod, namespace, node."""

    @property
    def labels(self) -> Mapping[str, str]:
        """The identity labels of its series."""

    @property
    def pid(self) -> int | None:
        """The main process, in the agent's PID namespace."""

    @property
    def uid(self) -> int | None: ...

    @property
    def cgroup(self) -> Any:
        """The main process's stallscope.system.cgroups.Cgroup, or None."""

    @property
    def worker_pids(self) -> list[int]:
        """Loader workers, in the agent's PID namespace."""

    @property
    def loader(self) -> LoaderSettings | None:
        """Its DataLoader's settings, as its trainer last reported them."""

    @property
    def exited(self) -> bool: ...


class Samples(Protocol):
    def record(self, scope: Any, signal: str, value: float, t_ns: int | None = None) -> None: ...

    def record_many(self, scope: Any, signal: str, t_ns: Any, values: Any) -> None:
        """Many points at once (sequences or numpy arrays of times and values)."""

    def window(self, scope: Any, signal: str, seconds: float | None = None) -> tuple[Any, Any]: ...

    def series(self, scope: Any, signal: str, seconds: float | None = None) -> list[tuple[int, float]]: ...

    def signals(self, scope: Any) -> list[str]: ...

    def drop_scope(self, scope: Any) -> None: ...


class Host(Protocol):
    """The narrow view of the agent that every part receives."""
    node: str
    procfs: str
    sysfs: str
    cgroupfs: str
    rootfs: str
    samples: Samples
    stopping: threading.Event
    notes: dict[str, list[str]]       # what note() said, by part
    facts: Facts                      # what one part learns of a rank for the others (facts.py)

    def ranks(self) -> list[Rank]: ...

    def find(self, **match: Any) -> list[Rank]: ...

    def timeline(self, rank: Rank, seconds: float, open_wait: bool = False) -> Any:
        """The rank's batch events of the last ``seconds`` as int64 columns (t_end, wait,
        interval, ready: the agent's BatchColumns), oldest first; ready is -1 where the
        hook did not split the wait (hook/transfer.py)."""

    def open_wait_end(self, rank: Rank) -> int | None:
        """t_end of the open wait a timeline(open_wait=True) ends with (a call still
        blocked in next()), or None."""

    def detection_news(self, rank: Rank) -> tuple[Any, ...]:
        """A value that changes whenever detection_input has news (a new batch, a call
        blocked in next() that grew): equal values, the same input up to the passing time."""
        ...

    def detection_input(self, rank: Rank, now_ns: int) -> tuple[Any, tuple[int, int, int] | None]:
        """(the rank's per-second wait bins up to ``now_ns``, its newest batch or the
        call still blocked in next()): what the change-point test reads
        (correlate/detect.py judge, correlate/waitbins.py)."""
        ...

    def clock(self) -> float: ...

    def note(self, part: str, message: str) -> None: ...


class Part:
    """Base of everything the agent hosts; every hook is optional."""

    name = ""
    interval = 0.0      # seconds between ticks; 0: never ticked
    isolated = False    # collected in its own thread off the scrape path (exporters)

    def __init__(self, host: Host) -> None:
        self.host = host
        self.lock = threading.RLock()

    def handle(self, report: HookReport, rank: Rank) -> None:
        """An accepted hook report of ``rank`` (ingest thread; keep it cheap)."""

    def tick(self) -> None:
        """Periodic work, every ``interval`` seconds (scheduler thread)."""

    def collect(self) -> Iterable[Any]:
        """Metric families (prometheus_client) for /metrics."""
        return ()

    def routes(self) -> dict[str, Route]:
        """{path: fn(query) -> (status, body)} added to the agent's API."""
        return {}

    def timeline_fields(self, rank: Rank, seconds: float) -> dict[str, Any]:
        """Fields of ``rank``'s ``/api/v1/timeline`` answer."""
        return {}

    def rank_fields(self, rank: Rank) -> dict[str, Any]:
        """Fields of ``rank``'s entry in ``/api/v1/ranks``."""
        return {}

    def forget(self, key: RankKey) -> None:
        """``key`` left the rank table: drop what is kept for it."""

    def note(self, message: str) -> None:
        """Say something about this node once (a missing file, a partial signal)."""
        self.host.note(self.name, message)
