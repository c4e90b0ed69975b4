"""What the loader raised, as the training loop saw it (issue 32, item 4): the
exception's type and a bounded, sanitised message, sent once per iterator with the
rank's next report, and the bytes of the iterator's first batch, which size what
/dev/shm must hold (workers x prefetch_factor batches in flight).

torch 2.13 reserves each shared-memory segment up front (posix_fallocate), so a full
/dev/shm no longer ends in a worker's ``Bus error``: the worker raises ``RuntimeError:
unable to allocate shared memory(shm) ... No space left on device (28)``, the loader
re-raises it in the training process ("Caught RuntimeError in DataLoader worker process
0") and training stops with no worker dead and no signal counted. Only the exception
says so. The same exception propagates unchanged (loop.py); nothing here raises.

The message comes from the pod itself but is still input to the node's agent: it keeps
the first line (what was caught) and the last (the worker's own error), never the
traceback between them (file paths), drops control characters and is bounded.
"""
from __future__ import annotations

from time import perf_counter_ns

from . import channel

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

MAX_TYPE_CHARS = 100
MAX_LINE_CHARS = 200     # each of the first and the last line
MAX_MESSAGE_CHARS = 2 * MAX_LINE_CHARS + 3
MAX_WALK = 10_000        # objects looked at to size one batch


def clean(text: str, limit: int) -> str:
    """``text`` with control characters dropped (tabs become spaces), at most ``limit``."""
    out = "".join(" " if c == "\t" else c for c in text if c == "\t" or c.isprintable())
    return out.strip()[:limit]


def message(exc: BaseException) -> str:
    """The first and the last non-empty line of the exception's text, cleaned."""
    try:
        lines = [line for line in str(exc).splitlines() if line.strip()]
    except Exception:  # a __str__ that raises
        return ""
    if not lines:
        return ""
    first = clean(lines[0], MAX_LINE_CHARS)
    if len(lines) == 1:
        return first
    return "%s | %s" % (first, clean(lines[-1], MAX_LINE_CHARS))


def describe(exc: BaseException) -> dict[str, object]:
    return {"type": clean(type(exc).__name__, MAX_TYPE_CHARS), "message": message(exc),
            "at_ns": perf_counter_ns()}


def note(exc: BaseException, stream: channel.Stream | None) -> None:
    """The loader raised ``exc`` out of next(): report it with the stream's next report
    (at once, not a flush interval later), once per iterator. Never raises."""
    try:
        if not isinstance(exc, Exception) or stream is None or stream.loader is None:
            return  # KeyboardInterrupt, SystemExit: the user's, not the loader's
        if "error" in stream.loader:
            return
        stream.loader = dict(stream.loader, error=describe(exc))
        stream.last_sent = 0.0
        channel.get().wake.set()
    except Exception:
        pass


def batch_bytes(batch: Any) -> int | None:
    """Bytes of the tensors and arrays in ``batch`` (nested lists, tuples, dicts), or
    None when it holds none; at most MAX_WALK objects looked at."""
    total, found, todo, seen = 0, False, [batch], 0
    while todo and seen < MAX_WALK:
        obj = todo.pop()
        seen += 1
        if isinstance(obj, (str, bytes, bytearray, int, float, bool)) or obj is None:
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
            continue
        if isinstance(obj, (list, tuple)):
            todo.extend(obj)
            continue
        n = getattr(obj, "nbytes", None)  # torch.Tensor, numpy.ndarray
        if isinstance(n, int) and n >= 0:
            total += n
            found = True
    return total if found else None


def note_batch(batch: Any, stream: channel.Stream | None) -> None:
    """The size of an iterator's first batch, with its next report. Never raises."""
    try:
        if stream is None or stream.loader is None or "batch_bytes" in stream.loader:
            return
        n = batch_bytes(batch)
        if n is not None:
            stream.loader = dict(stream.loader, batch_bytes=n)
    except Exception:
        pass


def note_error(exc: BaseException, stream: channel.Stream | None, at_ns: int) -> None:
    """loop.py's call: ``note`` with the time the loop saw the error. Never raises."""
    try:
        if not isinstance(exc, Exception) or stream is None or stream.loader is None \
                or "error" in stream.loader:
            return
        stream.loader = dict(stream.loader, error=dict(describe(exc), at_ns=at_ns))
        stream.last_sent = 0.0
        channel.get().wake.set()
    except Exception:
        pass


def note_batch_bytes(batch: Any, stream: channel.Stream | None) -> None:
    """loop.py's call: ``note_batch``."""
    note_batch(batch, stream)
