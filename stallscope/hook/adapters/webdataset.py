"""WebDataset: every shard it opens becomes a TimedFile, so opening the shard and the
reads done while its samples are iterated count as one shard read (tier: the URL's
scheme, or the mount for paths). Two ways in, both patched:

- ``WebDataset(urls)`` (webdataset >= 0.2.86: compat.py) opens shards through the
  openers in ``webdataset.cache``: ``StreamingOpen`` (plain open for paths, gopen for
  URLs) and, with ``cache_dir``, ``FileCache``, whose lookups we count as cache hits
  (already in cache_dir) and misses (downloaded; the download is part of that read).
- pipelines built from ``tarfile_to_samples()`` open URLs with ``gopen.gopen``.
"""
import os
import sys
import threading
from time import perf_counter_ns

from .. import files, shards, tiers

CACHE_TIER = "wds-cache"
_inside = threading.local()  # set while an opener works: its download is part of its read


def _timed(stream, url, open_ns):
    if type(stream) is files.TimedFile:
        return stream
    return files.TimedFile(stream, url, tiers.bounded(tiers.of_url(url)), open_ns)


def _patch_gopen(module):
    original = module.gopen

    def gopen(url, mode="rb", bufsize=8192, **kw):
        start = perf_counter_ns()
        stream = original(url, mode, bufsize, **kw)
        if mode != "rb" or getattr(_inside, "opener", False):
            return stream
        try:
            return _timed(stream, url, perf_counter_ns() - start)
        except Exception:
            return stream

    gopen._stallscope = True
    gopen.__wrapped__ = original
    module.gopen = gopen
    package = sys.modules.get("webdataset")
    if package is not None and getattr(package, "gopen", None) is original:
        package.gopen = gopen


def _patch_opener(cls):
    original = cls.__call__

    def __call__(self, urls):
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


def _patch_file_cache(cls, cache):
    original = cls.get_file

    def get_file(self, url):
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


def install():
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
