"""A rank's batch events as int64 columns, from the wire to the correlator (issue 29).

The hook sends its events as columns (hook/wire.py version 2: t_end, wait, interval and,
from a trainer that splits its waits, the ready wait); validation checks them as
columns, the rank table's timeline keeps them as columns, and the correlator's trace
takes them as columns (``RankTrace.from_columns``): no transpose to rows and back.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..host.rings import Ring


@dataclasses.dataclass(frozen=True)
class BatchColumns:
    """Batch events, one element per batch in each 1-D int64 column (ns): the loop was
    blocked in ``next()`` during ``[t_end - wait, t_end]``, ``interval`` is the time since
    the previous batch's ``t_end``. ``ready``: of each wait, the part spent waiting for a
    worker's batch to be ready (-1 where the hook did not split it); None when no event
    of the report carries one."""
    t_end: np.ndarray
    wait: np.ndarray
    interval: np.ndarray
    ready: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.t_end)

    @classmethod
    def empty(cls) -> BatchColumns:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, None)

    @classmethod
    def of(cls, events: Any) -> BatchColumns:
        """``events`` as columns: as they are when they are (every validated message's),
        else from rows of (t_end, wait, interval[, ready]) (a message built in code: the
        tests', the benchmarks')."""
        if isinstance(events, BatchColumns):
            return events
        rows = np.asarray(events, np.int64)
        if not rows.size:
            return cls.empty()
        rows = rows.reshape(len(rows), -1)
        return cls(rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(),
                   rows[:, 3].copy() if rows.shape[1] > 3 else None)

    def rows(self, ready: bool = False) -> np.ndarray:
        """(n, 3) rows of (t_end, wait, interval), or (n, 4) with the ready wait (-1 where
        not split), for a reader that wants rows."""
        cols = (self.t_end, self.wait, self.interval) + ((self.ready_or_unsplit(),) if ready else ())
        return np.stack(cols, axis=1)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # What np.asarray makes of the events: their (n, 3) rows. The simulated GPU
        # (exporters/gpu/sim.py) keeps rows; it runs in the lab and tests only.
        rows = self.rows()
        return rows if dtype is None else rows.astype(dtype)

    def ready_or_unsplit(self) -> np.ndarray:
        """The ready column, -1 throughout where the hook did not split the waits."""
        return self.ready if self.ready is not None else np.full(len(self), -1, np.int64)


class BatchTimeline:
    """The last ``capacity`` batch events of a rank, one ring per column (a (capacity, 1)
    ring is contiguous), so a window comes out as contiguous columns."""

    __slots__ = ("t_end", "wait", "interval", "ready")

    def __init__(self, capacity: int) -> None:
        self.t_end = Ring(capacity, 1)
        self.wait = Ring(capacity, 1)
        self.interval = Ring(capacity, 1)
        self.ready = Ring(capacity, 1)

    @property
    def nbytes(self) -> int:
        return self.t_end.nbytes * 4

    def __len__(self) -> int:
        return len(self.t_end)

    def extend(self, batches: BatchColumns) -> None:
        self.t_end.extend(batches.t_end.reshape(-1, 1))
        self.wait.extend(batches.wait.reshape(-1, 1))
        self.interval.extend(batches.interval.reshape(-1, 1))
        self.ready.extend(batches.ready_or_unsplit().reshape(-1, 1))

    def tail(self, k: int) -> BatchColumns:
        """Events from index ``k`` (oldest = 0) to the newest, as copies."""
        return BatchColumns(self.t_end.tail(k)[:, 0], self.wait.tail(k)[:, 0],
                            self.interval.tail(k)[:, 0], self.ready.tail(k)[:, 0])

    def since(self, horizon_ns: int) -> BatchColumns:
        """Events that ended at or after ``horizon_ns``, oldest first."""
        return self.tail(self.t_end.first_at(horizon_ns))

    def newest(self) -> tuple[int, int, int] | None:
        """(t_end, wait, interval) of the newest event, or None."""
        n = len(self)
        if not n:
            return None
        last = self.tail(n - 1)
        return int(last.t_end[0]), int(last.wait[0]), int(last.interval[0])

    def rows(self) -> np.ndarray:
        """Every event held as (n, 4) rows of (t_end, wait, interval, ready), for tests."""
        return self.tail(0).rows(ready=True)
