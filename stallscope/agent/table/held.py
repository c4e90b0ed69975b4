"""Loader workers' reports that arrive before their trainer's first report.

A DataLoader worker flushes on its own beat (and at exit), so its first report can
reach the agent before the trainer's: the rank does not exist yet, and a worker may not
create one (peer.py). Such reports are held, bounded in number, bytes and age, and
applied when the trainer's report makes the rank; those that wait longer than HOLD_S are
refused as ``unknown_rank``. Nothing a real worker sends is lost to the race.

Anyone on the node may send worker reports for ranks that never come, so what is held
is the sender's to fill and must not be able to take the agent down (issue 33: 400
reports of 64 KiB padded with nested JSON, held whole as parsed, took the agent from 59
to 873 MB RSS, past the DaemonSet's limit). So a held report keeps only the fields the
parts will read of it (the validated report and, of the rest of its message, the shard
reads' ``io`` as compact JSON, decoded again when it is applied), its bytes are counted
(its batch columns too), and the held
bytes are bounded in total (MAX_HELD_BYTES, part of the memory ceiling: budget.py) and
per sender domain (MAX_HELD_BYTES_PER_DOMAIN), so one sender filling its share leaves
the others theirs. A report past a bound is refused as ``held_limit``.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from typing import Any, Callable

from ...host.report import HookReport

HOLD_S = 10.0
MAX_HELD = 2048
MAX_HELD_BYTES = 8 << 20             # all senders together (budget.py counts it)
MAX_HELD_BYTES_PER_DOMAIN = 1 << 20  # one pod (or cgroup and uid): ~250 real first reports
HELD = object()  # what the agent's apply returns for a held report (counted when applied)

# What a held report costs beyond its arrays and its io: the report, the identity's
# strings (at most 128 characters each: validate.py), the loader settings.
ENTRY_BYTES = 2048
INT_BYTES = 40  # a Python int in a list: the object and its pointer

# Of the message beyond the validated report (HookReport.raw), what is kept.
RAW_KEPT = ("io",)  # shards.py reads a worker's shard reads; nothing else of raw is a worker's


class Slim:
    """A held report: the report it will be applied as, and what it costs."""

    __slots__ = ("report", "raw", "nbytes")

    def __init__(self, report: HookReport) -> None:
        self.report = dataclasses.replace(report, raw={})
        kept = {k: report.raw[k] for k in RAW_KEPT if k in report.raw}
        self.raw = json.dumps(kept, separators=(",", ":")).encode() if kept else b""
        loader = report.loader
        ints = len(loader.worker_pids) + 3 * len(loader.worker_exits) if loader is not None else 0
        self.nbytes = ENTRY_BYTES + len(self.raw) + INT_BYTES * ints + report.events.nbytes

    def message(self) -> HookReport:
        return dataclasses.replace(self.report, raw=json.loads(self.raw) if self.raw else {})


Entry = tuple[float, tuple[Any, ...], Slim, Any, Any]  # (when, key, slim, source, domain)


class Held:
    """Thread-safe: the ingest thread holds and takes, the jobs thread expires (a 1M-message
    fuzz run caught ``deque mutated during iteration`` between them before the lock)."""

    def __init__(self, hold_s: float = HOLD_S, max_held: int = MAX_HELD,
                 max_bytes: int = MAX_HELD_BYTES,
                 max_bytes_per_domain: int = MAX_HELD_BYTES_PER_DOMAIN) -> None:
        self.hold_s = hold_s
        self.max_held = max_held
        self.max_bytes = max_bytes
        self.max_bytes_per_domain = max_bytes_per_domain
        self.items: collections.deque[Entry] = collections.deque()
        self.nbytes = 0
        self.by_domain: collections.Counter[Any] = collections.Counter()  # held bytes
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def hold(self, key: tuple[Any, ...], report: HookReport, source: Any,
             now: float | None = None) -> bool:
        """Keep what the parts will read of ``report`` for ``key``; False (refuse it) when
        a bound is reached: the number of held reports, their bytes, or the sender's share."""
        slim = Slim(report)
        domain = getattr(source, "domain", None)
        with self.lock:
            if len(self.items) >= self.max_held or self.nbytes + slim.nbytes > self.max_bytes \
                    or self.by_domain[domain] + slim.nbytes > self.max_bytes_per_domain:
                return False
            self.items.append((time.monotonic() if now is None else now, key, slim, source, domain))
            self._count(domain, slim.nbytes)
            return True

    def _count(self, domain: Any, nbytes: int) -> None:
        self.nbytes += nbytes
        self.by_domain[domain] += nbytes
        if self.by_domain[domain] <= 0:
            del self.by_domain[domain]  # a domain holding nothing keeps no entry

    def take(self, key: tuple[Any, ...]) -> list[tuple[HookReport, Any]]:
        """The held (report, source) of ``key``, oldest first, removed."""
        with self.lock:
            mine = [x for x in self.items if x[1] == key]
            if mine:
                self.items = collections.deque(x for x in self.items if x[1] != key)
                for x in mine:
                    self._count(x[4], -x[2].nbytes)
        return [(x[2].message(), x[3]) for x in mine]

    def expire(self, on_expired: Callable[[], None], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        expired = 0
        with self.lock:
            while self.items and now - self.items[0][0] > self.hold_s:
                x = self.items.popleft()
                self._count(x[4], -x[2].nbytes)
                expired += 1
        for _ in range(expired):
            on_expired()
