"""The per-batch path of a watched loader: the iterator the training loop drives.

Per batch the loop pays for two ``perf_counter_ns`` calls and two list appends, and with
a multi-process DataLoader without pin_memory as much again around its queue's poll
(the split of the wait into waiting for a ready batch and transfer: transfer.py); all
other work happens on the channel's flush thread (channel.py).
"""
from __future__ import annotations

import itertools
import weakref
from time import perf_counter_ns

from . import channel, errors, exits

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from .identity import Ident


class Loop:
    """What the timing generators of one watched iterator share (not the iterator itself,
    so that the stream's owner, the iterator, is freed by refcount and not by a cycle)."""

    __slots__ = ("next", "inner", "stream", "first", "ended", "unsized")

    def __init__(self, it: Any) -> None:
        self.next: Callable[[], Any] = it.__next__  # looked up once, not per batch
        self.inner = it  # the DataLoader's own iterator, when a wrapper hides it (claim.py)
        self.stream: channel.Stream | None = None
        self.first = False  # the next generator times one call only (claim.py settles then)
        self.ended = False  # the loader raised StopIteration
        self.unsized = True  # the first batch's bytes not measured yet (errors.py)


def timed(loop: Loop, _now: Callable[[], int] = perf_counter_ns) -> Iterator[Any]:
    """The per-batch path: two clock reads and two appends around the loader's next().

    A generator, driven by the C ``chain`` of WatchedIterator: resuming it costs about a
    quarter fewer instructions per batch than a Python ``__next__`` called through the
    iterator slot (benchmarks/bench_hook.py), which is what keeps the loop under 300 ns.
    Nothing else per batch: the call timed alone is ``timed_once``'s (issue 50: the
    test for it was in every batch's path)."""
    stream = loop.stream
    assert stream is not None
    buf = stream.buf
    append = buf.append
    nxt = loop.next
    while True:
        # The start goes in before the loader is asked: a start with no end yet tells the
        # flush thread the loop is blocked in next() right now, so a rank hung on a dead
        # mount shows up as waiting instead of going quiet (channel.py, blocked_since).
        append(_now())
        try:
            item = nxt()
        except StopIteration:
            buf.pop()  # keep (start, end) pairs aligned; the flush never takes an odd
            loop.ended = True  # trailing start, so it is still there
            return
        except BaseException as e:  # the loader's own error, passed through; the chain
            buf.pop()               # then starts a new generator: the iterator stays usable
            exits.note(loop.inner, stream)
            errors.note_error(e, stream, _now())
            raise
        append(_now())
        yield item


def timed_once(loop: Loop, _now: Callable[[], int] = perf_counter_ns) -> Iterator[Any]:
    """One call timed as ``timed`` times each, then the batch's bytes measured when the
    loop asks for the next one: in its step, not its wait."""
    stream = loop.stream
    assert stream is not None
    buf = stream.buf
    buf.append(_now())
    try:
        item = loop.next()
    except StopIteration:
        buf.pop()
        loop.ended = True
        return
    except BaseException as e:
        buf.pop()
        exits.note(loop.inner, stream)
        errors.note_error(e, stream, _now())
        raise
    buf.append(_now())
    yield item
    _measure(loop, item)


def _measure(loop: Loop, item: Any) -> None:
    """The first batch's bytes, once per iterator, off the per-batch path (errors.py)."""
    if loop.unsized:
        loop.unsized = False
        errors.note_batch_bytes(item, loop.stream)


def runs(loop: Loop) -> Iterator[Iterator[Any]]:
    """A fresh timing generator after each one that ended without the loader ending (its
    error propagated, or the first call was timed alone). The first batch is always timed
    alone, so that its bytes are measured (errors.py) and no later batch pays a test."""
    while not loop.ended:
        once = loop.first or loop.unsized
        loop.first = False
        yield timed_once(loop) if once else timed(loop)


class WatchedIterator(itertools.chain):  # type: ignore[type-arg]
    """The loop's iterator: iterated in C (``chain`` over the timing generators); reads of
    other attributes and ``len()`` go to the loader's own iterator."""

    __slots__ = ("_it", "_loop", "_stream", "__weakref__")
    _it: Any  # the loader's own iterator (for a DataLoader: sized, with attributes)
    _loop: Loop
    _stream: channel.Stream

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        if name in WatchedIterator.__slots__:  # not yet set: avoid recursing into _it
            raise AttributeError(name)
        return getattr(self._it, name)


def watched_iterator(it: Any, ident: Ident) -> tuple[WatchedIterator, Loop]:
    loop = Loop(it)
    wrapper = WatchedIterator.from_iterable(runs(loop))
    assert isinstance(wrapper, WatchedIterator)
    wrapper._it = it
    wrapper._loop = loop
    wrapper._stream = loop.stream = channel.Stream(ident, owner=wrapper)
    # A loader error raised outside next() never passes through timed: the workers'
    # exits are read when the iterator goes (the error unwinds the loop that held it).
    weakref.finalize(wrapper, exits_at_end, loop).atexit = False  # type: ignore[misc]
    return wrapper, loop


def exits_at_end(loop: Loop) -> None:
    exits.note(loop.inner, loop.stream)
