"""Shard reads and cache lookups, for any loader: ``stallscope.shard_read`` and
``stallscope.cache_lookup``.

    with stallscope.shard_read(url, tier="s3") as r:
        data = fetch(url)
        r.bytes = len(data)

    @stallscope.shard_read(tier="fuse")      # shard = first argument, bytes = len(result)
    def load(path): ...

    stallscope.cache_lookup("page", hit=True)

    stallscope.storage_request("s3", status=503, retry=True)   # an object store's answer

Each read costs one tuple append; lookups one counter increment. The channel's flush
thread drains both a few times a second and sends them with the process's rank
identity (in a loader worker, the identity its trainer handed over). Shard IDs travel
only for the slowest read per tier and flush, as evidence, never as a label.

A storage request's outcome (issue 31, item 3: an object store that answers 503 "slow
down" idles the fleet with no error in the loop, since clients retry) is counted per
tier by class, as the cache lookups are: ``ok`` (2xx, 3xx), ``slow_down`` (429, 503),
``server_error`` (other 5xx), ``client_error`` (4xx), ``timeout`` (no answer), and
``retries`` (requests that repeat a failed one).

Message payload (see wire.py): ``{"io": {"tiers": [name, ...], "reads": [[t_end_ns,
dur_ns, bytes, tier_index], ...], "cache": [[tier_index, hits, misses], ...],
"requests": [[tier_index, ok, slow_down, server_error, client_error, timeout, retries],
...], "slowest": [[tier_index, dur_ns, shard], ...]}}``.
"""
from __future__ import annotations

import functools
import os
from time import perf_counter_ns

from . import channel, process, tiers

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType
    from typing import Any, Literal, TypeVar

    from .channel import Extra

    _F = TypeVar("_F", bound=Callable[..., Any])

MAX_READS_PER_MESSAGE = 1000
MAX_READS_PER_FLUSH = 4000  # ~16k reads/s per process; beyond that reads are counted as dropped
SHARD_ID_CHARS = 200

# (t_end_ns, dur_ns, nbytes, tier, shard), appended by readers
_reads: list[tuple[int, int, int, str, object]] = []
_cache: dict[str, list[int]] = {}  # tier → [hits, misses], cumulative in this process
_cache_sent: dict[int, list[int]] = {}  # id() of a _cache list → [hits, misses] already sent
OUTCOMES = ("ok", "slow_down", "server_error", "client_error", "timeout", "retries")
_requests: dict[str, list[int]] = {}  # tier → counts in OUTCOMES' order, cumulative
_requests_sent: dict[int, list[int]] = {}  # id() of a _requests list → counts already sent
_registered_pid: int | None = None


def _register() -> None:
    global _registered_pid
    pid = os.getpid()
    if _registered_pid != pid:
        _registered_pid = pid
        channel.get().add_source(_drain)
        if process.get_role() == "worker" and process.role == "main":
            process.flush_at_exit()  # a worker of an unwatched loader: batches.py did not


def _record(shard: object, tier: str, dur_ns: int, nbytes: int, end_ns: int) -> None:
    if _registered_pid is None:
        _register()
    _reads.append((end_ns, dur_ns, nbytes, tier, shard))


def record_shard_read(shard: object, tier: str | None, seconds: float, nbytes: int | None = 0) -> None:
    """Record a shard read timed elsewhere (for adapters). Never raises."""
    try:
        _record(shard, tiers.bounded(tier), int(seconds * 1e9), int(nbytes or 0), perf_counter_ns())
    except Exception:
        pass


def cache_lookup(tier: str, hit: bool) -> None:
    """Count one cache lookup in ``tier`` (e.g. "page", "local-ssd"): a hit or a miss."""
    try:
        counts = _cache.get(tier)
        if counts is None:
            if _registered_pid is None:
                _register()
            counts = _cache.setdefault(tiers.bounded(tier), [0, 0])
            _cache[tier] = counts  # an overflowed name shares the "other" counters
        counts[0 if hit else 1] += 1
    except Exception:
        pass


def outcome(status: int | None, timeout: bool = False) -> int:
    """The index in OUTCOMES of an answer with HTTP ``status`` (None with ``timeout``: no
    answer at all)."""
    if timeout or status is None:
        return 4
    if status in (429, 503):
        return 1
    if status >= 500:
        return 2
    if status >= 400:
        return 3
    return 0


def storage_request(tier: str, status: int | None = None, timeout: bool = False,
                    retry: bool = False) -> None:
    """Count one request to a storage tier (an object store's GET, say): its answer's
    HTTP ``status``, or ``timeout`` when none came; ``retry`` when it repeats a request
    that failed. Never raises."""
    try:
        counts = _requests.get(tier)
        if counts is None:
            if _registered_pid is None:
                _register()
            counts = _requests.setdefault(tiers.bounded(tier), [0] * len(OUTCOMES))
            _requests[tier] = counts  # an overflowed name shares the "other" counters
        counts[outcome(status, timeout)] += 1
        if retry:
            counts[5] += 1
    except Exception:
        pass


class shard_read:
    """Time one shard read: a context manager, or a decorator when given no shard."""

    __slots__ = ("shard", "tier", "bytes", "_start", "_auto")

    def __init__(self, shard: object = None, tier: str | None = None, bytes: int | None = None) -> None:
        self.shard = shard
        self._auto = tier is None  # the tier follows each shard's URL or mount
        if tier is None:
            try:
                tier = tiers.of_url(shard) if isinstance(shard, (str, os.PathLike)) else tiers.OTHER
            except Exception:
                tier = tiers.OTHER
        self.tier = tier
        self.bytes = bytes
        self._start = 0

    def __enter__(self) -> shard_read:
        self._start = perf_counter_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        end = perf_counter_ns()
        if exc_type is None:  # a failed read has no latency to speak of; the error surfaces
            try:
                _record(self.shard, tiers.bounded(self.tier), end - self._start,
                        int(self.bytes or 0), end)
            except Exception:
                pass
        return False

    def __call__(self, fn: _F) -> _F:
        tier, auto, fixed = self.tier, self._auto, self.shard is not None

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            shard = self.shard if fixed else (args[0] if args else None)
            start = perf_counter_ns()
            result = fn(*args, **kwargs)
            end = perf_counter_ns()
            try:
                t = shard_read(shard).tier if auto and not fixed else tier
                n = len(result) if isinstance(result, (bytes, bytearray, memoryview)) else 0
                _record(shard, tiers.bounded(t), end - start, n, end)
            except Exception:
                pass
            return result
        return timed  # type: ignore[return-value]  # functools.wraps: fn's signature


def _shard_id(shard: object) -> str:
    try:
        return str(os.fspath(shard) if isinstance(shard, os.PathLike) else shard)[:SHARD_ID_CHARS]
    except Exception:
        return "?"


def _drain() -> list[Extra]:
    """Called by the channel's flush thread: the messages for what was recorded since."""
    n = len(_reads)
    batch = _reads[:n]
    del _reads[:n]
    ch = channel.get()
    if n > MAX_READS_PER_FLUSH:
        ch.dropped += n - MAX_READS_PER_FLUSH
        batch = batch[-MAX_READS_PER_FLUSH:]
    names: list[str] = []
    index: dict[str, int] = {}
    slowest: dict[int, tuple[int, object]] = {}
    rows: list[list[int]] = []
    for end, dur, nbytes, tier, shard in batch:
        i = index.get(tier)
        if i is None:
            i = index[tier] = len(names)
            names.append(tier)
        rows.append([end, dur, nbytes, i])
        if dur > slowest.get(i, (-1,))[0]:
            slowest[i] = (dur, shard)
    cache: list[list[int]] = []
    for tier, counts in list(_cache.items()):
        sent = _cache_sent.setdefault(id(counts), [0, 0])
        hits, misses = counts[0] - sent[0], counts[1] - sent[1]
        if hits or misses:
            sent[0] += hits
            sent[1] += misses
            name = tiers.bounded(tier)
            i = index.get(name)
            if i is None:
                i = index[name] = len(names)
                names.append(name)
            cache.append([i, hits, misses])
    requests: list[list[int]] = []
    for tier, counts in list(_requests.items()):
        sent = _requests_sent.setdefault(id(counts), [0] * len(OUTCOMES))
        delta = [c - d for c, d in zip(counts, sent)]
        if any(delta):
            sent[:] = [d + x for d, x in zip(sent, delta)]
            name = tiers.bounded(tier)
            i = index.get(name)
            if i is None:
                i = index[name] = len(names)
                names.append(name)
            requests.append([i] + delta)
    if not rows and not cache and not requests:
        return []
    out: list[Extra] = []
    ident, role = process.get_ident(), process.get_role()
    for k in range(0, max(len(rows), 1), MAX_READS_PER_MESSAGE):
        io: dict[str, object] = {"tiers": names, "reads": rows[k:k + MAX_READS_PER_MESSAGE]}
        if k == 0:
            io["cache"] = cache
            if requests:
                io["requests"] = requests
            io["slowest"] = [[i, d, _shard_id(s)] for i, (d, s) in sorted(slowest.items())]
        out.append((ident, role, {"io": io}))
    return out


def _after_fork() -> None:
    # A forked worker must not resend its parent's buffered reads or counts.
    global _registered_pid
    del _reads[:]
    _cache.clear()
    _cache_sent.clear()
    _requests.clear()
    _requests_sent.clear()
    _registered_pid = None


os.register_at_fork(after_in_child=_after_fork)
