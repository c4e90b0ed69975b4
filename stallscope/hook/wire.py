"""The hook -> agent wire format (version 2).

One message per unix SOCK_SEQPACKET record, at most MAX_MESSAGE_BYTES: a JSON header,
then, when it carries batch events, a newline and the events as a binary block of three
columns of native int64 (t_end_ns x n, then wait_ns x n, then interval_ns x n; the
header says ``"n": n``), or four with ``"cols": 4``: then ready_wait_ns x n follows, the
part of each wait spent waiting for a worker's batch to be ready (hook/transfer.py).
Both ends run on one node, so native byte order is theirs. The binary block costs the
hook and the agent no per-event Python object (JSON lists of lists did: ~1.8 us a batch
in the hook's flush thread). No pickle: the agent parses input
from every process on the node and must not execute any of it. Version 1 (events as a
JSON list in the header) is still accepted.

    {"v": 2, "kind": "report",
     "id": {"job": str, "rank": int, "local_rank": int, "world_size": int,
            "pod": str, "namespace": str, "node": str},
     "pid": int,                  # the sender's own PID (its namespace; the agent
                                  #   trusts the kernel's SO_PEERCRED over this)
     "role": "main" | "worker",   # trainer process or a DataLoader worker
     "mono_ns": int, "wall_ns": int,   # one clock pair, to map monotonic → wall time
     "dropped_total": int,        # events this process could not deliver, cumulative
     "n": int,                    # batch events in the binary block that follows, one
                                  #   per batch: (t_end_ns, wait_ns, interval_ns); for
                                  #   role=worker, (t_end_ns, load_ns, interval_ns), the
                                  #   time to produce the batch (hook/batches.py); said
                                  #   (0 too: a heartbeat) only in a delivery of the
                                  #   sender's batch stream, which holds every batch it
                                  #   finished before mono_ns not sent before: the agent
                                  #   keeps a worker's mono_ns of these (worker_report_pid)
     "cols": 4,                   # optional, role=main: a fourth column, ready_wait_ns,
                                  #   0 <= ready_wait_ns <= wait_ns; wait - ready_wait is
                                  #   the transfer (receive, unpickle, pin, bookkeeping)
     "blocked_since_ns": int,     # optional: the loop is inside next() since then and the
                                  #   batch has not come (the agent counts the wait so far)
     "io": {...},                 # optional: shard reads, cache lookups (hook/shards.py)
     "loader": {...},             # optional: DataLoader config + worker PIDs
     "cuda": {"index": int, "uuid": "GPU-..."},  # optional: the loop's CUDA device
     "phases": {"forward_ns": int, "backward_ns": int, "optimizer_ns": int, "steps": int},
                                  # optional, role=main: step phases since the process
                                  #   started, from a framework's hooks (hook/phases.py)
     ...}                         # further optional keys for other kinds of samples

The agent answers on the same connection (issue 33): after each pass over what it read,
one record of 8 bytes, ``ACK`` packed, the count of messages it has taken from this
connection so far (accepted or refused: taken out of the socket queue either way). What
the hook sent that no ack covers when the connection ends (the agent killed with
messages in its queue, or restarted) the hook counts as dropped, so no event goes
uncounted; a message taken in the instant before a kill, before its ack, is counted on
both sides. Older hooks never read the acks: the agent's send then finds the buffer full
and drops the ack, which is cumulative.

Timestamps are CLOCK_MONOTONIC nanoseconds (time.perf_counter_ns on Linux), the same
clock for every process on the node, so the agent can line up hook events with its
own samples.
"""
from __future__ import annotations

import json
import struct
from array import array

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

    # One message as sent; a payload is the part a hook component adds to it.
    Message = dict[str, object]

VERSION = 2
VERSIONS = (1, 2)   # what the agent accepts
MAX_MESSAGE_BYTES = 65536
MAX_EVENTS_PER_MESSAGE = 1000   # 32 KB of binary events at most, leaving room for the header
DEFAULT_SOCKET = "/run/stallscope/hook.sock"
SEPARATOR = b"\n"  # never in compact JSON (strings escape it)
ACK = struct.Struct("=Q")  # the agent's acknowledgement: messages taken from this connection


class Columns:
    """Batch events waiting for delivery, as three int64 columns (no object per event),
    and a fourth, the ready wait, for a stream whose waits are split (``ready=True``)."""

    __slots__ = ("ends", "waits", "intervals", "ready", "wait_sum", "interval_sum")

    def __init__(self, ready: bool = False) -> None:
        self.ends = array("q")
        self.waits = array("q")
        self.intervals = array("q")
        self.ready: array[int] | None = array("q") if ready else None
        # Running sums of the waits and intervals held: the flush thread's cadence
        # decisions (stream.py share_moved, moved) read them each tick, which re-summing
        # every pending batch made O(pending) a tick (issue 50). Each batch is added once
        # and taken off once.
        self.wait_sum = 0
        self.interval_sum = 0

    @property
    def cols(self) -> int:
        return 3 if self.ready is None else 4

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int | slice) -> list[int] | list[list[int]]:
        if isinstance(i, slice):
            return list(self)[i]
        row = [self.ends[i], self.waits[i], self.intervals[i]]
        return row if self.ready is None else row + [self.ready[i]]

    def __iter__(self):  # type: ignore[no-untyped-def]
        if self.ready is None:
            return (list(e) for e in zip(self.ends, self.waits, self.intervals))
        return (list(e) for e in zip(self.ends, self.waits, self.intervals, self.ready))

    def __eq__(self, other: object) -> bool:
        return bool(list(self) == list(other))  # type: ignore[call-overload]

    __hash__ = None  # type: ignore[assignment]

    def extend(self, ends: list[int], waits: list[int], intervals: list[int],
               ready: list[int] | None = None, interval_sum: int | None = None) -> None:
        """``interval_sum``: the intervals' sum where the caller knows it (consecutive
        intervals telescope: the last end less the first one's predecessor)."""
        # fromlist, not extend: half the time a batch (extend takes any iterable, item by item)
        self.ends.fromlist(ends)
        self.waits.fromlist(waits)
        self.intervals.fromlist(intervals)
        self.wait_sum += sum(waits)
        self.interval_sum += sum(intervals) if interval_sum is None else interval_sum
        if self.ready is not None:
            # Never without values: unknown, the whole wait counts as waiting for a ready
            # batch (no transfer is claimed that was not measured).
            self.ready.fromlist(ready if ready is not None else waits)

    def extend_times(self, starts: array[int], ends: array[int], prev_end: int | None) -> None:
        """Events from the loop's (start, end) times, as unsigned int64 columns: the waits
        (end - start) and the intervals (end - the end before it, ``prev_end`` for the first,
        or its own start) with no Python int a batch. Each column is read as one big int of
        64-bit fields, subtracted field by field in one big-int subtraction (the bias keeps
        a field's difference within it: no borrow crosses), and written back as bytes.
        A Python int a value and column (map over lists, then fromlist: the way of a split
        stream's, stream.py) was most of the flush thread's work a batch (issue 50)."""
        k = len(ends)
        bias = _bias(k)
        end = int.from_bytes(ends, "little")
        waits = ((end + bias - int.from_bytes(starts, "little")) ^ bias).to_bytes(8 * k, "little")
        first = prev_end if prev_end is not None else starts[0]
        last = ends[-1]
        # the ends shifted up a field, ``first`` below them; the top field cancels the last
        shifted = ((end << 64) | first) - (last << (64 * k))
        intervals = ((end + bias - shifted) ^ bias).to_bytes(8 * k, "little")
        n = len(self.waits)
        self.ends.frombytes(memoryview(ends).cast("B"))
        self.waits.frombytes(waits)
        self.intervals.frombytes(intervals)
        if self.ready is not None:
            self.ready.frombytes(waits)
        self.wait_sum += sum(self.waits[n:])  # ~10 ns a batch: less than any big-int way
        self.interval_sum += last - first  # the intervals telescope

    def sums(self, n: int, at: int = 0) -> tuple[int, int]:
        """(waits, intervals) summed over ``n`` events from the ``at``-th: the running
        sums when that is all of them."""
        if at == 0 and n >= len(self.ends):
            return self.wait_sum, self.interval_sum
        return sum(self.waits[at:at + n]), sum(self.intervals[at:at + n])

    def drop_first(self, n: int) -> None:
        if n >= len(self.ends):
            self.wait_sum = self.interval_sum = 0
        elif n > 0:
            waits, intervals = self.sums(n)
            self.wait_sum -= waits
            self.interval_sum -= intervals
        else:
            return
        del self.ends[:n]
        del self.waits[:n]
        del self.intervals[:n]
        if self.ready is not None:
            del self.ready[:n]

    def block(self, n: int, at: int = 0) -> bytes:
        """``n`` events from the ``at``-th as the wire's binary block."""
        end = at + n
        data = self.ends[at:end].tobytes() + self.waits[at:end].tobytes() + \
            self.intervals[at:end].tobytes()
        return data if self.ready is None else data + self.ready[at:end].tobytes()


# 2**63 in every 64-bit field (little-endian): added before a subtraction of two columns
# read as big ints, each field's difference d lands in [0, 2**64) as d + 2**63 (for
# |d| < 2**63), so no borrow crosses into the next field; xor-ed after it, each field
# reads as d in int64. Made when first needed and kept, grown by doubling, up to
# BIAS_KEPT fields (a second of a loop at 64,000 batches/s: 512 KiB); cut to a column's
# by a shift (the pattern repeats); made anew for a longer column.
_BIAS_FIELD = bytes(7) + b"\x80"
BIAS_KEPT = 65536
_bias_kept = 0


def _bias(fields: int) -> int:
    global _bias_kept
    if fields > BIAS_KEPT:
        return int.from_bytes(_BIAS_FIELD * fields, "little")
    bias = _bias_kept
    have = bias.bit_length() // 64  # the top field's top bit is set
    if have < fields:
        have = min(BIAS_KEPT, max(fields, 2 * have, 256))
        bias = _bias_kept = int.from_bytes(_BIAS_FIELD * have, "little")
    return bias >> (64 * (have - fields))


def encode(message: Mapping[str, object], events: bytes = b"") -> bytes:
    head = json.dumps(message, separators=(",", ":")).encode()
    return head + SEPARATOR + events if events else head
