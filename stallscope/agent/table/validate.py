"""Validation of hook messages. Every message is untrusted input from any local process.

``parse(data)`` returns the typed report every part reads (``HookReport``, host/report.py,
its loader a ``LoaderSettings``: stallscope/report.py) or raises ``Reject(reason)``; the reason
is a short fixed string used as a label on the agent's reject counter, so its cardinality
is bounded by this module.

What a real hook cannot send is refused here, before it reaches any part: strings that
become label values must be valid UTF-8 and printable (a lone surrogate would make every
later scrape fail to encode); times must lie within the agent's own clock (the hook's
CLOCK_MONOTONIC is the agent's) give or take what delivery can delay, and durations
within what a step can last, so no report can make a part expand a time span into
unbounded work or memory.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from ...hook import errors, wire
from ...host.report import BatchColumns, HookReport, Identity, StepPhases
from ...report import LoaderSettings, ReportedError

MAX_LABEL_LEN = 128
MAX_RANK = 1 << 20
MAX_PIDS = 256
MAX_NS = 1 << 62  # ~146 years of nanoseconds: anything larger is garbage
SEC = 1_000_000_000
# A report is built at most this long before it arrives (a slow agent, a full socket).
MAX_DELAY_NS = 600 * SEC
# ... and a batch it carries ended at most this long before it was sent (the hook
# holds batches while the agent is slow; older ones it drops and counts).
MAX_AGE_NS = 86400 * SEC
MAX_AHEAD_NS = 60 * SEC          # a clock read on another CPU may run slightly ahead
MAX_INTERVAL_NS = 7 * 86400 * SEC  # one batch interval (a hang that ends) at most a week
MAX_WALL_SKEW_NS = 86400 * SEC   # the hook's wall clock is this node's
MAX_COUNT = 1 << 53
ROLES = ("main", "worker")
LOADER_INT_FIELDS = ("num_workers", "prefetch_factor", "batch_size")
LOADER_BOOL_FIELDS = ("pin_memory", "persistent_workers")
MAX_BATCH_BYTES = 1 << 44  # 16 TiB: no batch a worker could hold in /dev/shm is larger


class Reject(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def _int(value: Any, lo: int, hi: int, what: str) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise Reject("bad_schema", "%s must be an integer in [%d, %d]" % (what, lo, hi))
    return value


def printable(value: str) -> bool:
    """Valid UTF-8 (no lone surrogates, which json decodes from \\ud800 or raw ED A0 80)
    and printable: what Prometheus exposition and dashboards can show."""
    if not value.isprintable():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _label(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise Reject("bad_schema", "%s must be a string" % what)
    if len(value) > MAX_LABEL_LEN or not printable(value):
        raise Reject("bad_label", "%s is too long, not UTF-8 or not printable" % what)
    return value


def _identity(raw: Any) -> Identity:
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "id must be an object")
    job = _label(raw.get("job"), "id.job")
    if not job:
        raise Reject("bad_label", "id.job is empty")
    return Identity(
        job=job,
        rank=_int(raw.get("rank"), 0, MAX_RANK, "id.rank"),
        local_rank=_int(raw.get("local_rank", 0), 0, MAX_RANK, "id.local_rank"),
        world_size=_int(raw.get("world_size", 1), 1, MAX_RANK + 1, "id.world_size"),
        pod=_label(raw.get("pod", ""), "id.pod"),
        namespace=_label(raw.get("namespace", ""), "id.namespace"),
        node=_label(raw.get("node", ""), "id.node"),
    )


def _events_v1(raw: Any) -> np.ndarray:
    """Version 1: a JSON list of [t_end_ns, wait_ns, interval_ns]. Returns the (3, n)
    columns."""
    if not isinstance(raw, list) or len(raw) > wire.MAX_EVENTS_PER_MESSAGE:
        raise Reject("bad_schema", "events must be a list of at most %d" % wire.MAX_EVENTS_PER_MESSAGE)
    for ev in raw:
        if not isinstance(ev, list) or len(ev) != 3 or any(type(v) is not int for v in ev):
            raise Reject("bad_schema", "each event is [t_end_ns, wait_ns, interval_ns] of integers")
    try:
        return np.array(raw, np.int64).reshape(-1, 3).T.copy()
    except OverflowError:
        raise Reject("bad_schema", "event fields must be 64-bit integers") from None


def _events_v2(n: Any, cols: Any, block: bytes) -> tuple[np.ndarray, np.ndarray | None]:
    """Version 2: ``n`` events as three native int64 columns after the header, or four
    (``cols``: 4), the fourth the ready wait. Returns (the (3, n) columns, the ready wait
    or None): views of the message's bytes, never transposed (issue 29)."""
    count = _int(n, 0, wire.MAX_EVENTS_PER_MESSAGE, "n")
    width = _int(cols, 3, 4, "cols")
    if len(block) != 8 * width * count:
        raise Reject("bad_schema", "the event block holds %d bytes, not %d x %d" % (
            len(block), 8 * width, count))
    columns = np.frombuffer(block, "=i8").reshape(width, count)
    return columns[:3], (columns[3] if width == 4 else None)


def _check_events(cols: np.ndarray, now_ns: int) -> np.ndarray:
    """Every event at once, on its (3, n) columns: non-negative, wait <= interval, times
    within the clock."""
    if not cols.shape[1]:
        return cols
    # Each column's least and greatest in two reductions: every numpy call costs the
    # ingest a few microseconds whatever its size, and a report holds tens of events.
    lo, hi = cols.min(axis=1).tolist(), cols.max(axis=1).tolist()
    if min(lo) < 0 or max(hi) > MAX_NS:
        raise Reject("bad_schema", "event fields must be non-negative integers")
    if (cols[1] > cols[2]).any():
        raise Reject("bad_schema", "an event's wait exceeds its interval")
    if lo[0] < now_ns - MAX_AGE_NS or hi[0] > now_ns + MAX_AHEAD_NS or hi[2] > MAX_INTERVAL_NS:
        raise Reject("bad_time", "an event's time is not within the agent's clock")
    return cols


def _check_ready(ready: np.ndarray | None, cols: np.ndarray, role: str) -> np.ndarray | None:
    """Each batch's wait for a ready batch: within [0, its wait]; a trainer's only."""
    if ready is None:
        return None
    if role != "main":
        raise Reject("bad_ready_wait", "only a trainer's batch events carry a ready wait")
    if len(ready) and (ready.min() < 0 or (ready > cols[1]).any()):
        raise Reject("bad_ready_wait", "a ready wait must lie within [0, the batch's wait]")
    return ready


def _loader(raw: Any) -> LoaderSettings | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "loader must be an object")
    out: dict[str, Any] = {}
    for field in LOADER_INT_FIELDS:
        v = raw.get(field)
        out[field] = None if v is None else _int(v, 0, 1 << 20, "loader." + field)
    for field in LOADER_BOOL_FIELDS:
        v = raw.get(field)
        if v is not None and type(v) is not bool:
            raise Reject("bad_schema", "loader.%s must be a boolean" % field)
        out[field] = v
    pids = raw.get("worker_pids", [])
    if not isinstance(pids, list) or len(pids) > MAX_PIDS:
        raise Reject("bad_schema", "loader.worker_pids must be a list of at most %d" % MAX_PIDS)
    out["worker_pids"] = tuple(_int(p, 1, 1 << 31, "loader.worker_pids[]") for p in pids)
    # [pid, exit code] of workers that ended badly, as the trainer's waitpid saw them
    exits = raw.get("worker_exits", [])
    if not isinstance(exits, list) or len(exits) > MAX_PIDS or not all(
            isinstance(e, list) and len(e) == 2 for e in exits):
        raise Reject("bad_schema", "loader.worker_exits must be a list of [pid, exit code] pairs")
    out["worker_exits"] = tuple((_int(p, 1, 1 << 31, "loader.worker_exits[][0]"),
                                 _int(c, -128, 255, "loader.worker_exits[][1]")) for p, c in exits)
    if raw.get("batch_bytes") is not None:
        out["batch_bytes"] = _int(raw["batch_bytes"], 1, MAX_BATCH_BYTES, "loader.batch_bytes")
    if raw.get("dataset_shards") is not None:  # an iterable dataset's shards (hook/watch.py)
        out["dataset_shards"] = _int(raw["dataset_shards"], 1, 1 << 20, "loader.dataset_shards")
    if raw.get("error") is not None:
        out["error"] = _loader_error(raw["error"])
    return LoaderSettings(**out)


def _loader_error(raw: Any) -> ReportedError:
    """The loader's own error (hook/errors.py): its type and message are the pod's text,
    shown in the diagnosis and never a label; refused past the hook's own bounds or with
    characters the hook strips (a real hook cannot send them)."""
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "loader.error must be an object")
    out: dict[str, Any] = {}
    for field, limit in (("type", errors.MAX_TYPE_CHARS), ("message", errors.MAX_MESSAGE_CHARS)):
        v = raw.get(field)
        if not isinstance(v, str):
            raise Reject("bad_schema", "loader.error.%s must be a string" % field)
        if len(v) > limit or not printable(v):
            raise Reject("bad_loader_error", "loader.error.%s is too long or not printable" % field)
        out[field] = v
    out["at_ns"] = _int(raw.get("at_ns"), 0, MAX_NS, "loader.error.at_ns")
    return ReportedError(**out)


PHASE_FIELDS = ("forward_ns", "backward_ns", "optimizer_ns", "steps")


def _phases(raw: Any, role: str) -> StepPhases | None:
    """Step phases since the trainer started (hook/phases.py): cumulative ns and steps."""
    if raw is None:
        return None
    if role != "main" or not isinstance(raw, dict):
        raise Reject("bad_schema", "phases must be an object, a trainer's only")
    return StepPhases(**{field: _int(raw.get(field, 0), 0, MAX_COUNT, "phases." + field)
                         for field in PHASE_FIELDS})


def parse(data: bytes, max_bytes: int = wire.MAX_MESSAGE_BYTES,
          now_ns: int | None = None) -> HookReport:
    """Bytes of one message -> the typed report, or Reject. ``now_ns``: the agent's
    CLOCK_MONOTONIC (tests pass one)."""
    now_ns = time.monotonic_ns() if now_ns is None else now_ns
    if not data:
        raise Reject("empty", "a zero-length message")
    if len(data) > max_bytes:
        raise Reject("oversize", "message of %d bytes exceeds %d" % (len(data), max_bytes))
    head, sep, block = data.partition(wire.SEPARATOR)
    try:
        # json.loads(head, parse_constant=...) without building a decoder per message
        raw = _DECODER.decode(head.decode(json.detect_encoding(head), "surrogatepass"))
    except (ValueError, RecursionError) as e:
        raise Reject("bad_json", str(e)[:80]) from None
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "message must be an object")
    version = raw.get("v")
    if version not in wire.VERSIONS or type(version) is not int:
        raise Reject("bad_version", "unsupported version %r" % (version,))
    ready = None
    if version == 1:
        if sep:
            raise Reject("bad_json", "a version 1 message is one JSON object")
        events = _events_v1(raw.get("events", []))
    else:
        events, ready = _events_v2(raw.get("n", 0), raw.get("cols", 3), block)
    if raw.get("kind") != "report":
        raise Reject("bad_schema", "unknown kind")
    role = raw.get("role", "main")
    if role not in ROLES:
        raise Reject("bad_schema", "role must be one of %s" % (ROLES,))
    # in the order the checks have always run: a message with several faults is
    # rejected for the same one
    ident = _identity(raw.get("id"))
    pid = _int(raw.get("pid"), 1, 1 << 31, "pid")
    mono_ns = _clock(raw.get("mono_ns", 0), now_ns)
    wall_ns = _wall(raw.get("wall_ns", 0))
    dropped_total = _int(raw.get("dropped_total", 0), 0, MAX_COUNT, "dropped_total")
    loader = _loader(raw.get("loader"))
    phases = _phases(raw.get("phases"), role)
    cols = _check_events(events, now_ns)
    return HookReport(
        ident=ident, pid=pid, role=role,
        # the columns as they came, the ready wait with them (agent/table/batches.py)
        events=BatchColumns(cols[0], cols[1], cols[2], _check_ready(ready, cols, role)),
        mono_ns=mono_ns, wall_ns=wall_ns, dropped_total=dropped_total, loader=loader,
        blocked_since_ns=_blocked(raw, mono_ns),
        # a delivery of the sender's batch stream (a heartbeat too): every batch it finished
        # before mono_ns came in it or before it; not its shard reads or errors, sent beside
        stream=("n" if version == 2 else "events") in raw,
        phases=phases,
        raw=raw,  # other parts (worker samples, GPU device) validate their own keys
    )


def _clock(raw: Any, now_ns: int) -> int:
    """The hook's CLOCK_MONOTONIC when it built the report (0: not given)."""
    value = _int(raw, 0, MAX_NS, "mono_ns")
    if value and not now_ns - MAX_DELAY_NS <= value <= now_ns + MAX_AHEAD_NS:
        raise Reject("bad_time", "mono_ns is not within the agent's clock")
    return value


def _wall(raw: Any) -> int:
    value = _int(raw, 0, MAX_NS, "wall_ns")
    if value and abs(value - time.time_ns()) > MAX_WALL_SKEW_NS:
        raise Reject("bad_time", "wall_ns is not this node's wall clock")
    return value


def _blocked(raw: dict[str, Any], mono_ns: int) -> int | None:
    """Start of a next() call still in progress, on the sender's clock (<= mono_ns)."""
    value = raw.get("blocked_since_ns")
    if value is None:
        return None
    value = _int(value, 0, MAX_NS, "blocked_since_ns")
    if value > mono_ns:
        raise Reject("bad_schema", "blocked_since_ns is later than mono_ns")
    if mono_ns - value > MAX_INTERVAL_NS:
        raise Reject("bad_time", "blocked_since_ns is further back than a step can last")
    return value


def _no_constants(name: str) -> Any:
    # json accepts NaN/Infinity by default; they are not valid measurements.
    raise ValueError("non-finite number %s" % name)


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DECODER = json.JSONDecoder(parse_constant=_no_constants)
