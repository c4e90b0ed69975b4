"""One stream of batch events: the batches of one iterator (one epoch of one watched
loader), from the loop's appended times to events ready for delivery (channel.py).

The training loop only appends two integers to ``buf`` per batch (loop.py); the flush
thread drains them into columns (``pending``: end, wait, interval, and the ready wait
where transfer.py splits the waits), with no Python object per batch.
"""
from __future__ import annotations

import sys
import weakref
from array import array
from itertools import chain
from operator import sub

from . import transfer, wire

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable

    from .identity import Ident

# A worker's stream goes before its WORKER_FLUSH_S (the report cadences, stallscope/cadence.py)
# when the mean load time of its batches since then moved by this factor from its last report's
# (MOVED_MIN_BATCHES batches at least): a loader that slows is news for the stall's cause
# at once (the detector names a 50 % stall in ~3 s; with only the load
# times from before it, its cause read "unexplained").
MOVED = 1.5
MOVED_MIN_BATCHES = 3
# A trainer's stream goes before its TRAINER_FLUSH_S (stallscope/cadence.py) when the share of its
# time spent waiting in next() since its last report moved by SHARE_MOVED_ABS, or by
# SHARE_MOVED_REL of the last report's share if more: a stall that begins or ends is the
# detector's news (a 10 % stall's share rises by ~0.1 against a healthy rank's ~0.01;
# a steady rank's per-report share wanders by a few hundredths).
SHARE_MOVED_ABS = 0.05
SHARE_MOVED_REL = 0.25
# Per stream, at most this many batches wait for delivery; past it the oldest are
# dropped (and counted), so a process that never reaches an agent keeps bounded memory.
MAX_PENDING = 50_000


class Stream:
    """The batches of one iterator (one epoch of one watched loader)."""

    __slots__ = ("buf", "pending", "ident", "role", "loader", "cuda", "prev_end", "owner",
                 "last_sent", "sent", "sent_load", "sent_share", "blocked_since", "polls", "nested",
                 "__weakref__")

    def __init__(self, ident: Ident, role: str = "main", owner: object = None) -> None:
        self.buf: list[int] = []  # flat [start, end, start, end, ...] appended by the loop
        self.pending = wire.Columns()  # (end, wait, interval) from buf, not yet delivered
        self.ident = ident
        self.role = role
        self.loader: dict[str, object] | None = None  # DataLoader settings (watch.loader_info)
        self.cuda: dict[str, int | str] | None = None  # the loop's CUDA device (hook/device.py)
        self.prev_end: int | None = None
        self.blocked_since: int | None = None  # start of a next() call still in progress
        # The stream ends when its owner goes away; a weakref.ref, or None for never.
        self.owner: Callable[[], object] | None = weakref.ref(owner) if owner is not None else None
        self.last_sent = 0.0
        self.sent = 0  # messages delivered (a worker's first ones come sooner: channel.py)
        self.sent_load: float | None = None  # mean wait (a worker's: load time) last sent
        self.sent_share: float | None = None  # the wait share of the last report's batches
        # The loader's queue polls, flat [start, end, ...] (hook/transfer.py), when the
        # waits are split into waiting for a ready batch and transfer; nested: every poll
        # lies inside one next() call (the loop polls itself).
        self.polls: list[int] | None = None
        self.nested = True

    def split(self, polls: list[int], nested: bool) -> bool:
        """Split this stream's waits with ``polls``; only before its first batch, so that
        every event it sends carries the ready wait."""
        # A lone start in buf is the first next() still in progress (claim.py settles a
        # hidden iterator there): its polls are in ``polls`` already.
        if self.pending or len(self.buf) > 1 or self.prev_end is not None:
            return False
        self.pending = wire.Columns(ready=True)
        self.polls, self.nested = polls, nested
        return True

    def finished(self) -> bool:
        return self.owner is not None and self.owner() is None

    def drain(self) -> int:
        """Turn the loop's appended times into pending events; returns how many of the
        oldest were dropped past MAX_PENDING."""
        buf = self.buf
        events = self.pending
        if self.polls is None and sys.byteorder == "little":  # the fields' order (wire.py)
            # Two appends per batch (start, end); the loop may append more meanwhile, and
            # may be between the two: take what is there in one C call (the GIL keeps it
            # whole), then its even part. Only a start that was never paired is ever
            # popped, and it lies past that part (loop.py).
            taken = array("Q")
            try:
                taken.fromlist(buf)
            except (OverflowError, TypeError):  # never from perf_counter_ns: the lists' way
                return self._drain_lists()
            n = len(taken) & ~1
            del buf[:n]
            self._tail()
            if n:
                events.extend_times(taken[0:n:2], taken[1:n:2], self.prev_end)
                self.prev_end = taken[n - 1]
        else:
            return self._drain_lists()
        return self._bound()

    def _tail(self) -> None:
        buf = self.buf
        # An odd length left means the loop is inside next(): buf[0] is when it began.
        # In a loader worker it means a batch is being made, which is most of a worker's
        # time and no loop's wait: taken for a blocked loop, it sent each worker's batches
        # every BLOCKED_REPORT_S instead of every WORKER_FLUSH_S (issue 15: 64 of the 80
        # messages a second at 8 ranks x 8 workers, where 32 were meant).
        tail = buf[:1] if len(buf) & 1 and self.role != "worker" else None
        self.blocked_since = tail[0] if tail and not self.finished() else None

    def _bound(self) -> int:
        events = self.pending
        excess = len(events) - MAX_PENDING
        if excess > 0:
            events.drop_first(excess)
            return excess
        return 0

    def _drain_lists(self) -> int:
        """``drain`` for a stream whose waits are split (transfer.py lines the polls up
        with the batches' pairs, as lists): one Python int a value and column."""
        buf = self.buf
        # `del buf[:n]` is one atomic list operation under the GIL.
        n = len(buf) & ~1
        pairs = buf[:n] if self.polls is not None else None  # the split lines them up
        starts, ends = buf[0:n:2], buf[1:n:2]
        del buf[:n]
        self._tail()
        events = self.pending
        if n:
            # Column by column in C (map over lists), a Python int a value and column.
            waits = list(map(sub, ends, starts))
            prev = self.prev_end
            # The first batch of an iterator has no predecessor: its interval is its wait,
            # so wait <= interval holds for every event and the SLI stays within [0, 1].
            first = prev if prev is not None else starts[0]
            intervals = list(map(sub, ends, chain((first,), ends)))
            ready = None
            if self.polls is not None:
                try:
                    ready = transfer.ready_waits(pairs or [], waits, self.polls, self.nested)
                except Exception:  # unknown: counted as waiting, never as transfer
                    ready = None
            # the intervals telescope: their sum is the last end less the first's start
            events.extend(ends, waits, intervals, ready, ends[-1] - first)
            self.prev_end = ends[-1]
        elif self.polls is not None:
            transfer.trim(self.polls)
        return self._bound()


def moved(stream: Stream) -> bool:
    """Whether a worker's batches since its last report took MOVED times longer (or
    shorter) on average than the batches of that report."""
    sent, pending = stream.sent_load, stream.pending
    if not sent or len(pending) < MOVED_MIN_BATCHES:
        return False
    mean = pending.wait_sum / len(pending)
    return mean > MOVED * sent or mean * MOVED < sent


def wait_share(pending: wire.Columns, n: int | None = None) -> float | None:
    """The share of the first ``n`` pending batches' time spent waiting in next()."""
    n = len(pending) if n is None else n
    if not n:
        return None
    waits, total = pending.sums(n)  # the running sums when all of them (wire.py)
    return waits / total if total > 0 else None


def share_moved(stream: Stream) -> bool:
    """Whether a trainer's batches since its last report waited a share of their time
    that moved from that report's (SHARE_MOVED_ABS, SHARE_MOVED_REL)."""
    sent = stream.sent_share
    if sent is None:
        return True
    share = wait_share(stream.pending)
    if share is None:
        return False
    return abs(share - sent) > max(SHARE_MOVED_ABS, SHARE_MOVED_REL * sent)
