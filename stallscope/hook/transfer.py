"""The data-wait split in two: waiting for a worker's batch to be ready, and the rest.

A multi-process DataLoader iterator (``torch.utils.data.dataloader.
_MultiProcessingDataLoaderIter``) gets every batch from ``self._data_queue.get(timeout)``
(``_try_get_data``). Workers put their batches, pickled, on ``_worker_result_queue``, a
``multiprocessing.Queue``, whose ``get`` first waits on ``self._poll(timeout)`` (an
*instance* attribute, the reader ``Connection``'s ``poll``) until a batch is there, then
receives its bytes and unpickles it: for every tensor of the batch the training process
takes over a shared-memory file descriptor from the worker, one connection to the
worker's resource sharer each. We wrap that instance's ``_poll`` to time it:

- ``pin_memory=False``: the training loop's own thread polls (``_data_queue`` *is*
  ``_worker_result_queue``). Per batch, the time in ``poll`` is the wait for a worker's
  batch to be ready (``ready_wait``); the rest of ``next()`` (receive, unpickle, the
  loader's bookkeeping: ``_process_data``, ``_try_put_index``, a batch that arrived out
  of order) is the *transfer*: a per-batch cost that more workers, more CPU quota or
  faster storage will not remove. Every poll lies inside one ``next()`` call (nested).
- ``pin_memory=True``: ``_data_queue`` is a ``queue.Queue`` fed by the pin-memory thread,
  which polls ``_worker_result_queue``, receives, unpickles and copies each batch into
  pinned memory. The loop then waits on that ``queue.Queue`` for a ready *pinned* batch,
  and its wait in ``next()`` covers both the pin thread waiting for the workers and the
  pin thread busy transferring an earlier batch. So the polls are the pin thread's, and a
  batch's ready wait is the part of the loop's wait during which the pin thread was
  polling (an overlap of intervals, not nested); the part during which it was receiving,
  unpickling or pinning is transfer. The loop's own ``queue.Queue.get`` is a deque pop:
  what pinning costs it is the pin thread not keeping up.

The loop pays only when it polls itself (``pin_memory=False``): a wrapper call, two
``perf_counter_ns`` and two list appends per poll (``benchmarks/bench_hook.py``). The
flush thread does the rest (``ready_waits``), column by column in C.

Anything unexpected (another torch, another iterator, a queue without ``_poll``) leaves
the loader untouched: no split, and batch events go out without the ready-wait column.
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, repeat
from operator import add, gt, sub
from time import perf_counter_ns

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Polls kept for batches not drained yet; past this (a loader whose iterator is kept but
# not iterated while its pin thread keeps polling) the oldest go.
MAX_POLLS = 8192


def _timed_poll(poll: Callable[..., bool], buf: list[int]) -> Callable[..., bool]:
    append = buf.append

    def timed_poll(timeout: float = 0.0, _poll: Callable[..., bool] = poll,
                   _now: Callable[[], int] = perf_counter_ns,
                   _append: Callable[[int], None] = append) -> bool:
        start = _now()
        ready = _poll(timeout)
        # Both after the poll: a poll that raises (a closed queue) leaves nothing behind,
        # and the flush takes even counts, so a pair is never split.
        _append(start)
        _append(_now())
        return ready

    timed_poll._stallscope_polls = buf  # type: ignore[attr-defined]
    return timed_poll


def attach(it: Any) -> tuple[list[int], bool] | None:
    """Time the polls of ``it``'s worker result queue; never raises. Returns the buffer
    they go to and whether they are nested in the loop's next() calls, or None when
    ``it`` is not a multi-process DataLoader iterator as we know it.

    An iterator of persistent workers is reused every epoch: the wrapper installed for
    the first epoch stays, and the new epoch's stream takes over its poll buffer."""
    try:
        q = getattr(it, "_worker_result_queue", None)
        if q is None or not hasattr(it, "_data_queue"):
            return None
        poll = q.__dict__.get("_poll")
        if not callable(poll):
            return None
        buf = getattr(poll, "_stallscope_polls", None)
        if buf is None:
            buf = []
            q._poll = _timed_poll(poll, buf)
        nested = it._data_queue is q  # no pin-memory thread: the loop polls itself
        return buf, nested
    except Exception:
        return None


def ready_waits(pairs: list[int], waits: list[int], buf: list[int], nested: bool) -> list[int]:
    """Per batch ``[start, end]`` of the loop in ``next()`` (``pairs``: flat ``[start,
    end, ...]``), the time (ns) within it that the polls in ``buf`` (flat ``[start, end,
    ...]``, one thread's, in order) cover, in ``[0, wait]``. Consumes the polls that ended
    by the last batch's end; the others may still belong to a batch not drained yet.

    Column by column in C (map, bisect, accumulate): no Python bytecode per batch."""
    m = len(buf) & ~1
    if not m:
        return [0] * len(waits)
    flat = buf[:m]
    p, q = flat[0::2], flat[1::2]
    durations = list(map(sub, q, p))
    if nested:
        # Each poll lies inside one next() call, so the polls of a batch are those begun
        # after the previous batch ended: the polls' running total at each batch's end
        # (one bisect a batch), and the difference. (A poll between two next() calls, which
        # torch does not make, would count for the next batch, at most its wait: below.)
        cum = list(accumulate(durations, initial=0))  # cum[k]: polls 0..k-1 together
        at = list(map(cum.__getitem__, map(bisect_right, repeat(p), pairs[1::2])))
        at.insert(0, cum[bisect_right(p, pairs[0])])
        ready = list(map(sub, at[1:], at[:-1]))
    else:
        # The polls cross the batches' edges (another thread's): the poll time before
        # each edge, the last poll begun before it cut there. A sentinel poll of length 0
        # before everything: every edge has one at or before it.
        p.insert(0, -1)
        q.insert(0, -1)
        cum = list(accumulate(durations, initial=0))
        cum.insert(0, 0)                                # cum[k]: polls 0..k-1 (sentinel 0)
        last = list(map(sub, map(bisect_right, repeat(p), pairs), repeat(1)))
        at = list(map(add, map(cum.__getitem__, last),
                      map(sub, map(min, pairs, map(q.__getitem__, last)), map(p.__getitem__, last))))
        ready = list(map(sub, at[1::2], at[0::2]))
    if min(ready) < 0:
        # Not one thread's polls one after another (no torch we know): drop them and
        # claim no transfer, rather than send what the agent must refuse.
        del buf[:m]
        return list(waits)
    if any(map(gt, ready, waits)):  # a poll outside next() in nested mode: never above the wait
        ready = list(map(min, ready, waits))
    done = bisect_right(q, pairs[-1]) - (0 if nested else 1)  # polls ended by the last batch's end
    if done > 0:
        del buf[:2 * done]
    trim(buf)
    return ready


def trim(buf: list[int]) -> None:
    """At most MAX_POLLS polls wait for their batches (a pin-memory thread keeps polling
    while its loop does not iterate); the oldest go first, pairs kept whole."""
    excess = len(buf) - 2 * MAX_POLLS
    if excess > 0:
        del buf[:excess + (excess & 1)]
