"""Facts on the host (issue 29): what one part learns about a rank and others need,
published as a typed value with when and by whom, instead of attribute wiring between
parts in the composition root.

A fact's kind is a frozen dataclass declared here, the contract between the part that
publishes it and those that read it; a reader asks ``host.facts.get(Kind, rank_key)``
when it needs the fact, so the order parts start and collect in decides nothing: a fact
is there from the moment its publisher learnt it (the GPU of a rank from its trainer's
first report, handled on ingest before any collection sees the rank), and absent means
"not measured" (its publisher is off, or has not learnt it yet), never "none".
Facts of a rank go when the rank leaves the table (``drop``).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RankGpu:
    """The GPU a rank drives (gpu exporter): its UUID as NVML and the NVIDIA driver's
    ``/proc/driver/nvidia/gpus/<bdf>/information`` name it, its index label, where its
    samples come from (nvml, dcgm, simulated) and how the rank was matched to it."""
    uuid: str
    index: str
    source: str
    via: str


@dataclasses.dataclass(frozen=True)
class RankQuota:
    """The CFS quota over a rank's loader (cfs exporter): cores (None: no quota) and the
    ranks whose main process shares that cgroup."""
    cores: float | None
    ranks: int | None


@dataclasses.dataclass(frozen=True)
class RankIoLimit:
    """The bytes a second a rank's cgroup may read from a block device (iolimit exporter):
    the tightest along its ancestors, None for no limit."""
    read_bytes_per_second: float | None


@dataclasses.dataclass(frozen=True)
class RankCpuset:
    """Whether a rank's pod has CPUs of its own (cpuset exporter): its QoS class from the
    cgroup path (None off Kubernetes), the CPUs its container's cpuset allows, whether no
    other container shares them (and they are fewer than the node's), and how many of
    them the node's FUSE daemons may also run on."""
    qos: str | None
    cpus: int
    exclusive: bool
    fuse_daemon_cpus: int


@dataclasses.dataclass(frozen=True)
class RankMemory:
    """What more loader workers would cost in memory (workers exporter; issue 30: worker
    counts capped by memory): the limit of the rank's memory cgroup (None: no limit),
    what the cgroup uses now, and the largest live worker's RSS, what each added worker is
    taken to need (RSS counts the pages it shares with the process it was forked from:
    an upper bound)."""
    limit_bytes: int | None
    used_bytes: int | None
    worker_rss_bytes: int | None


@dataclasses.dataclass(frozen=True)
class RankShm:
    """The /dev/shm a rank's loader workers pass batches through (shm exporter): its
    size in the rank's mount namespace (issue 32: the shm_too_small check)."""
    size_bytes: int


@dataclasses.dataclass(frozen=True)
class Fact(Generic[T]):
    value: T
    at: float           # monotonic seconds when it was published
    by: str             # the publishing part

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.at


class Facts:
    """The host's fact store: one value per (kind, rank key), the newest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[tuple[type, Hashable], Fact[object]] = {}

    def publish(self, by: str, key: Hashable, value: object, at: float | None = None) -> None:
        fact = Fact(value, time.monotonic() if at is None else at, by)
        with self._lock:
            self._facts[(type(value), key)] = fact

    def get(self, kind: type[T], key: Hashable) -> Fact[T] | None:
        with self._lock:
            fact = self._facts.get((kind, key))
        return fact  # type: ignore[return-value]  # stored under its own type

    def value(self, kind: type[T], key: Hashable) -> T | None:
        fact = self.get(kind, key)
        return fact.value if fact is not None else None

    def withdraw(self, kind: type, key: Hashable) -> None:
        with self._lock:
            self._facts.pop((kind, key), None)

    def drop(self, key: Hashable) -> None:
        """Every fact about a rank that left."""
        with self._lock:
            for k in [k for k in self._facts if k[1] == key]:
                del self._facts[k]
