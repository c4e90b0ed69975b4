"""Validation of hook messages. Every datagram is untrusted input from any local process.

``parse(data)`` returns a normalised message dict or raises ``Reject(reason)``; the reason
is a short fixed string used as a label on the agent's reject counter, so its cardinality
is bounded by this module.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from ..hook import wire

MAX_LABEL_LEN = 128
MAX_RANK = 1 << 20
MAX_PIDS = 256
MAX_NS = 1 << 62  # ~146 years of nanoseconds: anything larger is garbage
# Prometheus label values may be any UTF-8; we still refuse control characters and
# absurd lengths so one bad sender cannot poison dashboards or blow up memory.
_LABEL_RE = re.compile(r"^[^\x00-\x1f\x7f]*$")
ROLES = ("main", "worker")
LOADER_INT_FIELDS = ("num_workers", "prefetch_factor", "batch_size")
LOADER_BOOL_FIELDS = ("pin_memory", "persistent_workers")


class Reject(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def _int(value: Any, lo: int, hi: int, what: str) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise Reject("bad_schema", "%s must be an integer in [%d, %d]" % (what, lo, hi))
    return value


def _label(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise Reject("bad_schema", "%s must be a string" % what)
    if len(value) > MAX_LABEL_LEN or not _LABEL_RE.match(value):
        raise Reject("bad_label", "%s is too long or holds control characters" % what)
    return value


def _identity(raw: Any) -> Dict[str, Any]:
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "id must be an object")
    job = _label(raw.get("job"), "id.job")
    if not job:
        raise Reject("bad_label", "id.job is empty")
    return {
        "job": job,
        "rank": _int(raw.get("rank"), 0, MAX_RANK, "id.rank"),
        "local_rank": _int(raw.get("local_rank", 0), 0, MAX_RANK, "id.local_rank"),
        "world_size": _int(raw.get("world_size", 1), 1, MAX_RANK + 1, "id.world_size"),
        "pod": _label(raw.get("pod", ""), "id.pod"),
        "namespace": _label(raw.get("namespace", ""), "id.namespace"),
        "node": _label(raw.get("node", ""), "id.node"),
    }


def _events(raw: Any) -> List[Tuple[int, int, int]]:
    if not isinstance(raw, list) or len(raw) > wire.MAX_EVENTS_PER_MESSAGE:
        raise Reject("bad_schema", "events must be a list of at most %d" % wire.MAX_EVENTS_PER_MESSAGE)
    out = []
    for ev in raw:
        if not isinstance(ev, list) or len(ev) != 3:
            raise Reject("bad_schema", "each event is [t_end_ns, wait_ns, interval_ns]")
        end, wait, interval = ev
        for v in ev:
            if type(v) is not int or not 0 <= v <= MAX_NS:
                raise Reject("bad_schema", "event fields must be non-negative integers")
        if wait > interval:
            raise Reject("bad_schema", "an event's wait exceeds its interval")
        out.append((end, wait, interval))
    return out


def _loader(raw: Any) -> Optional[Dict[str, Any]]:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "loader must be an object")
    out: Dict[str, Any] = {}
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
    out["worker_pids"] = [_int(p, 1, 1 << 31, "loader.worker_pids[]") for p in pids]
    return out


def parse(data: bytes, max_bytes: int = wire.MAX_MESSAGE_BYTES) -> Dict[str, Any]:
    """Bytes of one datagram → normalised message dict, or Reject."""
    if len(data) > max_bytes:
        raise Reject("oversize", "message of %d bytes exceeds %d" % (len(data), max_bytes))
    try:
        raw = json.loads(data, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise Reject("bad_json", str(e)[:80])
    if not isinstance(raw, dict):
        raise Reject("bad_schema", "message must be an object")
    if raw.get("v") != wire.VERSION:
        raise Reject("bad_version", "unsupported version %r" % (raw.get("v"),))
    if raw.get("kind") != "report":
        raise Reject("bad_schema", "unknown kind")
    role = raw.get("role", "main")
    if role not in ROLES:
        raise Reject("bad_schema", "role must be one of %s" % (ROLES,))
    msg = {
        "id": _identity(raw.get("id")),
        "pid": _int(raw.get("pid"), 1, 1 << 31, "pid"),
        "role": role,
        "mono_ns": _int(raw.get("mono_ns", 0), 0, MAX_NS, "mono_ns"),
        "wall_ns": _int(raw.get("wall_ns", 0), 0, MAX_NS, "wall_ns"),
        "dropped_total": _int(raw.get("dropped_total", 0), 0, MAX_NS, "dropped_total"),
        "events": _events(raw.get("events", [])),
        "loader": _loader(raw.get("loader")),
        "blocked_since_ns": _blocked(raw),
        "raw": raw,  # other parts (worker samples, GPU device) validate their own keys
    }
    return msg


def _blocked(raw: Dict[str, Any]) -> Optional[int]:
    """Start of a next() call still in progress, on the sender's clock (<= mono_ns)."""
    value = raw.get("blocked_since_ns")
    if value is None:
        return None
    value = _int(value, 0, MAX_NS, "blocked_since_ns")
    if value > raw.get("mono_ns", 0):
        raise Reject("bad_schema", "blocked_since_ns is later than mono_ns")
    return value


def _no_constants(name: str) -> Any:
    # json accepts NaN/Infinity by default; they are not valid measurements.
    raise ValueError("non-finite number %s" % name)


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
