"""fsspec: files opened for reading through ``AbstractFileSystem.open`` are returned as
TimedFile objects (one shard read each: open plus reads). The tier is the file system's
protocol (``memory``, ``s3``, ``simplecache`` ...), or the mount's tier for local files.
For the caching file systems (simplecache, filecache, blockcache) each open is also a
cache lookup in the tier named after the protocol: a hit when the whole file is
already in the local cache, a miss otherwise (the open then downloads it, or for
blockcache fetches the missing blocks as they are read).

Only the outermost open is measured: a caching file system downloading a miss through
its target file system's ``open`` is part of that one read, not a second one.
"""
from __future__ import annotations

import sys
import threading
from time import perf_counter_ns

from .. import files, shards, tiers

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

_inside = threading.local()


def _protocol(fs: Any) -> str:
    p = getattr(fs, "protocol", "") or ""
    return p if isinstance(p, str) else (p[0] if p else "")


def _is_cached(fs: Any, path: str, cached: Any) -> bool | None:
    """True/False for a caching file system (whole file in cache?), None otherwise."""
    if cached is None or not isinstance(fs, cached.CachingFileSystem):
        return None
    detail = fs._check_file(fs._strip_protocol(path))
    if isinstance(fs, cached.SimpleCacheFileSystem):
        return bool(detail)
    # CachingFileSystem/WholeFileCacheFileSystem: (detail, fn) or False; blocks is True
    # once every block is local.
    return bool(detail) and detail[0].get("blocks") is True


def install() -> None:
    spec = sys.modules["fsspec.spec"]
    original = spec.AbstractFileSystem.open
    if getattr(original, "_stallscope", False):
        return
    from fsspec.implementations import cached  # part of fsspec itself

    def open(self: Any, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0) or "b" not in mode or "r" not in mode or "+" in mode:
            return original(self, path, mode, *args, **kwargs)
        try:
            proto = _protocol(self)
            tier = tiers.of_path(path) if proto in ("file", "local") else proto
            hit = _is_cached(self, path, cached)
        except Exception:
            tier, hit = tiers.OTHER, None
        _inside.depth = 1
        start = perf_counter_ns()
        try:
            f = original(self, path, mode, *args, **kwargs)
        finally:
            _inside.depth = 0
        open_ns = perf_counter_ns() - start
        if hit is not None:
            shards.cache_lookup(tier, hit)
        try:
            return files.TimedFile(f, path, tiers.bounded(tier), open_ns)
        except Exception:
            return f

    open._stallscope = True  # type: ignore[attr-defined]
    open.__wrapped__ = original  # type: ignore[attr-defined]
    spec.AbstractFileSystem.open = open
