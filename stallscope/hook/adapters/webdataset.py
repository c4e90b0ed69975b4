"""WebDataset: every shard it opens becomes a TimedFile, so opening the shard and the
reads done while its samples are iterated count as one shard read (tier: the URL's
scheme, or the mount for paths). Two ways in, both patched:

- ``WebDataset(urls)`` (webdataset >= 0.2.86: compat.py) opens shards through the
  openers in ``webdataset.cache``: ``StreamingOpen`` (plain open for paths, gopen for
  URLs) and, with ``cache_dir``, ``FileCache``, whose lookups we count as cache hits
  (already in cache_dir) and misses (downloaded; the download is part of that read).
- pipelines built from ``tarfile_to_samples()`` open URLs with ``gopen.gopen``.
"""
from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns

from .. import files, shards, tiers

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

# webdataset has no type information: its modules and classes are Any here.

CACHE_TIER = "wds-cache"
_inside = threading.local()  # set while an opener works: its download is part of its read


def _timed(stream: Any, url: str, open_ns: int) -> Any:
    if type(stream) is files.TimedFile:
        return stream
    return files.TimedFile(stream, url, tiers.bounded(tiers.of_url(url)), open_ns)


def _patch_gopen(module: Any) -> None:
    original = module.gopen

    def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        start = perf_counter_ns()
        stream = original(url, mode, bufsize, **kw)
        if mode != "rb" or getattr(_inside, "opener", False):
            return stream
        try:
            return _timed(stream, url, perf_counter_ns() - start)
        except Exception:
            return stream

    gopen._stallscope = True  # type: ignore[attr-defined]
    gopen.__wrapped__ = original  # type: ignore[attr-defined]
    module.gopen = gopen
    package: Any = sys.modules.get("webdataset")  # a module, whose attributes mypy would not know
    if package is not None and getattr(package, "gopen", None) is original:
        package.gopen = gopen


def _patch_opener(cls: Any) -> None:
    original = cls.__call__

    def __call__(self: Any, urls: Any) -> Iterator[Any]:
        it = original(self, urls)
        while True:
            start = perf_counter_ns()  # only the opener's own work: open, or download
            _inside.opener = True
            try:
                source = next(it)
            except StopIteration:
                return
            finally:
                _inside.opener = False
            try:
                if isinstance(source, dict) and source.get("stream") is not None:
                    source["stream"] = _timed(source["stream"], source.get("url", ""),
                                              perf_counter_ns() - start)
            except Exception:
                pass
            yield source

    cls.__call__ = __call__


def _patch_file_cache(cls: Any, cache: Any) -> None:
    original = cls.get_file

    def get_file(self: Any, url: str) -> Any:
        hit = None
        try:
            if not cache.islocal(url):
                hit = os.path.exists(os.path.join(self.cache_dir, self.url_to_name(url)))
        except Exception:
            pass
        dest = original(self, url)
        if hit is not None:
            shards.cache_lookup(CACHE_TIER, hit)
        return dest

    cls.get_file = get_file


def install() -> None:
    module = sys.modules["webdataset.gopen"]
    if getattr(module.gopen, "_stallscope", False):
        return
    _patch_gopen(module)
    cache = sys.modules.get("webdataset.cache")
    if cache is not None:
        for name in ("StreamingOpen", "FileCache"):
            if hasattr(cache, name):
                _patch_opener(getattr(cache, name))
        if hasattr(cache, "FileCache") and hasattr(cache, "islocal"):
            _patch_file_cache(cache.FileCache, cache)
