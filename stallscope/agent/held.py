"""Loader workers' reports that arrive before their trainer's first report.

A DataLoader worker flushes on its own beat (and at exit), so its first report can
reach the agent before the trainer's: the rank does not exist yet, and a worker may not
create one (identity.py). Such reports are held, bounded in number and age, and applied
when the trainer's report makes the rank; those that wait longer than HOLD_S are refused
as ``unknown_rank``. Nothing a real worker sends is lost to the race.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

HOLD_S = 10.0
MAX_HELD = 2048
HELD = object()  # what the agent's apply returns for a held report (counted when applied)


class Held:
    """Thread-safe: the ingest thread holds and takes, the jobs thread expires (a 1M-message
    fuzz run caught ``deque mutated during iteration`` between them before the lock)."""

    def __init__(self, hold_s: float = HOLD_S, max_held: int = MAX_HELD) -> None:
        self.hold_s = hold_s
        self.max_held = max_held
        self.items: collections.deque[tuple[float, tuple[Any, ...], Any, Any]] = collections.deque()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def hold(self, key: tuple[Any, ...], msg: Any, source: Any, now: float | None = None) -> bool:
        """Keep ``msg`` for ``key``; False (refuse it) when full."""
        with self.lock:
            if len(self.items) >= self.max_held:
                return False
            self.items.append((time.monotonic() if now is None else now, key, msg, source))
            return True

    def take(self, key: tuple[Any, ...]) -> list[tuple[Any, Any]]:
        """The held (msg, source) of ``key``, oldest first, removed."""
        with self.lock:
            mine = [(m, s) for _, k, m, s in self.items if k == key]
            if mine:
                self.items = collections.deque(x for x in self.items if x[1] != key)
            return mine

    def expire(self, on_expired: Callable[[], None], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        expired = 0
        with self.lock:
            while self.items and now - self.items[0][0] > self.hold_s:
                self.items.popleft()
                expired += 1
        for _ in range(expired):
            on_expired()
